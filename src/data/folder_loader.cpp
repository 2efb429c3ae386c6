#include "lockstep/data/folder_loader.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "lockstep/core/error.h"
#include "lockstep/core/random.h"
#include "lockstep/io/image_decode.h"

namespace lockstep::data {
namespace {

// `buckets` less the entries in `excluded`.
std::vector<std::vector<int64_t>> without(std::vector<std::vector<int64_t>> buckets,
                                          const std::vector<int64_t>& excluded) {
  const std::set<int64_t> skip(excluded.begin(), excluded.end());
  for (auto& members : buckets) {
    members.erase(std::remove_if(members.begin(), members.end(), [&](int64_t id) { return skip.count(id) > 0; }),
                  members.end());
  }
  return buckets;
}
constexpr uint64_t kReplacement = +SeedPurpose::Replacement;
constexpr uint64_t kAugmentation = +SeedPurpose::Augmentation;

double uniform(SplitMix64& rng) { return static_cast<double>(rng.next() >> 11) * 0x1p-53; }
constexpr int kMaxReplacementTries = 16;
}  // namespace

FitPlacement Augmentation::draw(uint64_t seed, int64_t epoch, int64_t step, int64_t slot) const {
  SplitMix64 rng(derive_seed(seed, static_cast<uint64_t>(epoch * 1000003 + step),
                             kAugmentation * 1000003 + static_cast<uint64_t>(slot)));
  FitPlacement p;
  if (max_zoom > 1) {
    p.zoom = 1 + (max_zoom - 1) * uniform(rng);
    p.x = uniform(rng);
    p.y = uniform(rng);
  }
  if (flip) p.flip = rng.next() >> 63;
  return p;
}

FolderDataset::FolderDataset(Manifest manifest, std::vector<BucketSize> table, int channels, PlanOptions plan,
                             const std::vector<int64_t>& excluded, Augmentation augmentation)
    : manifest_(std::move(manifest)),
      table_(std::move(table)),
      channels_(channels),
      plan_options_(plan),
      augmentation_(augmentation) {
  LOCKSTEP_CHECK_ARG(augmentation_.max_zoom >= 1 && augmentation_.max_zoom <= 16, "image folder: the largest zoom, ",
                     augmentation_.max_zoom, ", must lie in [1, 16]");
  LOCKSTEP_CHECK_ARG(channels_ == 1 || channels_ == 3, "image folder: channels = ", channels_, " must be 1 or 3");
  LOCKSTEP_CHECK_ARG(manifest_.readable_count() > 0, "image folder ", manifest_.root, " holds no readable image (",
                     manifest_.entries.size(), " image files listed, none decodable)");
  LOCKSTEP_CHECK_ARG(!table_.empty(), "the bucket table is empty");
  // Every readable entry's bucket, the excluded ones' too (place() puts held-out images in theirs).
  const auto all = assign_buckets(manifest_, table_);
  table_bucket_.assign(manifest_.entries.size(), -1);
  for (size_t b = 0; b < all.size(); ++b) {
    for (int64_t id : all[b]) table_bucket_[static_cast<size_t>(id)] = static_cast<int64_t>(b);
  }
  buckets_ = without(all, excluded);
  merge_small_buckets();
  (void)EpochPlan(buckets_, plan_options_, 0);  // cannot fail now; a last check of the plan's rules

  auto trains = [&](size_t b) { return !buckets_[b].empty(); };
  for (size_t b = 0; b < table_.size(); ++b) {
    bucket_map_.push_back(trains(b) ? static_cast<int64_t>(b)
                                    : nearest_bucket(table_, table_[b].width, table_[b].height, trains));
  }
}

std::vector<std::vector<int64_t>> FolderDataset::place(const std::vector<int64_t>& ids) const {
  std::vector<std::vector<int64_t>> out(table_.size());
  for (int64_t id : ids) {
    LOCKSTEP_CHECK_ARG(id >= 0 && id < static_cast<int64_t>(table_bucket_.size()) && table_bucket_[id] >= 0,
                       "image folder: entry ", id, " is not a readable image of the manifest");
    out[static_cast<size_t>(bucket_map_[static_cast<size_t>(table_bucket_[id])])].push_back(id);
  }
  return out;
}

std::vector<std::vector<int64_t>> training_buckets(const Manifest& manifest, const std::vector<BucketSize>& table,
                                                   const std::vector<int64_t>& excluded) {
  return without(assign_buckets(manifest, table), excluded);
}

FolderSplit split_folder(const Manifest& manifest, int64_t eval_images, int64_t train_subset) {
  FolderSplit split;
  split.held_out = held_out_entries(manifest, eval_images);
  split.excluded = split.held_out;
  if (train_subset > 0) {
    const std::set<int64_t> held(split.held_out.begin(), split.held_out.end());
    int64_t kept = 0;
    for (size_t i = 0; i < manifest.entries.size(); ++i) {
      if (!manifest.entries[i].readable() || held.count(static_cast<int64_t>(i))) continue;
      if (++kept > train_subset) split.excluded.push_back(static_cast<int64_t>(i));
    }
  }
  return split;
}

void FolderDataset::merge_small_buckets() {
  const auto batch = static_cast<size_t>(plan_options_.global_batch);
  size_t largest = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].size() > buckets_[largest].size()) largest = b;
  }
  LOCKSTEP_CHECK_ARG(buckets_[largest].size() >= batch, "image folder ", manifest_.root, ": no bucket can fill ",
                     "one global batch of ", batch, " images; the fullest, ", table_[largest].width, "x",
                     table_[largest].height, ", holds ", buckets_[largest].size(), " of the ", training_images(),
                     " training images; lower the global batch or add images");
  // A bucket that cannot fill one global batch gives its images to the full bucket nearest its
  // aspect ratio, where they are fitted like that bucket's own.
  auto full = [&](size_t c) { return buckets_[c].size() >= batch; };
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].empty() || full(b)) continue;
    const auto target = static_cast<size_t>(nearest_bucket(table_, table_[b].width, table_[b].height, full));
    merged_.push_back(
        {static_cast<int64_t>(b), static_cast<int64_t>(target), static_cast<int64_t>(buckets_[b].size())});
    buckets_[target].insert(buckets_[target].end(), buckets_[b].begin(), buckets_[b].end());
    std::sort(buckets_[target].begin(), buckets_[target].end());
    buckets_[b].clear();
  }
}

io::Image load_fitted(const Manifest& manifest, int64_t id, BucketSize size, int channels,
                      const FitPlacement& placement) {
  const auto& entry = manifest.entries.at(static_cast<size_t>(id));
  return fit_to_bucket(io::decode_image((std::filesystem::path(manifest.root) / entry.path).string(), channels), size,
                       placement);
}

int64_t FolderDataset::training_images() const {
  int64_t n = 0;
  for (const auto& members : buckets_) n += static_cast<int64_t>(members.size());
  return n;
}

FolderBatch FolderDataset::load(const EpochPlan& plan, int64_t epoch, int64_t step, int world_size, int rank) const {
  FolderBatch out;
  out.epoch = epoch;
  out.step = step;
  out.bucket = plan.batch(step).bucket;
  out.size = table_[static_cast<size_t>(out.bucket)];
  const auto& members = buckets_[static_cast<size_t>(out.bucket)];
  const std::vector<int64_t> mine = plan.rank_part(step, world_size, rank);
  // Each sample's slot in the global batch: replacements and augmentation depend on the slot.
  const std::vector<int64_t> slots = EpochPlan::rank_slots(plan_options_.global_batch, plan_options_.micro_batches,
                                                           world_size, rank, plan_options_.shard_size);
  for (size_t i = 0; i < mine.size(); ++i) {
    int64_t id = mine[i];
    const std::string& original = manifest_.entries[static_cast<size_t>(id)].path;
    SplitMix64 rng(derive_seed(plan_options_.seed, static_cast<uint64_t>(epoch * 1000003 + step),
                               kReplacement * 1000003 + static_cast<uint64_t>(slots[i])));
    // A replacement image takes the placement drawn for its slot.
    const FitPlacement placement =
        augmentation_.active() ? augmentation_.draw(plan_options_.seed, epoch, step, slots[i]) : FitPlacement{};
    for (int attempt = 0;; ++attempt) {
      try {
        out.images.push_back(load_fitted(manifest_, id, out.size, channels_, placement));
        break;
      } catch (const Error& e) {
        // Unreadable or undecodable files only: a bad bucket size is not the image's fault.
        if (!dynamic_cast<const CorruptInput*>(&e) && !dynamic_cast<const IoError*>(&e)) throw;
        LOCKSTEP_THROW_IF_NOT(attempt + 1 < kMaxReplacementTries, CorruptInput, "image folder ", manifest_.root, ": ",
                              original, " and ", attempt, " replacements drawn from its bucket could not be ",
                              "decoded (the folder changed since its manifest was built?); last: ", e.what());
        ++out.replaced;
        id = members[static_cast<size_t>(rng.below(members.size()))];
      }
    }
  }
  return out;
}

PrefetchLoader::PrefetchLoader(const FolderDataset& dataset, int64_t epoch, int64_t first_step, int world_size,
                               int rank, int threads, int depth, int64_t end_step)
    : dataset_(dataset),
      plan_(dataset.plan(epoch)),
      epoch_(epoch),
      world_size_(world_size),
      rank_(rank),
      depth_(depth),
      end_(end_step >= 0 ? std::min(end_step, plan_.steps()) : plan_.steps()),
      claimed_(first_step),
      next_(first_step) {
  LOCKSTEP_CHECK_ARG(threads >= 1 && depth >= 1, "loader: threads = ", threads, " and depth = ", depth,
                     " must be >= 1");
  LOCKSTEP_CHECK_ARG(first_step >= 0 && first_step <= end_, "loader: first step ", first_step, " outside the epoch's ",
                     end_, " steps to load");
  for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
}

PrefetchLoader::~PrefetchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& w : workers_) w.join();
}

void PrefetchLoader::work() {
  while (true) {
    int64_t step = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || error_ || claimed_ >= end_ || claimed_ < next_ + depth_; });
      if (stopping_ || error_ || claimed_ >= end_) return;
      step = claimed_++;
    }
    try {
      FolderBatch batch = dataset_.load(plan_, epoch_, step, world_size_, rank_);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(step, std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    changed_.notify_all();
  }
}

FolderBatch PrefetchLoader::next() {
  LOCKSTEP_THROW_IF_NOT(!done(), InvalidArgument, "loader: epoch ", epoch_, " has no step ", next_);
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return error_ || ready_.count(next_) > 0; });
  waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (error_) std::rethrow_exception(error_);
  FolderBatch batch = std::move(ready_.at(next_));
  ready_.erase(next_);
  ++next_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace lockstep::data
