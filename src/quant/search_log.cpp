#include "lockstep/quant/search_log.h"

#include <torch/torch.h>

#include <utility>

#include "lockstep/core/error.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

SearchLog::SearchLog(at::Tensor recorded) : replaying_(true), record_(std::move(recorded)) {
  LOCKSTEP_CHECK_ARG(record_.defined() && record_.dim() == 1 && record_.scalar_type() == torch::kInt64,
                     "search log: a record is one int64 vector, got ",
                     record_.defined() ? record_.sizes() : at::IntArrayRef{}, " of ",
                     record_.defined() ? c10::toString(record_.scalar_type()) : "nothing");
}

at::Tensor SearchLog::choose(at::IntArrayRef shape, const std::function<at::Tensor()>& search) {
  if (!replaying_) {
    at::Tensor chosen = search();
    LOCKSTEP_CHECK_ARG(chosen.sizes() == shape, "search log: a search of shape ", shape, " gave ", chosen.sizes());
    choices_.push_back(chosen.reshape(-1).to(torch::kInt64));
    return chosen;
  }
  const int64_t count = c10::multiply_integers(shape);
  LOCKSTEP_CHECK_ARG(taken_ + count <= record_.numel(), "search log: the replayed call asks for ", taken_ + count,
                     " choices, its forward recorded ", record_.numel(), " (the call differs from the one recorded)");
  at::Tensor chosen = record_.narrow(0, taken_, count).reshape(shape);
  taken_ += count;
  return chosen;
}

at::Tensor SearchLog::recorded() const {
  if (choices_.empty()) return torch::empty({0}, torch::kInt64);
  return choices_.size() == 1 ? choices_.front().clone() : torch::cat(choices_);  // never a view of a choice
}

void SearchLog::check_all_taken() const {
  LOCKSTEP_CHECK_ARG(!replaying_ || taken_ == record_.numel(), "search log: the replayed call took ", taken_,
                     " of the ", record_.numel(),
                     " choices its forward recorded (the call differs from the one "
                     "recorded)");
}

at::Tensor choose_codes(const QuantizeContext& ctx, at::IntArrayRef shape, const std::function<at::Tensor()>& search) {
  return ctx.searches ? ctx.searches->choose(shape, search) : search();
}

}  // namespace lockstep::quant
