#include "lockstep/quant/initialisation.h"

#include <algorithm>

#include "lockstep/quant/grouped.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {
namespace {

bool any_awaits(const std::vector<std::shared_ptr<Quantizer>>& parts) {
  return std::any_of(parts.begin(), parts.end(), [](const auto& q) { return awaits_initialisation(*q); });
}

}  // namespace

bool awaits_initialisation(const Quantizer& quantizer) {
  if (const auto* vq = dynamic_cast<const Vq*>(&quantizer)) return vq->options().kmeans_init() && !vq->initted();
  if (const auto* residual = dynamic_cast<const Residual*>(&quantizer)) return any_awaits(residual->layers());
  if (const auto* grouped = dynamic_cast<const Grouped*>(&quantizer)) return any_awaits(grouped->groups());
  return false;  // the other quantizers initialise nothing from data
}

}  // namespace lockstep::quant
