#include "lockstep/quant/registry.h"

#include "lockstep/core/error.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {

const std::vector<RegistryEntry>& quantizer_registry() {
  static const std::vector<RegistryEntry> entries = {
      {"fsq", "finite scalar quantization: per-dimension levels, no codebook to learn",
       [](const OptionReader& o) {
         return std::make_shared<Fsq>(FsqOptions(o.int_list("levels")));
       }},
      {"lfq", "lookup-free quantization: each latent channel is one bit; BSQ with spherical",
       [](const OptionReader& o) {
         LfqOptions options(o.integer("codebook_size"));
         options.entropy_loss_weight(o.real("entropy_loss_weight"))
             .commitment_loss_weight(o.real("commitment_loss_weight"))
             .diversity_gamma(o.real("diversity_gamma"))
             .inv_temperature(o.real("inv_temperature"))
             .codebook_scale(o.real("codebook_scale"))
             .spherical(o.boolean("spherical"));
         if (const int64_t dim = o.integer("dim"); dim != 0) options.dim(dim);  // 0: log2 codebook_size
         return std::make_shared<Lfq>(options);
       }},
      {"vq", "vector quantization with an EMA codebook (optional k-means init, dead-code replacement)",
       [](const OptionReader& o) {
         VqOptions options(o.integer("dim"), o.integer("codebook_size"));
         options.decay(o.real("decay"))
             .commitment_weight(o.real("commitment_weight"))
             .use_cosine_sim(o.boolean("cosine"))
             .estimator(o.boolean("rotation_trick") ? VqEstimator::RotationTrick : VqEstimator::StraightThrough)
             .kmeans_init(o.boolean("kmeans_init"))
             .kmeans_iters(o.integer("kmeans_iters"))
             .threshold_ema_dead_code(o.real("threshold_ema_dead_code"));
         return std::make_shared<Vq>(options);  // codebook drawn from torch's default generator
       }},
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
  throw InvalidArgument(detail::concat("unknown quantizer '", name, "'; valid: ", valid));
}

std::shared_ptr<Quantizer> make_quantizer(const std::string& name, const OptionReader& options) {
  return find_quantizer(name).make(options);
}

}  // namespace lockstep::quant
