// Autocast scopes: bfloat16 where asked, float32 inside NoAutocast (the quantizers' arithmetic), and
// the thread's previous state back after each scope.
#include "lockstep/quant/autocast.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/model/autoencoder.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {
namespace {

TEST(Autocast, BfloatWhereAskedFloatInsideNoAutocastAndRestoredAfter) {
  const at::Tensor a = torch::randn({4, 8}), b = torch::randn({8, 3});
  ASSERT_FALSE(autocast_enabled(c10::kCPU));
  {
    const Autocast bf16(c10::kCPU, at::kBFloat16);
    EXPECT_TRUE(autocast_enabled(c10::kCPU));
    EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kBFloat16);
    {
      const NoAutocast fp32;
      EXPECT_FALSE(autocast_enabled(c10::kCPU));
      EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(autocast_enabled(c10::kCPU));
  }
  EXPECT_FALSE(autocast_enabled(c10::kCPU));
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
}

// A quantizer that records what it was handed and the autocast state it ran in.
class Spy final : public Quantizer {
 public:
  Spy() : Quantizer("Spy"), inner_(std::make_shared<Vq>(VqOptions(4, 16))) { register_module("inner", inner_); }
  std::string kind() const override { return "spy"; }
  int64_t dim() const override { return 4; }
  int64_t codebook_size() const override { return 16; }
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override {
    record(x);
    return inner_->quantize(x, ctx);
  }
  at::Tensor encode(const at::Tensor& x) override {
    record(x);
    return inner_->encode(x);
  }
  at::Tensor decode(const at::Tensor& indices) override {
    record(indices);
    return inner_->decode(indices);
  }
  int calls = 0, under_autocast = 0, non_float = 0;

 private:
  void record(const at::Tensor& x) {
    ++calls;
    under_autocast += autocast_enabled(c10::kCPU) ? 1 : 0;
    non_float += x.is_floating_point() && x.scalar_type() != at::kFloat ? 1 : 0;
  }
  std::shared_ptr<Vq> inner_;
};

// Inside a bfloat16 forward the model's convolutions run in bfloat16; its quantizer is called with
// autocast off and float32 tokens, in forward, encode and decode alike.
TEST(Autocast, TheAutoencodersQuantizerRunsInFloat32UnderAutocast) {
  torch::manual_seed(0);
  auto spy = std::make_shared<Spy>();
  model::Autoencoder m(model::AutoencoderOptions(1, {8, 8}), spy);
  m->eval();
  const at::Tensor x = torch::rand({2, 1, 8, 8}) * 2 - 1;
  const Autocast bf16(c10::kCPU, at::kBFloat16);
  const model::AutoencoderOutput out = m->forward(x, QuantizeContext{});
  EXPECT_EQ(out.reconstruction.scalar_type(), at::kBFloat16);
  EXPECT_EQ(out.quant.quantized.scalar_type(), at::kFloat);
  m->decode(m->encode(x));
  EXPECT_EQ(spy->calls, 3);
  EXPECT_EQ(spy->under_autocast, 0);
  EXPECT_EQ(spy->non_float, 0);
}

}  // namespace
}  // namespace lockstep::quant
