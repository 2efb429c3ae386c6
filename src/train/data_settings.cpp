#include "lockstep/train/data_settings.h"

#include <algorithm>

#include "lockstep/core/error.h"
#include "lockstep/train/step_geometry.h"

namespace lockstep::train {
namespace {
constexpr int64_t kMostAutoEvalImages = 64;
}  // namespace

data::PlanOptions plan_options(const RunSettings& settings) {
  data::PlanOptions o;
  const StepGeometry step = StepGeometry::of(settings.train);
  o.global_batch = step.global_batch;
  o.seed = static_cast<uint64_t>(settings.train.seed());
  o.remainder = settings.data.remainder() == "pad" ? data::Remainder::Pad : data::Remainder::Drop;
  o.micro_batches = step.micro_batches;
  o.shard_size = step.unit();
  return o;
}

int64_t eval_image_count(const DataSettings& data, int64_t readable) {
  const int64_t asked = data.eval_images();
  const int64_t count = asked > 0 ? asked : std::clamp<int64_t>(readable / 10, 1, kMostAutoEvalImages);
  LOCKSTEP_CHECK_ARG(count<readable, "data.eval_images = ", asked, asked> 0 ? "" : " (chosen: 1)",
                     " would hold out every one of the ", readable, " readable images for evaluation; ",
                     asked > 0 ? "set it lower" : "an image folder needs at least 2 readable images");
  return count;
}

std::string describe_eval_images(const DataSettings& data, int64_t readable) {
  const int64_t count = eval_image_count(data, readable);
  if (data.eval_images() > 0) return detail::concat(count, " held out for evaluation");
  return detail::concat(count, " held out for evaluation (data.eval_images = 0: a tenth of the ", readable,
                        " readable images, at most ", kMostAutoEvalImages, ")");
}

data::FolderSplit run_folder_split(const DataSettings& data, const data::Manifest& manifest) {
  return data::split_folder(manifest, eval_image_count(data, manifest.readable_count()), data.train_subset());
}

}  // namespace lockstep::train
