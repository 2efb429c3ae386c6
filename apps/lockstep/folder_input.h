// Image folders as the input of eval and encode: which images, in which buckets, fed to the model
// in batches of one bucket's size.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "lockstep/data/buckets.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/train/model_factory.h"

namespace lockstep::cli {

// True when `dir` is a directory that does not hold Fashion-MNIST's files.
bool is_image_folder(const std::string& dir);

enum class FolderSelection { All, HeldOut, Training };

struct FolderInput {
  data::Manifest manifest;
  std::vector<data::BucketSize> table;        // the run's data.buckets
  std::vector<std::vector<int64_t>> buckets;  // selected manifest entries per bucket
  int64_t images() const;
};

// The run's own folder (`dir` is its data.dir): its held-out (data.eval_images) or training images,
// from the manifest the run saved when `checkpoint_or_run_dir` is its directory (else a scan).
// FolderSelection::All: every readable image of `dir` (any folder). Every image goes to the bucket
// its aspect ratio trained in, as in training. `limit` > 0 keeps the first that many in path order.
FolderInput open_folder_input(const train::TrainedModel& model, const std::string& checkpoint_or_run_dir,
                              const std::string& dir, FolderSelection selection, int64_t limit);

// Decodes the selected images bucket by bucket and calls `fn` with up to `batch` of them at a time:
// the bucket, their manifest entries, and the tensor (b, c, h, w) in [-1, 1] at the bucket's size.
using BatchFn = std::function<void(size_t bucket, const std::vector<int64_t>& ids, const at::Tensor& x)>;
void for_each_batch(const FolderInput& input, int channels, int64_t batch, const BatchFn& fn);

// What `encode` writes beside the tokens of a folder (one WxH.npy per bucket), and `decode` reads.
constexpr const char* kTokenIndexFile = "index.json";
constexpr const char* kTokenIndexFormat = "lockstep-folder-tokens-1";

}  // namespace lockstep::cli
