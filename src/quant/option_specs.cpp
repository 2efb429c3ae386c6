#include "lockstep/quant/option_specs.h"

#include <algorithm>
#include <memory>
#include <type_traits>

#include "lockstep/core/error.h"
#include "lockstep/quant/fsp.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/latent_quantize.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/registry.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/simvq.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {
namespace {

// Chains limits onto one option, as the configuration's KeySpec does.
struct Spec {
  OptionSpec s;
  Spec& at_least(double lo) { return s.min = lo, s.min_exclusive = false, *this; }
  Spec& greater_than(double lo) { return s.min = lo, s.min_exclusive = true, *this; }
  Spec& at_most(double hi) { return s.max = hi, s.max_exclusive = false, *this; }
  Spec& less_than(double hi) { return s.max = hi, s.max_exclusive = true, *this; }
  Spec& in_range(double lo, double hi) { return at_least(lo).at_most(hi); }
  Spec& length(size_t lo, size_t hi) { return s.min_len = lo, s.max_len = hi, *this; }
  operator OptionSpec() const { return s; }  // NOLINT: a builder
};

Spec option(std::string key, OptionSpec::Type type, decltype(OptionSpec::default_value) value, std::string help) {
  Spec spec;
  spec.s.key = std::move(key);
  spec.s.type = type;
  spec.s.default_value = std::move(value);
  spec.s.help = std::move(help);
  return spec;
}
Spec boolean(std::string key, bool value, std::string help) {
  return option(std::move(key), OptionSpec::Type::Bool, value, std::move(help));
}
Spec integer(std::string key, int64_t value, std::string help) {
  return option(std::move(key), OptionSpec::Type::Int, value, std::move(help));
}
Spec int_list(std::string key, std::vector<int64_t> value, std::string help) {
  return option(std::move(key), OptionSpec::Type::IntList, std::move(value), std::move(help));
}
Spec one_of(std::string key, std::string value, std::vector<std::string> choices, std::string help) {
  Spec spec = option(std::move(key), OptionSpec::Type::String, std::move(value), std::move(help));
  spec.s.choices = std::move(choices);
  return spec;
}

// The option type of a field's C++ type.
template <typename T>
OptionSpec::Type type_of() {
  if constexpr (std::is_same_v<T, bool>) {
    return OptionSpec::Type::Bool;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return OptionSpec::Type::Int;
  } else if constexpr (std::is_same_v<T, double>) {
    return OptionSpec::Type::Float;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return OptionSpec::Type::String;
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return OptionSpec::Type::IntList;
  } else {
    static_assert(std::is_same_v<T, std::vector<double>>, "a field's type is one of OptionSpec's");
    return OptionSpec::Type::FloatList;
  }
}

// The options an options struct declares in its field list (option_fields.h), after the section's
// constructor arguments, in the list's order, with the struct's defaults.
template <typename Options>
void append_fields(OptionSection& section, const Options& defaults) {
  Options::visit_fields(defaults,
                        [&section](const char* key, const auto& value, const FieldLimits& limits, const char* help) {
                          Spec spec = option(key, type_of<std::decay_t<decltype(value)>>(), value, help);
                          spec.s.min = limits.min;
                          spec.s.max = limits.max;
                          spec.s.min_exclusive = limits.min_exclusive;
                          spec.s.max_exclusive = limits.max_exclusive;
                          spec.s.min_len = limits.min_len;
                          spec.s.max_len = limits.max_len;
                          section.options.push_back(spec);
                        });
}

// `specs` placed right after the option `key` of `section`.
void insert_after(OptionSection& section, const std::string& key, const std::vector<OptionSpec>& specs) {
  auto at = std::find_if(section.options.begin(), section.options.end(),
                         [&key](const OptionSpec& o) { return o.key == key; });
  LOCKSTEP_ASSERT(at != section.options.end(), "no option '", key, "' in section ", section.name);
  section.options.insert(at + 1, specs.begin(), specs.end());
}

// What the library takes as constructor arguments has no library default; these are the CLI's.
const std::vector<int64_t> kFsqLevels = {8, 5, 5, 5};
constexpr int64_t kLfqCodebookSize = 1024;
constexpr int64_t kVqDim = 8, kVqCodebookSize = 512;
constexpr int64_t kResidualLayers = 4;

OptionSection fsq_section() {
  OptionSection section{
      "fsq",
      {int_list("levels", kFsqLevels,
                "FSQ levels per latent channel; the codebook size is their product (8*5*5*5 = 1000).")
           .in_range(2, 256)
           .length(1, 16),
       integer("dim", 0,
               "Channels fed to FSQ, projected to len(levels) x num_codebooks and back; 0 means no projection.")
           .in_range(0, 4096)}};
  append_fields(section, FsqOptions(kFsqLevels));
  return section;
}

OptionSection lfq_section() {
  OptionSection section{
      "lfq",
      {integer("codebook_size", kLfqCodebookSize,
               "LFQ codebook size K, a power of two; the latent has log2 K channels, one bit each.")
           .in_range(2, 1 << 24),
       integer("dim", 0,
               "Channels fed to LFQ, projected to num_codebooks x log2 K bits and back; 0 means num_codebooks x "
               "log2 K.")
           .in_range(0, 4096)}};
  append_fields(section, LfqOptions(kLfqCodebookSize));
  return section;
}

OptionSection vq_section() {
  const VqOptions d(kVqDim, kVqCodebookSize);
  OptionSection section{
      "vq",
      {integer("dim", kVqDim, "Channels of each latent token, the length of each code vector.").in_range(1, 4096),
       integer("codebook_size", kVqCodebookSize, "Number of codes K.").in_range(1, 1 << 20)}};
  append_fields(section, d);
  // What VqOptions holds otherwise, each after the key it has always followed.
  insert_after(section, "threshold_ema_dead_code",
               {boolean("cosine", d.use_cosine_sim(), "Cosine similarity: l2-normalise tokens and codes."),
                // The library's rule (the rotation trick when dim > 1), applied to the default dim.
                boolean("rotation_trick", d.estimator() == VqEstimator::RotationTrick,
                        "Rotation-trick gradient estimator; false uses straight-through.")});
  insert_after(section, "layernorm_after_project_in",
               {boolean("directional_reparam", false,
                        "DiVeQ estimator: the token plus its distance to the code along the noised direction to it "
                        "(needs rotation_trick = false and threshold_ema_dead_code > 0; no commitment loss).")});
  insert_after(section, "separate_codebook_per_head",
               {integer("codebook_dim", 0,
                        "Length of each code; projections in and out when heads x codebook_dim != dim; 0 means dim.")
                    .in_range(0, 4096)});
  return section;
}

OptionSection simvq_section() {
  OptionSection section{
      "simvq",
      {integer("dim", kVqDim, "Channels of each latent token, the length of each code the map gives.")
           .in_range(1, 4096),
       integer("codebook_size", kVqCodebookSize, "Number of codes K.").in_range(1, 1 << 20),
       integer("frozen_codebook_dim", 0, "Length of the frozen random codes the linear map reads; 0 means dim.")
           .in_range(0, 4096)}};
  append_fields(section, SimVqOptions(kVqDim, kVqCodebookSize));
  return section;
}

OptionSection latent_section() {
  OptionSection section{
      "latent",
      {int_list("levels", kFsqLevels, "Values per latent channel; the codebook size is their product (8*5*5*5 = 1000).")
           .in_range(2, 256)
           .length(1, 16),
       integer("dim", 0, "Channels fed in, projected to len(levels) x num_codebooks and back; 0 means no projection.")
           .in_range(0, 4096)}};
  append_fields(section, LatentQuantizeOptions(kFsqLevels));
  return section;
}

OptionSection fsp_section() {
  const FspOptions d(kFsqLevels);
  OptionSection section{
      "fsp",
      {int_list("levels", kFsqLevels, "FSP bins per latent channel; the codebook size is their product.")
           .in_range(2, 1 << 22)
           .length(1, 16),
       integer("dim", 0, "Channels fed in, projected to len(levels) and back; 0 means no projection.")
           .in_range(0, 4096)}};
  append_fields(section, d);
  insert_after(
      section, "projection_has_bias",
      {one_of("activation", fsp_activation_name(d.activation()), {"tanh", "sigmoid", "normal", "laplace", "cauchy"},
              "The CDF that maps each channel into [0, 1] before binning.")});
  section.options.push_back(one_of("vector_norm", "var_tanh",
                                   {"none", "var", "kurt", "var_tanh", "var_sigmoid", "var_laplace"},
                                   "The regulariser's preset: which of the batch's mean, variance, skewness and "
                                   "kurtosis per channel are pulled to which targets (loss \"norm\")."));
  return section;
}

OptionSection grouped_section() {
  return {"grouped",
          {integer("groups", 2,
                   "Groups of the grouped-* quantizers: the latent is split into this many equal parts, each "
                   "quantized by its own residual quantizer.")
               .in_range(1, 64)}};
}

OptionSection residual_section() {
  OptionSection section{
      "residual", {integer("num_quantizers", kResidualLayers, "Layers of the residual-* quantizers.").in_range(1, 64)}};
  append_fields(section, ResidualOptions(kResidualLayers));
  insert_after(section, "beam_size",
               {integer("eval_beam_size", 0, "residual-vq: the beam in evaluation; 0 means beam_size.").at_least(0)});
  return section;
}

}  // namespace

const std::vector<OptionSection>& quantizer_option_sections() {
  static const std::vector<OptionSection> sections = {fsq_section(),      lfq_section(),    vq_section(),
                                                      simvq_section(),    latent_section(), fsp_section(),
                                                      residual_section(), grouped_section()};
  return sections;
}

namespace {
// The declaration of "section.key", or nullptr.
const OptionSpec* find_spec(const std::string& section, const std::string& key) {
  for (const auto& s : quantizer_option_sections()) {
    if (s.name != section) continue;
    for (const auto& o : s.options) {
      if (o.key == key) return &o;
    }
  }
  return nullptr;
}

const char* type_name(OptionSpec::Type t) {
  switch (t) {
    case OptionSpec::Type::Bool:
      return "a bool";
    case OptionSpec::Type::Int:
      return "an integer";
    case OptionSpec::Type::Float:
      return "a number";
    case OptionSpec::Type::IntList:
      return "a list of integers";
    case OptionSpec::Type::String:
      return "a string";
    case OptionSpec::Type::FloatList:
      return "a list of numbers";
  }
  return "?";
}

// An override checked against its declaration: its key, its type (an integer is taken for a number)
// and, for a string, its choices. Returns the value as declared; InvalidArgument naming the option.
// The numeric limits stated here are the configuration's (KeySpec); the library's own, which the
// options' validate() applies to whatever reads them, may be wider (FSQ levels up to 2^22).
OptionValue checked_override(const std::string& name, const OptionValue& given) {
  const auto dot = name.find('.');
  const OptionSpec* spec = dot == std::string::npos ? nullptr : find_spec(name.substr(0, dot), name.substr(dot + 1));
  if (spec == nullptr) {
    std::vector<std::string> keys;
    for (const auto& s : quantizer_option_sections()) {
      if (s.name != name.substr(0, dot)) continue;
      for (const auto& o : s.options) keys.push_back(o.key);
    }
    throw InvalidArgument(keys.empty() ? lockstep::detail::concat("unknown quantizer option '", name, "'")
                                       : lockstep::detail::concat("unknown quantizer option '", name,
                                                                  "'; the options of ", name.substr(0, dot), ": ",
                                                                  lockstep::detail::concat_list(keys)));
  }
  OptionValue value = given;
  if (spec->type == OptionSpec::Type::Float && std::holds_alternative<int64_t>(value)) {
    value = static_cast<double>(std::get<int64_t>(value));
  }
  if (spec->type == OptionSpec::Type::FloatList && std::holds_alternative<std::vector<int64_t>>(value)) {
    const auto& ints = std::get<std::vector<int64_t>>(value);  // [1, 2] is a list of numbers too
    value = std::vector<double>(ints.begin(), ints.end());
  }
  const bool type_ok =
      (spec->type == OptionSpec::Type::Bool && std::holds_alternative<bool>(value)) ||
      (spec->type == OptionSpec::Type::Int && std::holds_alternative<int64_t>(value)) ||
      (spec->type == OptionSpec::Type::Float && std::holds_alternative<double>(value)) ||
      (spec->type == OptionSpec::Type::IntList && std::holds_alternative<std::vector<int64_t>>(value)) ||
      (spec->type == OptionSpec::Type::String && std::holds_alternative<std::string>(value)) ||
      (spec->type == OptionSpec::Type::FloatList && std::holds_alternative<std::vector<double>>(value));
  LOCKSTEP_CHECK_ARG(type_ok, "quantizer option '", name, "' must be ", type_name(spec->type));
  if (const auto* text = std::get_if<std::string>(&value)) {
    LOCKSTEP_CHECK_ARG(
        spec->choices.empty() || std::find(spec->choices.begin(), spec->choices.end(), *text) != spec->choices.end(),
        "quantizer option '", name, "' = \"", *text,
        "\" is not one of: ", lockstep::detail::concat_list(spec->choices));
  }
  return value;
}

template <typename T>
T declared(const std::string& section, const std::string& key, const std::map<std::string, OptionValue>& overrides) {
  const std::string name = section + "." + key;
  const OptionSpec* spec = find_spec(section, key);
  LOCKSTEP_CHECK_ARG(spec != nullptr, "no quantizer option '", name, "' is declared");
  const OptionValue* value = &spec->default_value;
  if (auto it = overrides.find(name); it != overrides.end()) value = &it->second;
  LOCKSTEP_CHECK_ARG(std::holds_alternative<T>(*value), "quantizer option '", name, "' is read as another type");
  return std::get<T>(*value);
}
}  // namespace

OptionReader default_option_reader(const std::string& section, std::map<std::string, OptionValue> overrides) {
  // Every override is a declared option of its type: a misspelt key is an error here, as in the
  // configuration, not a value silently left unread.
  for (auto& [name, value] : overrides) value = checked_override(name, value);
  const auto o = std::make_shared<const std::map<std::string, OptionValue>>(std::move(overrides));
  OptionReader r;
  r.integer = [section, o](const std::string& key) { return declared<int64_t>(section, key, *o); };
  r.real = [section, o](const std::string& key) { return declared<double>(section, key, *o); };
  r.boolean = [section, o](const std::string& key) { return declared<bool>(section, key, *o); };
  r.int_list = [section, o](const std::string& key) { return declared<std::vector<int64_t>>(section, key, *o); };
  r.string = [section, o](const std::string& key) { return declared<std::string>(section, key, *o); };
  r.float_list = [section, o](const std::string& key) { return declared<std::vector<double>>(section, key, *o); };
  r.section = [o](const std::string& other) { return default_option_reader(other, *o); };
  return r;
}

}  // namespace lockstep::quant
