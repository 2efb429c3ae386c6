#include "lockstep/quant/registry.h"

#include "lockstep/core/error.h"
#include "lockstep/quant/grouped.h"
#include "quant/option_readers.h"

namespace lockstep::quant {

using namespace sections;

namespace {

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
