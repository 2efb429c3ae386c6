#include "folder_input.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "lockstep/core/error.h"
#include "lockstep/data/batch.h"
#include "lockstep/data/folder_loader.h"
#include "lockstep/data/image_set.h"
#include "lockstep/train/run_dir.h"

namespace lockstep::cli {
namespace fs = std::filesystem;

bool is_image_folder(const std::string& dir) {
  return fs::is_directory(dir) && !fs::exists(data::fashion_mnist_images_path(dir, data::Split::Train));
}

int64_t FolderInput::images() const {
  int64_t n = 0;
  for (const auto& b : buckets) n += static_cast<int64_t>(b.size());
  return n;
}

FolderInput open_folder_input(const train::TrainedModel& model, const std::string& checkpoint_or_run_dir,
                              const std::string& dir, FolderSelection selection, int64_t limit) {
  FolderInput in;
  std::unique_ptr<data::Manifest> cache;
  if (fs::is_directory(checkpoint_or_run_dir) && fs::exists(train::manifest_path(checkpoint_or_run_dir))) {
    cache = std::make_unique<data::Manifest>(data::load_manifest(train::manifest_path(checkpoint_or_run_dir)));
  }
  in.manifest = data::scan_image_folder(dir, cache.get());
  LOCKSTEP_CHECK_ARG(in.manifest.readable_count() > 0, "image folder ", dir, " holds no readable image (",
                     in.manifest.entries.size(), " image files listed)");
  in.table = data::parse_bucket_table(model.config.get_string("data.buckets"));

  std::set<int64_t> held;
  if (selection != FolderSelection::All) {
    const auto ids = data::held_out_entries(in.manifest, model.config.get_int("data.eval_images"));
    held.insert(ids.begin(), ids.end());
  }
  std::set<int64_t> chosen;  // the first `limit` selected entries, in path order
  for (size_t i = 0; i < in.manifest.entries.size(); ++i) {
    const auto id = static_cast<int64_t>(i);
    if (!in.manifest.entries[i].readable()) continue;
    if (selection == FolderSelection::HeldOut && !held.count(id)) continue;
    if (selection == FolderSelection::Training && held.count(id)) continue;
    if (limit > 0 && static_cast<int64_t>(chosen.size()) >= limit) break;
    chosen.insert(id);
  }
  in.buckets = data::assign_buckets(in.manifest, in.table);
  for (auto& members : in.buckets) {
    members.erase(std::remove_if(members.begin(), members.end(), [&](int64_t id) { return !chosen.count(id); }),
                  members.end());
  }
  return in;
}

void for_each_batch(const FolderInput& input, int channels, int64_t batch, const BatchFn& fn) {
  for (size_t b = 0; b < input.buckets.size(); ++b) {
    const auto& members = input.buckets[b];
    for (size_t first = 0; first < members.size(); first += static_cast<size_t>(batch)) {
      const std::vector<int64_t> ids(members.begin() + first,
                                     members.begin() + std::min(members.size(), first + static_cast<size_t>(batch)));
      std::vector<io::Image> images;
      for (int64_t id : ids) images.push_back(data::load_fitted(input.manifest, id, input.table[b], channels));
      const data::ImageSet set = data::image_set_from_images(images, channels);
      fn(b, ids, data::images_to_tensor(set, 0, set.count));
    }
  }
}

}  // namespace lockstep::cli
