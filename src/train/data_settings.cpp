#include "lockstep/train/data_settings.h"

namespace lockstep::train {

data::PlanOptions plan_options(const Config& config) {
  data::PlanOptions o;
  o.global_batch = config.get_int("train.batch_size");
  o.seed = static_cast<uint64_t>(config.get_int("train.seed"));
  o.remainder = config.get_string("data.remainder") == "pad" ? data::Remainder::Pad : data::Remainder::Drop;
  return o;
}

}  // namespace lockstep::train
