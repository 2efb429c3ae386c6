#include "folder_input.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "lockstep/core/error.h"
#include "lockstep/data/batch.h"
#include "lockstep/data/folder_loader.h"
#include "lockstep/data/image_set.h"
#include "lockstep/train/data_settings.h"
#include "lockstep/train/resolve_run.h"
#include "lockstep/train/run_dir.h"

namespace lockstep::cli {
namespace fs = std::filesystem;

bool is_image_folder(const std::string& dir) {
  train::DataSettings data;
  data.dir(dir);
  train::resolve_dataset(data);  // the trainer's choice for data.dataset = auto
  return data.dataset() == "folder";
}

int64_t FolderInput::images() const {
  int64_t n = 0;
  for (const auto& b : buckets) n += static_cast<int64_t>(b.size());
  return n;
}

FolderInput open_folder_input(const train::TrainedModel& model, const std::string& checkpoint_or_run_dir,
                              const std::string& dir, FolderSelection selection, int64_t limit) {
  const train::RunSettings& run = model.settings;
  LOCKSTEP_CHECK_ARG(fs::is_directory(dir), "image folder ", dir, " is not a directory",
                     dir == run.data.dir() ? " (it is where this run trained: pass --data with where the "
                                             "images are now)"
                                           : "");
  const int channels = static_cast<int>(model.model->options().in_channels());
  FolderInput in;
  in.table = data::parse_bucket_table(run.data.buckets());
  data::check_bucket_table(in.table, model.model->options().downsampling());

  // The run's manifest (when the run directory is at hand): the images it trained and held out.
  std::unique_ptr<data::Manifest> run_manifest;
  const std::string saved = fs::is_directory(checkpoint_or_run_dir) ? train::manifest_path(checkpoint_or_run_dir) : "";
  if (!saved.empty() && fs::exists(saved)) run_manifest = std::make_unique<data::Manifest>(data::load_manifest(saved));
  const bool same_folder =
      run_manifest && fs::exists(run_manifest->root) && fs::exists(dir) && fs::equivalent(run_manifest->root, dir);
  if (selection != FolderSelection::All && run_manifest) {
    in.manifest = *run_manifest;  // as it trained, even if files were added since
    in.manifest.root = dir;
  } else {
    in.manifest = data::scan_image_folder(dir, same_folder ? run_manifest.get() : nullptr);
  }
  LOCKSTEP_CHECK_ARG(in.manifest.readable_count() > 0, "image folder ", dir, " holds no readable image (",
                     in.manifest.entries.size(), " image files listed)");

  // Images go to the bucket their aspect ratio trained in (after the run merged its small ones).
  std::vector<int64_t> bucket_map(in.table.size());
  for (size_t b = 0; b < bucket_map.size(); ++b) bucket_map[b] = static_cast<int64_t>(b);
  std::unique_ptr<data::FolderDataset> run_data;
  data::FolderSplit split;  // of the run's folder
  if (run_manifest || selection != FolderSelection::All) {
    const data::Manifest& trained = run_manifest ? *run_manifest : in.manifest;
    split = train::run_folder_split(run.data, trained);
    run_data =
        std::make_unique<data::FolderDataset>(trained, in.table, channels, train::plan_options(run), split.excluded);
    bucket_map = run_data->bucket_map();
  }

  std::vector<std::vector<int64_t>> chosen(in.table.size());
  if (selection == FolderSelection::Training) {
    chosen = run_data->buckets();
  } else if (selection == FolderSelection::HeldOut) {
    chosen = run_data->place(split.held_out);  // in.manifest is the run's here
  } else {
    const auto assigned = data::assign_buckets(in.manifest, in.table);
    for (size_t b = 0; b < assigned.size(); ++b) {
      auto& into = chosen[static_cast<size_t>(bucket_map[b])];
      into.insert(into.end(), assigned[b].begin(), assigned[b].end());
    }
  }
  // `limit`: the first images in path order, wherever they are.
  std::vector<int64_t> all;
  for (const auto& ids : chosen) all.insert(all.end(), ids.begin(), ids.end());
  std::sort(all.begin(), all.end());
  const std::set<int64_t> kept(all.begin(),
                               limit > 0 && limit < static_cast<int64_t>(all.size()) ? all.begin() + limit : all.end());
  in.buckets.assign(in.table.size(), {});
  for (size_t b = 0; b < chosen.size(); ++b) {
    for (int64_t id : chosen[b]) {
      if (kept.count(id)) in.buckets[b].push_back(id);
    }
    std::sort(in.buckets[b].begin(), in.buckets[b].end());
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
