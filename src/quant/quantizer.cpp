#include "lockstep/quant/quantizer.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::quant {

at::Tensor QuantizerOutput::total_loss() const {
  at::Tensor total = torch::zeros({}, quantized.options());
  for (const auto& [name, loss] : losses) total = total + loss;
  return total;
}

at::Tensor checked_mask(const QuantizeContext& ctx, const at::Tensor& x, const std::string& kind) {
  if (!ctx.mask.defined()) return {};
  LOCKSTEP_CHECK_ARG(
      x.dim() == 3 && ctx.mask.dim() == 2 && ctx.mask.size(0) == x.size(0) && ctx.mask.size(1) == x.size(1), kind,
      ": the mask must be (b, n) = (", x.size(0), ", ", x.dim() > 1 ? x.size(1) : 0, ") for tokens ", x.sizes(),
      ", got ", ctx.mask.sizes());
  LOCKSTEP_CHECK_ARG(ctx.mask.scalar_type() == torch::kBool, kind, ": the mask must be bool, got ",
                     ctx.mask.scalar_type());
  return ctx.mask.to(x.device()).contiguous();  // read by pointer on the host (LFQ's entropy subset)
}

void check_no_mask(const QuantizeContext& ctx, const std::string& kind) {
  LOCKSTEP_CHECK_ARG(!ctx.mask.defined(), kind, " takes no mask (the VQ and LFQ quantizers do)");
}

void apply_mask(const at::Tensor& mask, at::Tensor& quantized, at::Tensor& indices) {
  if (!mask.defined()) return;
  quantized = quantized.masked_fill(~mask.unsqueeze(2), 0.0);
  indices = indices.masked_fill(indices.dim() == 3 ? ~mask.unsqueeze(2) : ~mask, -1);
}

at::Tensor image_to_tokens(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 4, "expected an image batch (b, d, h, w), got ", x.sizes());
  return x.flatten(2).transpose(1, 2);
}

at::Tensor tokens_to_image(const at::Tensor& tokens, int64_t height, int64_t width) {
  LOCKSTEP_CHECK_ARG(tokens.dim() == 3 && tokens.size(1) == height * width, "tokens ", tokens.sizes(),
                     " do not form a ", height, "x", width, " image");
  return tokens.transpose(1, 2).reshape({tokens.size(0), tokens.size(2), height, width});
}

}  // namespace lockstep::quant
