#include "lockstep/quant/registry.h"

#include <type_traits>

#include "lockstep/core/error.h"
#include "lockstep/quant/fsp.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/grouped.h"
#include "lockstep/quant/latent_quantize.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/option_check.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/simvq.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {

namespace {

// Every field an options struct declares (option_fields.h), read under its own name as its type.
template <typename Options>
void read_fields(const OptionReader& o, Options& options) {
  Options::visit_fields(options, [&o](const char* key, auto& value, const FieldLimits&, const char*) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, bool>) value = o.boolean(key);
    if constexpr (std::is_same_v<T, int64_t>) value = o.integer(key);
    if constexpr (std::is_same_v<T, double>) value = o.real(key);
    if constexpr (std::is_same_v<T, std::string>) value = o.string(key);
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) value = o.int_list(key);
    if constexpr (std::is_same_v<T, std::vector<double>>) value = o.float_list(key);
  });
}

FsqOptions fsq_options(const OptionReader& o) {
  FsqOptions options(o.int_list("levels"));
  read_fields(o, options);
  if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: levels x codebooks
  return options;
}

LfqOptions lfq_options(const OptionReader& o) {
  LfqOptions options(o.integer("codebook_size"));
  read_fields(o, options);
  if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: codebooks x log2 codebook_size
  return options;
}

VqEstimator vq_estimator(const OptionReader& o) {
  const bool directional = o.boolean("directional_reparam");
  const bool rotation = o.boolean("rotation_trick");
  LOCKSTEP_CHECK_ARG(!(directional && rotation),
                     "vq: directional_reparam and rotation_trick are two estimators; set rotation_trick = false");
  if (directional) return VqEstimator::DirectionalReparam;
  return rotation ? VqEstimator::RotationTrick : VqEstimator::StraightThrough;
}

VqOptions vq_options(const OptionReader& o) {
  VqOptions options(o.integer("dim"), o.integer("codebook_size"));
  read_fields(o, options);
  options.use_cosine_sim(o.boolean("cosine")).estimator(vq_estimator(o));
  if (const int64_t cd = o.integer("codebook_dim"); cd != 0) options.codebook_dim(cd);  // 0: dim
  return options;
}

SimVqOptions simvq_options(const OptionReader& o) {
  SimVqOptions options(o.integer("dim"), o.integer("codebook_size"));
  read_fields(o, options);
  if (const int64_t fd = o.integer("frozen_codebook_dim"); fd != 0) options.frozen_codebook_dim(fd);  // 0: dim
  return options;
}

LatentQuantizeOptions latent_options(const OptionReader& o) {
  LatentQuantizeOptions options(o.int_list("levels"));
  read_fields(o, options);
  if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: levels x codebooks
  return options;
}

FspOptions fsp_options(const OptionReader& o) {
  FspOptions options(o.int_list("levels"));
  read_fields(o, options);
  options.activation(fsp_activation(o.string("activation"))).norm(FspNorm::preset(o.string("vector_norm")));
  if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: len(levels)
  return options;
}

ResidualOptions residual_options(const OptionReader& o) {
  ResidualOptions options(o.integer("num_quantizers"));
  read_fields(o, options);
  options.eval_beam_size(o.integer("eval_beam_size"));
  return options;
}

OptionReader section_of(const OptionReader& o, const std::string& name) {
  LOCKSTEP_CHECK_ARG(static_cast<bool>(o.section), "this option reader has no section '", name, "'");
  return o.section(name);
}

// grouped-residual-<layer>: quantizer.grouped.groups of the registry's residual-<layer>, side by side.
RegistryEntry grouped_entry(const std::string& layer) {
  const std::string name = "grouped-residual-" + layer;
  return {name, name + ": quantizer.grouped.groups residual-" + layer + " quantizers side by side",
          [name, layer](const OptionReader& o) -> std::shared_ptr<Quantizer> {
            const RegistryEntry& residual = find_quantizer("residual-" + layer);
            return make_grouped(name, section_of(o, "grouped").integer("groups"), [&] { return residual.make(o); });
          }};
}

}  // namespace

const std::vector<std::string>& option_sections() {
  static const std::vector<std::string> sections = {"fsq",    "lfq", "vq",       "simvq",
                                                    "latent", "fsp", "residual", "grouped"};
  return sections;
}

void validate_options(const std::string& section, const OptionReader& options) {
  if (section == "fsq") {
    fsq_options(options).validate();
  } else if (section == "lfq") {
    lfq_options(options).validate();
  } else if (section == "vq") {
    vq_options(options).validate();
  } else if (section == "simvq") {
    simvq_options(options).validate();
  } else if (section == "latent") {
    latent_options(options).validate();
  } else if (section == "fsp") {
    fsp_options(options).validate();
  } else if (section == "residual") {
    residual_options(options).validate();
  } else if (section == "grouped") {
    LOCKSTEP_CHECK_ARG(options.integer("groups") >= 1, "grouped: groups = ", options.integer("groups"),
                       " must be >= 1");
  } else {
    throw InvalidArgument("no quantizer option section '" + section +
                          "' (fsq, lfq, vq, simvq, latent, fsp, residual or grouped)");
  }
}

const std::vector<RegistryEntry>& quantizer_registry() {
  // Codebooks and projections are drawn from torch's default generator (the trainer seeds it).
  static const std::vector<RegistryEntry> entries = {
      {"fsq", "finite scalar quantization: per-dimension levels, no codebook to learn",
       [](const OptionReader& o) { return std::make_shared<Fsq>(fsq_options(o)); }},
      {"lfq", "lookup-free quantization: each latent channel is one bit; BSQ with spherical",
       [](const OptionReader& o) { return std::make_shared<Lfq>(lfq_options(o)); }},
      {"vq", "vector quantization with an EMA codebook (optional k-means init, dead-code replacement)",
       [](const OptionReader& o) { return std::make_shared<Vq>(vq_options(o)); }},
      {"simvq", "SimVQ: a frozen random codebook through one learned linear map (no EMA, no dead codes)",
       [](const OptionReader& o) { return std::make_shared<SimVq>(simvq_options(o)); }},
      {"latent", "latent quantization: each channel snaps to the nearest of its levels' values",
       [](const OptionReader& o) { return std::make_shared<LatentQuantize>(latent_options(o)); }},
      {"fsp", "finite scalar perturbation: CDF-activated bins, perturbed within a bin in training",
       [](const OptionReader& o) { return std::make_shared<Fsp>(fsp_options(o)); }},
      {"residual-vq", "residual VQ: quantizer.residual.num_quantizers VQ layers, each with quantizer.vq options",
       [](const OptionReader& o) {
         return make_residual_vq(residual_options(section_of(o, "residual")), vq_options(section_of(o, "vq")));
       }},
      {"residual-fsq", "residual FSQ: layers with quantizer.fsq levels, symmetric bound, scales levels^-l",
       [](const OptionReader& o) {
         return make_residual_fsq(residual_options(section_of(o, "residual")), fsq_options(section_of(o, "fsq")));
       }},
      {"residual-lfq", "residual LFQ: layers with quantizer.lfq options, codebook scale 2^-l",
       [](const OptionReader& o) {
         return make_residual_lfq(residual_options(section_of(o, "residual")), lfq_options(section_of(o, "lfq")));
       }},
      {"residual-simvq", "residual SimVQ: quantizer.residual.num_quantizers SimVQ layers with quantizer.simvq options",
       [](const OptionReader& o) {
         return make_residual_simvq(residual_options(section_of(o, "residual")), simvq_options(section_of(o, "simvq")));
       }},
      grouped_entry("vq"),
      grouped_entry("fsq"),
      grouped_entry("lfq"),
  };
  return entries;
}

std::vector<std::string> quantizer_names() {
  std::vector<std::string> names;
  for (const auto& e : quantizer_registry()) names.push_back(e.name);
  return names;
}

const RegistryEntry& find_quantizer(const std::string& name) {
  std::string valid;
  for (const auto& e : quantizer_registry()) {
    if (e.name == name) return e;
    valid += (valid.empty() ? "" : ", ") + e.name;
  }
  throw InvalidArgument(lockstep::detail::concat("unknown quantizer '", name, "'; valid: ", valid));
}

std::shared_ptr<Quantizer> make_quantizer(const std::string& name, const OptionReader& options) {
  return find_quantizer(name).make(options);
}

}  // namespace lockstep::quant
