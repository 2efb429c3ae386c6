// An image folder as training data: its manifest (scanned with the run directory's copy as a
// cache, written when the run starts and compared on resume), images held out for evaluation,
// buckets, and the prefetching loader.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/data/batch.h"
#include "lockstep/data/folder_loader.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/train/data_settings.h"
#include "lockstep/train/run_dir.h"
#include "lockstep/train/step_geometry.h"
#include "train_data.h"

namespace lockstep::train {
namespace fs = std::filesystem;

namespace {

struct FolderSettings {
  data::FolderSplit split;  // run_folder_split: held out, left out
  std::string eval_note;    // how many are held out, and why
  int rank = 0, world_size = 1;
  int workers = 2, prefetch = 4;
  std::string manifest_file;  // for messages
  data::Augmentation augmentation;
};

// "a.jpg: not an image; b.png: truncated" for the first `most` unreadable files, "... and N more".
std::string first_errors(const data::Manifest& m, size_t most) {
  std::vector<std::string> shown;
  size_t total = 0;
  for (const auto& e : m.entries) {
    if (e.readable()) continue;
    if (++total <= most) shown.push_back(e.path + ": " + e.error.substr(0, 200));
  }
  std::string text;
  for (const auto& item : shown) text += (text.empty() ? "" : "; ") + item;
  if (total > most) text += detail::concat("; and ", total - most, " more");
  return text;
}

class FolderData final : public TrainData {
 public:
  FolderData(data::Manifest manifest, std::vector<data::BucketSize> table, int channels, const data::PlanOptions& plan,
             const FolderSettings& settings)
      : settings_(settings) {
    held_out_ = settings.split.held_out;
    dataset_ = std::make_unique<data::FolderDataset>(std::move(manifest), std::move(table), channels, plan,
                                                     settings.split.excluded, settings.augmentation);
    steps_per_epoch_ = dataset_->plan(0).steps();
    if (settings.rank == 0) eval_sets_ = decode_held_out();
  }

  int64_t channels() const override { return dataset_->channels(); }
  int64_t training_images() const override { return dataset_->training_images(); }
  int64_t steps_per_epoch() const override { return steps_per_epoch_; }
  int64_t global_batch() const override { return dataset_->plan_options().global_batch; }
  uint64_t data_hash() const override { return dataset_->manifest().hash(); }
  data::EpochPlan plan(int64_t epoch) const override { return dataset_->plan(epoch); }
  int64_t unreadable() const override { return dataset_->unreadable(); }
  void set_end_step(int64_t end) override { end_step_ = end; }

  // The whole table: a size no training batch has still serves `lockstep eval` on other folders.
  std::vector<data::BucketSize> image_sizes() const override { return dataset_->table(); }

  StepBatch batch(int64_t step) override {
    const int64_t epoch = step / steps_per_epoch_, in_epoch = step % steps_per_epoch_;
    if (!loader_ || loader_->epoch() != epoch || loader_->next_step() != in_epoch || loader_->done()) {
      start_loader(epoch, in_epoch);
    }
    const double waited_before = loader_->waited_seconds();
    data::FolderBatch b = loader_->next();
    StepBatch out;
    out.images = data::images_to_tensor(data::image_set_from_images(b.images, dataset_->channels()), 0,
                                        static_cast<int64_t>(b.images.size()));
    out.replaced = b.replaced;
    out.waited_s = loader_->waited_seconds() - waited_before;
    // The next epoch's first steps decode while this, its predecessor's last step, trains.
    if (loader_->done() && (epoch + 1) * steps_per_epoch_ < end_step_) start_loader(epoch + 1, 0);
    return out;
  }

  const std::vector<data::ImageSet>& evaluation_images() const override {
    LOCKSTEP_THROW_IF_NOT(!eval_sets_.empty(), InvalidArgument,
                          "image folder: evaluation images are decoded on rank 0 only, which evaluates");
    return eval_sets_;
  }

  std::string describe() const override {
    const auto& m = dataset_->manifest();
    std::string buckets;
    for (size_t b = 0; b < dataset_->table().size(); ++b) {
      const auto n = dataset_->buckets()[b].size();
      if (n == 0) continue;
      buckets += detail::concat(buckets.empty() ? "" : ", ", dataset_->table()[b].width, "x",
                                dataset_->table()[b].height, ": ", n);
    }
    const auto& table = dataset_->table();
    for (const auto& merge : dataset_->merged()) {
      const auto& from = table[static_cast<size_t>(merge.from)];
      const auto& to = table[static_cast<size_t>(merge.to)];
      buckets += detail::concat("; the ", merge.images, " images of ", from.width, "x", from.height, " join ", to.width,
                                "x", to.height, " (too few for one global batch)");
    }
    return detail::concat(
        "image folder ", m.root, ": ", dataset_->training_images(), " training images, ", settings_.eval_note, ", ",
        unreadable(), " unreadable",
        unreadable() > 0 ? detail::concat(" (", first_errors(m, 3), "; all in ", settings_.manifest_file, ")") : "",
        "; buckets ", buckets, "; ", steps_per_epoch_, " steps per epoch");
  }

 private:
  void start_loader(int64_t epoch, int64_t first_step) {
    loader_.reset();  // its workers stop before the next loader's start
    loader_ = std::make_unique<data::PrefetchLoader>(*dataset_, epoch, first_step, settings_.world_size, settings_.rank,
                                                     settings_.workers, settings_.prefetch,
                                                     /*end_step=*/end_step_ - epoch * steps_per_epoch_);
  }

  // The held-out images, decoded once, each fitted to the bucket its aspect ratio trains in (where
  // a merged bucket's images went): one image set per bucket.
  std::vector<data::ImageSet> decode_held_out() const {
    std::vector<data::ImageSet> sets;
    const auto placed = dataset_->place(held_out_);
    for (size_t b = 0; b < placed.size(); ++b) {
      std::vector<io::Image> images;
      for (int64_t id : placed[b]) {
        images.push_back(data::load_fitted(dataset_->manifest(), id, dataset_->table()[b], dataset_->channels()));
      }
      if (!images.empty()) sets.push_back(data::image_set_from_images(images, dataset_->channels()));
    }
    return sets;
  }

  FolderSettings settings_;
  std::vector<int64_t> held_out_;
  std::vector<data::ImageSet> eval_sets_;
  std::unique_ptr<data::FolderDataset> dataset_;
  int64_t steps_per_epoch_ = 0;
  int64_t end_step_ = INT64_MAX / 2;              // no end until set_end_step (halved: epoch arithmetic stays in range)
  std::unique_ptr<data::PrefetchLoader> loader_;  // after dataset_, which it reads: destroyed first
};

// Scans `root`, reusing the entries of `cached` whose size and time are unchanged, and reports
// progress every few seconds.
data::Manifest scan_with_progress(const std::string& root, const data::Manifest* cached,
                                  const std::function<void(const std::string&)>& on_info) {
  using Clock = std::chrono::steady_clock;
  auto last = Clock::now();
  return data::scan_image_folder(root, cached, [&](int64_t done, int64_t total) {
    if (!on_info || done == total || Clock::now() - last < std::chrono::seconds(3)) return;
    last = Clock::now();
    on_info(detail::concat("scanning ", root, ": ", done, " of ", total, " image files"));
  });
}

// The run's global batch: train.batch_size, unless it was left at its default but is more than any
// bucket of the folder holds; then the global batch becomes the fullest bucket's count (a multiple of train.grad_accum
// times train.shard_size, at least one shard per rank in each micro-batch), and the smaller buckets join their nearest
// full one as usual. A batch size the user gave keeps FolderDataset's error, as does a folder too small for the ranks.
int64_t fit_default_batch(const TrainSettings& train, const data::Manifest& manifest,
                          const std::vector<data::BucketSize>& table, const std::vector<int64_t>& excluded,
                          const DataContext& context) {
  const StepGeometry step = StepGeometry::of(train);
  const int64_t batch = step.global_batch;
  if (!context.batch_size_is_default) return batch;
  std::vector<int64_t> counts;
  for (const auto& members : data::training_buckets(manifest, table, excluded)) {
    counts.push_back(static_cast<int64_t>(members.size()));
  }
  const auto fullest = static_cast<size_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
  // Whole micro-batches of whole shards (train.shard_size), at least one shard per rank in each.
  const int64_t whole = step.micro_batches * step.unit();
  const int64_t fits = counts[fullest] / whole * whole;
  if (counts[fullest] >= batch || fits / whole < context.world_size) return batch;
  if (context.rank == 0 && context.on_info) {
    int64_t images = 0;
    for (int64_t n : counts) images += n;
    context.on_info(detail::concat(
        "train.batch_size: the default global batch of ", batch, " is more than any bucket of ", manifest.root,
        " holds (the fullest, ", table[fullest].width, "x", table[fullest].height, ", holds ", counts[fullest],
        " of the ", images, " training images), so this run trains with a global batch of ", fits,
        "; the other buckets' images join their nearest full bucket. Set --batch-size to choose"));
  }
  return fits;
}

}  // namespace

std::unique_ptr<TrainData> open_image_folder(const RunSettings& settings, const DataContext& context) {
  const DataSettings& d = settings.data;
  const std::string root = d.dir();
  const auto channels = static_cast<int>(d.channels());
  LOCKSTEP_CHECK_ARG(channels == 1 || channels == 3, "data.channels = ", channels, " must be 1 (gray) or 3 (RGB)");
  const std::vector<data::BucketSize> table = data::parse_bucket_table(d.buckets());
  data::check_bucket_table(table, 1);  // positive sides, distinct aspect ratios (the model checks the rest)

  // The run's manifest: written when it starts, the cache of every later scan, and on resume the
  // record of the data the run trained on, which the folder must still match exactly.
  const std::string saved_path = manifest_path(context.run_dir);
  std::unique_ptr<data::Manifest> saved;
  if (context.resuming) {
    LOCKSTEP_THROW_IF_NOT(fs::exists(saved_path), IoError, "cannot resume ", context.run_dir,
                          ": it trained on an image folder but has no ", saved_path);
    saved = std::make_unique<data::Manifest>(data::load_manifest(saved_path));
  }
  data::Manifest manifest = scan_with_progress(root, saved.get(), context.on_info);
  if (saved) {
    const std::string changes = data::describe_changes(*saved, manifest);
    LOCKSTEP_THROW_IF_NOT(changes.empty() && saved->hash() == manifest.hash(), CorruptInput, "cannot resume ",
                          context.run_dir, " exactly: image folder ", root, " changed since the run started: ", changes,
                          " (the run's manifest is ", saved_path, ")");
  } else if (context.rank == 0) {
    data::save_manifest(saved_path, manifest);
  }
  LOCKSTEP_CHECK_ARG(!manifest.entries.empty(), "image folder ", root, " holds no image files (looked for ",
                     ".png .jpg .jpeg .webp .tif .tiff .bmp .pgm .ppm .pnm below it)");
  const int64_t readable = manifest.readable_count();
  LOCKSTEP_CHECK_ARG(readable > 0, "image folder ", root, ": none of its ", manifest.entries.size(),
                     " image files can be decoded (the errors are in ", saved_path, ")");
  FolderSettings s;
  s.split = run_folder_split(d, manifest);
  s.eval_note = describe_eval_images(d, readable);
  s.rank = context.rank;
  s.world_size = context.world_size;
  s.workers = static_cast<int>(d.workers());
  s.prefetch = static_cast<int>(d.prefetch());
  s.manifest_file = saved_path;
  s.augmentation.flip = d.random_flip();
  s.augmentation.max_zoom = d.random_zoom();
  data::PlanOptions plan = plan_options(settings);
  plan.global_batch = fit_default_batch(settings.train, manifest, table, s.split.excluded, context);
  return std::make_unique<FolderData>(std::move(manifest), table, channels, plan, s);
}

}  // namespace lockstep::train
