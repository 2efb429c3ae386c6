// A run's data settings as the data layer's options, for the trainer and for the tools
// that must see a run's data as it trained (lockstep eval, encode).
#pragma once

#include <string>

#include "lockstep/data/folder_loader.h"
#include "lockstep/data/plan.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::train {

// train.batch_size (the global batch), train.seed and data.remainder.
data::PlanOptions plan_options(const RunSettings& settings);

// Image folders: how many of `readable` images are held out for evaluation. data.eval_images when
// set (> 0); 0 chooses a tenth of the readable images, at least 1 and at most 64, so that small
// folders train too. Throws InvalidArgument when that would leave no image to train on.
int64_t eval_image_count(const DataSettings& data, int64_t readable);

// "3 held out (data.eval_images = 0: a tenth of 30 readable images)": the count and why, for the user.
std::string describe_eval_images(const DataSettings& data, int64_t readable);

// How a run divides an image folder: the held-out evaluation images (data.eval_images) and those
// left out of training (data.train_subset). The trainer and lockstep eval/encode take it from here,
// so they agree on which images a run trained on.
data::FolderSplit run_folder_split(const DataSettings& data, const data::Manifest& manifest);

}  // namespace lockstep::train
