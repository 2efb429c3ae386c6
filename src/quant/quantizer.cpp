#include "lockstep/quant/quantizer.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::quant {

at::Tensor QuantizerOutput::total_loss() const {
  at::Tensor total = torch::zeros({}, quantized.options());
  for (const auto& [name, loss] : losses) total = total + loss;
  return total;
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
