// An exponential moving average of a model's weights, which the published tokenizer trainers
// evaluate and ship beside the raw weights. It is updated after each optimizer step from weights
// that are identical on every rank, so the average is too, with no collective.
#pragma once

namespace torch::nn {
class Module;
}

namespace lockstep::train {

// `average` (a model of the same configuration) moves toward `model`: each floating-point parameter
// a <- decay a + (1 - decay) p, in its own dtype. Buffers (codebooks, their EMA counts, BatchNorm
// statistics) are copied instead: a quantizer's state is already its own average, and a codebook
// blended with an older one would no longer match the counts beside it. Throws InvalidArgument with
// the value for a decay outside [0, 1), and naming the tensor when the two models differ.
void update_weight_ema(torch::nn::Module& average, const torch::nn::Module& model, double decay);

}  // namespace lockstep::train
