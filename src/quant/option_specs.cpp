#include "lockstep/quant/option_specs.h"

#include <type_traits>

#include "lockstep/core/error.h"
#include "lockstep/quant/fsp.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/latent_quantize.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/simvq.h"
#include "lockstep/quant/vq.h"
#include "quant/option_readers.h"

namespace lockstep::quant {
namespace {

// The declaration of every line of Options' .def list (option_fields.h), at its declared default: a
// constructor argument at the CLI's, an optional's key at 0 (unset), a choice as its value's name.
template <typename Options>
std::vector<OptionSpec> declared_options() {
  const Options defaults = Options::declared_defaults();
  std::vector<OptionSpec> specs;
  Options::visit_fields(defaults, [&specs](const char* key, const auto& value, const Limits& limits, const char* help) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (is_required<T>::value || is_key_only<T>::value) {
      specs.push_back(setting_spec(key, value.value, help, limits));
    } else if constexpr (is_optional<T>::value) {
      specs.push_back(setting_spec(key, typename T::value_type{}, help, limits));
    } else if constexpr (std::is_enum_v<T>) {
      specs.push_back(setting_spec(key, choice_name(value), help));
      specs.back().choices = choice_names(value);
    } else {
      specs.push_back(setting_spec(key, value, help, limits));
    }
  });
  return specs;
}

template <typename T>
T read_value(const OptionReader& o, const std::string& key) {
  if constexpr (std::is_same_v<T, bool>) return o.boolean(key);
  if constexpr (std::is_same_v<T, int64_t>) return o.integer(key);
  if constexpr (std::is_same_v<T, double>) return o.real(key);
  if constexpr (std::is_same_v<T, std::string>) return o.string(key);
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return o.int_list(key);
  if constexpr (std::is_same_v<T, std::vector<double>>) return o.float_list(key);
}

// Options read through `o`, every line of its .def list under its own key (an optional's 0 leaves it unset, a
// choice is read by name), but the keys its reader maps by hand (LOCKSTEP_KEY). `owner` names the section.
template <typename Options>
Options read_options(const char* owner, const OptionReader& o) {
  Options options = Options::declared_defaults();
  Options::visit_fields(options, [&o, owner](const char* key, auto&& value, const Limits&, const char*) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (is_required<T>::value) {
      value.value = read_value<std::decay_t<decltype(value.value)>>(o, key);
    } else if constexpr (is_optional<T>::value) {
      const auto v = read_value<typename T::value_type>(o, key);
      value = v == typename T::value_type{} ? T() : T(v);
    } else if constexpr (std::is_enum_v<T>) {
      value = choice_from_name<T>(owner, key, o.string(key));
    } else if constexpr (!is_key_only<T>::value) {
      value = read_value<T>(o, key);
    }
  });
  return options;
}

// A section of Options' declarations, checked by reading them as its quantizer would.
template <typename Options>
OptionSection declared_section(const char* name, Options (*read)(const OptionReader&)) {
  return {name, declared_options<Options>(), [read](const OptionReader& o) { read(o).validate(); }};
}

VqEstimator vq_estimator(const OptionReader& o) {
  const bool directional = o.boolean("directional_reparam");
  const bool rotation = o.boolean("rotation_trick");
  LOCKSTEP_CHECK_ARG(!(directional && rotation),
                     "vq: directional_reparam and rotation_trick are two estimators; set rotation_trick = false");
  if (directional) return VqEstimator::DirectionalReparam;
  return rotation ? VqEstimator::RotationTrick : VqEstimator::StraightThrough;
}

}  // namespace

// Each section's options struct, from its reader.
namespace sections {

OptionReader section_of(const OptionReader& o, const std::string& name) {
  LOCKSTEP_CHECK_ARG(static_cast<bool>(o.section), "this option reader has no section '", name, "'");
  return o.section(name);
}

FsqOptions fsq_options(const OptionReader& o) { return read_options<FsqOptions>("fsq", o); }
LfqOptions lfq_options(const OptionReader& o) { return read_options<LfqOptions>("lfq", o); }
VqOptions vq_options(const OptionReader& o) {
  return read_options<VqOptions>("vq", o).use_cosine_sim(o.boolean("cosine")).estimator(vq_estimator(o));
}
SimVqOptions simvq_options(const OptionReader& o) { return read_options<SimVqOptions>("simvq", o); }
LatentQuantizeOptions latent_options(const OptionReader& o) { return read_options<LatentQuantizeOptions>("latent", o); }
FspOptions fsp_options(const OptionReader& o) { return read_options<FspOptions>("fsp", o); }
ResidualOptions residual_options(const OptionReader& o) { return read_options<ResidualOptions>("residual", o); }

}  // namespace sections

const std::vector<OptionSection>& quantizer_option_sections() {
  using namespace sections;
  // The grouped quantizers' one key has no options struct: their groups take their layers' options.
  static const std::vector<OptionSection> all = {
      declared_section("fsq", fsq_options),
      declared_section("lfq", lfq_options),
      declared_section("vq", vq_options),
      declared_section("simvq", simvq_options),
      declared_section("latent", latent_options),
      declared_section("fsp", fsp_options),
      declared_section("residual", residual_options),
      {"grouped",
       {setting_spec("groups", int64_t{2},
                     "Groups of the grouped-* quantizers: the latent is split into this many equal parts, each "
                     "quantized by its own residual quantizer.",
                     Limits().in_range(1, 64))},
       [](const OptionReader& o) {
         LOCKSTEP_CHECK_ARG(o.integer("groups") >= 1, "grouped: groups = ", o.integer("groups"), " must be >= 1");
       }}};
  return all;
}

}  // namespace lockstep::quant
