#include "lockstep/train/grad_sync.h"

#include <torch/torch.h>

#include <algorithm>

#include "lockstep/core/error.h"

namespace lockstep::train {

struct GradientSync::Impl {
  struct Bucket {
    std::vector<size_t> members;   // parameter indices
    std::vector<int64_t> offsets;  // of each member in `flat`
    at::Tensor flat;               // the bucket's gradients (plus the control tensor in the last one)
    int64_t ready = 0;             // members whose gradient arrived this step
    std::vector<at::Tensor> send;  // what is in flight: {flat}
    std::unique_ptr<dist::PendingCollective> pending;
    std::string tag;
  };

  std::shared_ptr<dist::Group> group;
  std::vector<at::Tensor> parameters;
  std::vector<size_t> bucket_of;  // per parameter
  std::vector<size_t> slot_of;    // per parameter: its place in the bucket's members
  std::vector<int64_t> arrived;   // per parameter: gradients received this step
  int64_t passes = 1;             // backward passes this step (gradient accumulation)
  bool control_set = false;
  std::vector<Bucket> buckets;
  at::Tensor control;
  int64_t control_offset = 0;                            // in the last bucket
  at::TensorOptions on = torch::dtype(torch::kFloat32);  // the parameters' device
  bool active = false;

  void launch(Bucket& b) {
    if (&b == &buckets.back()) {
      LOCKSTEP_THROW_IF_NOT(control_set, InternalError,
                            "gradient sync: the last bucket is complete before set_control(); call it before the "
                            "step's last backward pass");
      b.flat.narrow(0, control_offset, control.numel()).copy_(control);
    }
    b.send = {b.flat};
    b.pending = group->all_reduce_async(b.send, dist::ReduceOp::Sum, dist::CallSite{b.tag.c_str(), __FILE__, __LINE__});
  }

  void on_gradient(size_t index, const at::Tensor& grad) {
    if (!active) return;  // a backward outside a training step (none today): not synchronised
    // A leaf's hook sees its whole gradient once per backward (shared uses are summed first), so
    // one call more than the step's passes means an extra backward, whose gradient would miss the buckets.
    LOCKSTEP_THROW_IF_NOT(arrived[index] < passes, InvalidArgument, "gradient sync: parameter ", index,
                          " received gradient ", arrived[index] + 1, " in a step of ", passes,
                          " backward pass(es); run exactly that many between begin() and finish()");
    Bucket& b = buckets[bucket_of[index]];
    // Accumulated micro-batch by micro-batch; the bucket goes out with the last pass's gradient.
    b.flat.narrow(0, b.offsets[slot_of[index]], grad.numel()).add_(grad.reshape({-1}));
    if (++arrived[index] == passes && ++b.ready == static_cast<int64_t>(b.members.size())) launch(b);
  }
};

GradientSync::GradientSync(std::shared_ptr<dist::Group> group, std::vector<at::Tensor> parameters, int64_t bucket_bytes,
                           const std::string& tag)
    : impl_(std::make_shared<Impl>()) {
  LOCKSTEP_CHECK_ARG(bucket_bytes >= 1, "gradient sync: bucket size ", bucket_bytes, " bytes must be >= 1");
  Impl& m = *impl_;
  m.group = std::move(group);
  m.parameters = std::move(parameters);
  m.bucket_of.resize(m.parameters.size());
  m.slot_of.resize(m.parameters.size());
  m.arrived.assign(m.parameters.size(), 0);
  // Reverse order: the last layers' gradients come first in backward.
  std::vector<int64_t> sizes;
  for (size_t k = m.parameters.size(); k-- > 0;) {
    const at::Tensor& p = m.parameters[k];
    LOCKSTEP_CHECK_ARG(p.scalar_type() == at::kFloat, "gradient sync: parameter ", k, " is ", p.scalar_type(),
                       "; only float32 parameters are synchronised");
    LOCKSTEP_CHECK_ARG(p.device() == m.parameters.back().device(), "gradient sync: parameter ", k, " is on ",
                       p.device(), ", parameter ", m.parameters.size() - 1, " on ", m.parameters.back().device(),
                       "; all must be on one device");
    m.on = m.on.device(p.device());
    const int64_t bytes = p.numel() * 4;
    if (m.buckets.empty() || (sizes.back() > 0 && sizes.back() + bytes > bucket_bytes)) {
      m.buckets.emplace_back();
      sizes.push_back(0);
    }
    Impl::Bucket& b = m.buckets.back();
    m.slot_of[k] = b.members.size();
    b.members.push_back(k);
    b.offsets.push_back(sizes.back() / 4);
    sizes.back() += bytes;
    m.bucket_of[k] = m.buckets.size() - 1;
  }
  for (size_t i = 0; i < m.buckets.size(); ++i) {
    m.buckets[i].tag = tag + ".bucket" + std::to_string(i);
    m.buckets[i].flat = torch::zeros({sizes[i] / 4}, m.on);
  }
  for (size_t k = 0; k < m.parameters.size(); ++k) {
    std::weak_ptr<Impl> weak = impl_;
    m.parameters[k].register_hook([weak, k](const at::Tensor& grad) {
      if (auto impl = weak.lock()) impl->on_gradient(k, grad);
      return grad;
    });
  }
}

GradientSync::~GradientSync() = default;

int64_t GradientSync::buckets() const { return static_cast<int64_t>(impl_->buckets.size()); }

void GradientSync::begin(const at::Tensor& control) {
  begin_accumulation(1);
  set_control(control);
}

void GradientSync::begin_accumulation(int64_t backward_passes) {
  Impl& m = *impl_;
  LOCKSTEP_CHECK_ARG(backward_passes >= 1, "gradient sync: ", backward_passes, " backward passes; at least 1");
  for (auto& b : m.buckets) {
    b.ready = 0;
    b.pending.reset();
    b.flat.zero_();
  }
  std::fill(m.arrived.begin(), m.arrived.end(), 0);
  m.passes = backward_passes;
  m.control_set = false;
  m.active = true;
}

void GradientSync::set_control(const at::Tensor& control) {
  Impl& m = *impl_;
  LOCKSTEP_CHECK_ARG(m.active, "gradient sync: set_control() outside a step (begin ... finish)");
  LOCKSTEP_CHECK_ARG(control.dim() == 1 && control.scalar_type() == at::kFloat,
                     "gradient sync: the control tensor must be 1-D float32, got ", control.sizes());
  if (!m.control.defined() || m.control.numel() != control.numel()) {
    // The last bucket carries the control values after its gradients (kept: earlier passes' sums).
    Impl::Bucket& last = m.buckets.back();
    m.control_offset = last.flat.numel() - (m.control.defined() ? m.control.numel() : 0);
    at::Tensor grown = torch::zeros({m.control_offset + control.numel()}, m.on);
    grown.narrow(0, 0, m.control_offset).copy_(last.flat.narrow(0, 0, m.control_offset));
    last.flat = grown;
  }
  m.control = control.clone();
  m.control_set = true;
}

GradientSync::Paused::Paused(GradientSync& sync) : sync_(sync), was_active_(sync.impl_->active) {
  sync_.impl_->active = false;
}

GradientSync::Paused::~Paused() { sync_.impl_->active = was_active_; }

at::Tensor GradientSync::finish() {
  Impl& m = *impl_;
  LOCKSTEP_THROW_IF_NOT(m.active, InvalidArgument, "gradient sync: finish() without begin()");
  LOCKSTEP_THROW_IF_NOT(m.control_set, InvalidArgument, "gradient sync: finish() without set_control()");
  m.active = false;
  // Buckets with parameters that got no gradient (the same on every rank: the graph is) go now, in
  // bucket order, with zeros for the missing ones.
  for (auto& b : m.buckets) {
    if (!b.pending) m.launch(b);
  }
  for (auto& b : m.buckets) b.pending->wait();
  const double ranks = m.group->size();
  for (size_t k = 0; k < m.parameters.size(); ++k) {
    Impl::Bucket& b = m.buckets[m.bucket_of[k]];
    at::Tensor& p = m.parameters[k];
    const at::Tensor mean = b.flat.narrow(0, b.offsets[m.slot_of[k]], p.numel()).view(p.sizes()) / ranks;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    p.mutable_grad().copy_(mean);
  }
  return m.buckets.back().flat.narrow(0, m.control_offset, m.control.numel()).clone();
}

}  // namespace lockstep::train
