// Batches from an image folder: the manifest's readable images in buckets, the epoch's
// global plan, this rank's part of each step decoded and fitted to the step's bucket on worker
// threads ahead of the trainer (a bounded queue), and images that fail to decode replaced by
// another of the same bucket, chosen the same way on every rank and counted.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lockstep/data/buckets.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/data/plan.h"

namespace lockstep::data {

struct FolderBatch {
  int64_t epoch = 0;
  int64_t step = 0;  // within the epoch
  int64_t bucket = 0;
  BucketSize size;
  std::vector<io::Image> images;  // this rank's part, all of `size`
  int64_t replaced = 0;           // images that failed to decode and were replaced
};

// Entry `id` of `manifest` decoded to `channels` and fitted to `size` (at `placement`), as training
// sees it. Throws CorruptInput or IoError naming the file when it cannot be decoded.
io::Image load_fitted(const Manifest& manifest, int64_t id, BucketSize size, int channels,
                      const FitPlacement& placement = {});

// Random crops and flips of training images. Each image's draw comes from (seed, epoch, step, its
// slot in the global batch): the same on any number of ranks and after a resume.
struct Augmentation {
  bool flip = false;    // mirror left to right with probability 1/2
  double max_zoom = 1;  // > 1: zoom uniform in [1, max_zoom], window placed uniformly
  bool active() const { return flip || max_zoom > 1; }
  // The placement of the image in `slot` of global batch `step` of `epoch`.
  FitPlacement draw(uint64_t seed, int64_t epoch, int64_t step, int64_t slot) const;
};

// Which readable entries are held out for evaluation (held_out_entries) and which the training set
// leaves out: the held-out ones, and with `train_subset` > 0 every other one after the first
// train_subset (in path order).
struct FolderSplit {
  std::vector<int64_t> held_out;
  std::vector<int64_t> excluded;
};
FolderSplit split_folder(const Manifest& manifest, int64_t eval_images, int64_t train_subset);

// Each bucket's training images: the readable entries assign_buckets puts there, less `excluded`.
std::vector<std::vector<int64_t>> training_buckets(const Manifest& manifest, const std::vector<BucketSize>& table,
                                                   const std::vector<int64_t>& excluded);

// Images of a bucket too small to fill one global batch moved to a fuller bucket.
struct MergedBucket {
  int64_t from = 0;  // bucket indices in the table
  int64_t to = 0;
  int64_t images = 0;
};

class FolderDataset {
 public:
  // Trains on the manifest's readable entries except `excluded` (indices held out for evaluation).
  // A bucket with fewer images than one global batch hands them to the bucket nearest its aspect
  // ratio that has enough (see merged()). Throws InvalidArgument before any training: no readable
  // image, an empty table, or a global batch that no bucket can fill.
  // Training images are fitted at placements `augmentation` draws (the plain fit by default).
  FolderDataset(Manifest manifest, std::vector<BucketSize> table, int channels, PlanOptions plan,
                const std::vector<int64_t>& excluded = {}, Augmentation augmentation = {});

  EpochPlan plan(int64_t epoch) const { return EpochPlan(buckets_, plan_options_, epoch); }
  // Decodes this rank's part of `step`; an image that fails to decode is replaced by the first
  // decodable one of a sequence of same-bucket samples drawn from (seed, epoch, step, slot).
  FolderBatch load(const EpochPlan& plan, int64_t epoch, int64_t step, int world_size, int rank) const;

  const Manifest& manifest() const { return manifest_; }
  const std::vector<std::vector<int64_t>>& buckets() const { return buckets_; }
  const std::vector<BucketSize>& table() const { return table_; }
  int channels() const { return channels_; }
  const PlanOptions& plan_options() const { return plan_options_; }
  int64_t training_images() const;
  const std::vector<MergedBucket>& merged() const { return merged_; }
  // For each bucket of the table, the bucket its aspect ratio trains in: itself when it holds
  // training images, else the nearest by aspect ratio that does (where a merged bucket's went).
  const std::vector<int64_t>& bucket_map() const { return bucket_map_; }
  // Readable entries `ids` (e.g. held-out images) grouped by the bucket images of their aspect
  // ratio train in, so they are fitted as training fits their siblings.
  std::vector<std::vector<int64_t>> place(const std::vector<int64_t>& ids) const;
  int64_t unreadable() const { return static_cast<int64_t>(manifest_.entries.size()) - manifest_.readable_count(); }

 private:
  Manifest manifest_;
  std::vector<BucketSize> table_;
  int channels_;
  PlanOptions plan_options_;
  Augmentation augmentation_;
  std::vector<std::vector<int64_t>> buckets_;
  std::vector<MergedBucket> merged_;
  std::vector<int64_t> table_bucket_;  // per manifest entry: its bucket in the table, -1 if unreadable
  std::vector<int64_t> bucket_map_;

  void merge_small_buckets();
};

// Loads steps [first_step, end_step or plan.steps()) of one epoch in order, `threads` workers decoding up to
// `depth` steps ahead. next() blocks only when the workers are behind, and reports how long.
class PrefetchLoader {
 public:
  // With `end_step` >= 0, loads only up to that step (exclusive): nothing past a run's last step.
  PrefetchLoader(const FolderDataset& dataset, int64_t epoch, int64_t first_step, int world_size, int rank,
                 int threads = 2, int depth = 4, int64_t end_step = -1);
  ~PrefetchLoader();
  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  bool done() const { return next_ >= end_; }
  int64_t epoch() const { return epoch_; }
  int64_t next_step() const { return next_; }  // the step next() returns
  // The next step's batch; rethrows a worker's error. Adds the time spent waiting to waited_seconds().
  FolderBatch next();
  double waited_seconds() const { return waited_; }
  int64_t steps() const { return plan_.steps(); }

 private:
  void work();

  const FolderDataset& dataset_;
  const EpochPlan plan_;
  const int64_t epoch_;
  const int world_size_, rank_, depth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t end_;      // one past the last step to load
  int64_t claimed_;  // next step a worker will take
  int64_t next_;     // next step next() returns
  std::map<int64_t, FolderBatch> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  double waited_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace lockstep::data
