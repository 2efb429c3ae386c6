// The image-folder loader alone: decode + resize + centre-crop through PrefetchLoader, and the
// manifest scan, in images per second, on JPEGs written at start-up (photographs' size: 640x480
// and 480x640).
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>

#include "lockstep/config_build.h"
#include "lockstep/data/folder_loader.h"

#if LOCKSTEP_HAVE_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

namespace {

const std::string& folder() {
  static const std::string root = [] {
    const std::string dir = (std::filesystem::temp_directory_path() / "lockstep_bench_loader").string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    cv::Mat noise(480, 640, CV_8UC3);
    for (int i = 0; i < 96; ++i) {
      cv::randu(noise, cv::Scalar::all(0), cv::Scalar::all(255));
      cv::GaussianBlur(noise, noise, cv::Size(0, 0), 3);  // photograph-like, compressible
      const cv::Mat img = i % 3 == 2 ? noise.t() : noise;
      cv::imwrite(dir + "/img" + std::to_string(i) + ".jpg", img);
    }
    return dir;
  }();
  return root;
}

// args: worker threads
void BM_FolderLoader(benchmark::State& state) {
  lockstep::data::PlanOptions plan;
  plan.global_batch = 16;
  const lockstep::data::FolderDataset data(lockstep::data::scan_image_folder(folder()),
                                           lockstep::data::default_bucket_table(), 3, plan);
  int64_t images = 0;
  double waited = 0;
  for (auto _ : state) {
    lockstep::data::PrefetchLoader loader(data, 0, 0, 1, 0, static_cast<int>(state.range(0)), 4);
    while (!loader.done()) images += static_cast<int64_t>(loader.next().images.size());
    waited += loader.waited_seconds();
  }
  state.counters["images"] = benchmark::Counter(static_cast<double>(images), benchmark::Counter::kIsRate);
  state.counters["waited_s"] = waited / static_cast<double>(state.iterations());
}
BENCHMARK(BM_FolderLoader)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The manifest: every image read and decoded once to learn its size. args: threads
void BM_ScanFolder(benchmark::State& state) {
  int64_t images = 0;
  for (auto _ : state) {
    images += static_cast<int64_t>(
        lockstep::data::scan_image_folder(folder(), nullptr, {}, static_cast<int>(state.range(0))).entries.size());
  }
  state.counters["images"] = benchmark::Counter(static_cast<double>(images), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ScanFolder)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
#endif
