#include "lockstep/train/adversary.h"

#include <torch/torch.h>

#include <algorithm>
#include <optional>

#include "lockstep/core/error.h"
#include "lockstep/quant/autocast.h"

namespace lockstep::train {
namespace {
constexpr double kLecamDecay = 0.999;  // of the logit averages, as in LeCam GAN (Tseng et al. 2021)
constexpr double kMostFactor = 1e4;    // VQGAN's clamp of the adaptive weight
}  // namespace

Adversary::Adversary(const AdversaryOptions& options, int64_t in_channels, std::shared_ptr<dist::Group> group,
                     at::Device device)
    : options_(options), group_(std::move(group)), device_type_(device.type()) {
  LOCKSTEP_CHECK_ARG(options_.objective == "hinge" || options_.objective == "non_saturating", "adversary: objective '",
                     options_.objective, "' is neither hinge nor non_saturating");
  LOCKSTEP_CHECK_ARG(options_.weight > 0 && options_.lr > 0 && options_.lecam >= 0, "adversary: weight ",
                     options_.weight, " and lr ", options_.lr, " must be > 0, lecam ", options_.lecam, " >= 0");
  discriminator_ = model::Discriminator(
      model::DiscriminatorOptions(in_channels).channels(options_.channels).layers(options_.layers));
  discriminator_->to(device);
  discriminator_->train();
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& p : discriminator_->named_parameters(true)) named.emplace_back(p.key(), p.value());
  // The betas VQGAN's discriminator trains with.
  adam_ = std::make_unique<Adam>(named, AdamOptions().lr(options_.lr).betas(0.5, 0.9));
  sync_ = std::make_unique<GradientSync>(group_, discriminator_->parameters(true), options_.bucket_bytes,
                                         "train.disc.grads");
}

Adversary::~Adversary() = default;

at::Tensor Adversary::generator_loss(const at::Tensor& reconstruction) {
  // Held fixed: the model's backward must not reach the discriminator (nor its gradient hooks).
  for (auto& p : discriminator_->parameters()) p.requires_grad_(false);
  at::Tensor logits;
  {
    std::optional<quant::Autocast> bf16;
    if (options_.bfloat16) bf16.emplace(device_type_, at::kBFloat16);
    logits = discriminator_->forward(reconstruction).to(at::kFloat);
  }
  for (auto& p : discriminator_->parameters()) p.requires_grad_(true);
  return options_.objective == "hinge" ? -logits.mean() : torch::softplus(-logits).mean();
}

double Adversary::factor(const at::Tensor& nll, const at::Tensor& adv, const at::Tensor& last_layer) {
  if (!options_.adaptive_weight) return options_.weight;
  const at::Tensor g_nll = torch::autograd::grad({nll}, {last_layer}, {}, /*retain_graph=*/true)[0];
  const at::Tensor g_adv = torch::autograd::grad({adv}, {last_layer}, {}, /*retain_graph=*/true)[0];
  // Summed over ranks, the weighted gradients are W times the global batch's: the ratio is the same.
  std::vector<at::Tensor> both = {torch::stack({g_nll, g_adv}).detach()};
  group_->all_reduce(both, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("train.adversarial.adaptive_weight"));
  const double scale = 1.0 / group_->size();
  const double n_nll = both[0][0].norm().item<double>() * scale;
  const double n_adv = both[0][1].norm().item<double>() * scale;
  return options_.weight * std::clamp(n_nll / (n_adv + 1e-4), 0.0, kMostFactor);
}

double Adversary::train_step(const std::vector<at::Tensor>& reals, const std::vector<at::Tensor>& fakes,
                             const std::vector<double>& rank_weights) {
  LOCKSTEP_CHECK_ARG(!reals.empty() && reals.size() == fakes.size() && reals.size() == rank_weights.size(),
                     "adversary: ", reals.size(), " real, ", fakes.size(), " reconstructed batches and ",
                     rank_weights.size(), " weights; one of each per micro-batch");
  model::DiscriminatorImpl& d = *discriminator_;
  const auto passes = static_cast<int64_t>(reals.size());
  sync_->begin_accumulation(passes);
  adam_->zero_grad();
  // This rank's weighted loss and mean logits (for LeCam's averages), summed over its micro-batches,
  // travel summed over ranks with the last bucket.
  double sums[3] = {0, 0, 0};
  for (int64_t j = 0; j < passes; ++j) {
    at::Tensor logits_real, logits_fake;
    {
      std::optional<quant::Autocast> bf16;
      if (options_.bfloat16) bf16.emplace(device_type_, at::kBFloat16);
      logits_real = d.forward(reals[j]).to(at::kFloat);
      logits_fake = d.forward(fakes[j].detach()).to(at::kFloat);
    }
    at::Tensor loss = options_.objective == "hinge"
                          ? (torch::relu(1 - logits_real).mean() + torch::relu(1 + logits_fake).mean()) * 0.5
                          : (torch::softplus(-logits_real).mean() + torch::softplus(logits_fake).mean()) * 0.5;
    if (options_.lecam > 0) {
      // Per logit, so that the ranks' weighted terms average to the global batch's.
      const at::Tensor reg =
          torch::relu(logits_real - d.lecam_fake).pow(2).mean() + torch::relu(d.lecam_real - logits_fake).pow(2).mean();
      loss = loss + reg * options_.lecam;
    }
    const double w = rank_weights[j];
    loss = loss * w;
    sums[0] += loss.item<double>();
    sums[1] += logits_real.detach().mean().item<double>() * w;
    sums[2] += logits_fake.detach().mean().item<double>() * w;
    if (j == passes - 1) sync_->set_control(torch::tensor({sums[0], sums[1], sums[2]}, torch::kFloat32));
    loss.backward();
  }
  const at::Tensor summed = sync_->finish() / group_->size();
  adam_->step();
  if (options_.lecam > 0) {
    torch::NoGradGuard no_grad;
    d.lecam_real.mul_(kLecamDecay).add_(summed[1].item<double>() * (1 - kLecamDecay));
    d.lecam_fake.mul_(kLecamDecay).add_(summed[2].item<double>() * (1 - kLecamDecay));
  }
  return summed[0].item<double>();
}

}  // namespace lockstep::train
