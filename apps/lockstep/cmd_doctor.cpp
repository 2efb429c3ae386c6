// `lockstep doctor`: what this machine is, how fast it multiplies and streams memory, and what to
// fix before training. It reports; it never fails because of what it finds.
#include <ATen/Parallel.h>
#include <strings.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "blas_env.h"
#include "cli_common.h"
#include "commands.h"
#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/core/machine.h"
#include "lockstep/core/threads.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/data/image_set.h"
#include "lockstep/dist/backends.h"
#include "lockstep/io/image_decode.h"
#include "lockstep/model/autoencoder.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::cli {
namespace {

struct DoctorOptions {
  int threads = 0;  // 0: one per logical core
  std::string data_dir = data::kFashionMnistDefaultDir;
  bool quick = false;
};

// Below this per-thread rate the BLAS is misconfigured: OpenBLAS on its Prescott kernels gives
// ~30 here, the right kernels 100-165, and any AVX2 core of the last decade exceeds 40.
constexpr double kMinSgemmGflopsPerThread = 40.0;
constexpr int64_t kSgemmN = 1024;
// Triad arrays far above the 260 MB L3 of this Xeon generation: 3 x 64M floats is 768 MB. Here
// 3 x 8M floats still ran at L3 speed (26 GB/s) and 3 x 16M at DRAM speed (13 GB/s).
constexpr int64_t kTriadElements = int64_t{64} << 20;
constexpr int64_t kTriadElementsQuick = int64_t{32} << 20;
// Seconds per measurement: a full run stays under ~5 s, --quick under ~1.5 s with the re-exec.
constexpr double kSgemmSeconds = 1.0, kSgemmSecondsQuick = 0.1;
constexpr double kTriadSeconds = 0.8, kTriadSecondsQuick = 0.1;

std::string with_threads(int n) { return " with " + std::to_string(n) + (n == 1 ? " thread" : " threads"); }

std::string cpu_features(const CpuInfo& cpu) {
  const std::pair<const char*, bool> flags[] = {{"avx2", cpu.avx2},
                                                {"fma", cpu.fma},
                                                {"avx512f", cpu.avx512f},
                                                {"avx512bw", cpu.avx512bw},
                                                {"avx512vl", cpu.avx512vl},
                                                {"avx512dq", cpu.avx512dq},
                                                {"avx512_bf16", cpu.avx512_bf16}};
  std::string have, lack;
  for (const auto& [name, on] : flags) {
    std::string& list = on ? have : lack;
    list += std::string(list.empty() ? "" : " ") + name;
  }
  if (have.empty()) have = "none of avx2/fma/avx512";
  return lack.empty() ? have : have + " (no " + lack + ")";
}

// Everything the doctor found out, gathered before anything is printed.
struct Findings {
  CpuInfo cpu;
  BlasInfo blas;
  std::string recommended_core;  // "" when OpenBLAS's own choice is fine
  std::string core_by_lockstep;  // the OPENBLAS_CORETYPE a re-exec set, else ""
  const char* core_env = nullptr;
  int threads = 1;
  bool threads_from_flag = false;
  double sgemm_gflops = 0;
  double triad_gbs = 0;
  data::FashionMnistStatus data;
  std::string data_error;     // the files are there but cannot be read: what is wrong
  std::string data_unusable;  // read, but training with the defaults refuses them: why
  int64_t train_images = 0, test_images = 0;
  // --data names a directory without Fashion-MNIST: what an image-folder run would find there.
  int64_t folder_files = 0, folder_readable = 0;
  std::string folder_error;
  // Not a directory to look in (a file, a FIFO, a loop of links): what it is; "" for a directory or
  // a path that does not exist (Fashion-MNIST is then plainly missing).
  std::string data_not_a_directory;
  dist::BackendReport backends;
};

// What `lockstep train --data DIR` with the default settings would refuse in readable files, in the
// trainer's words: test images of another size, sides the default model cannot halve, too few images.
std::string default_training_refuses(const data::ImageSet& train, const data::ImageSet& test) {
  const train::RunSettings defaults;
  if (test.width != train.width || test.height != train.height) {
    return detail::concat("its test images are ", test.width, "x", test.height, " but its training images ",
                          train.width, "x", train.height);
  }
  const auto& channels = defaults.model.channels();
  const int64_t factor = model::AutoencoderOptions(train.channels, channels).downsampling();
  if (train.width % factor != 0 || train.height % factor != 0) {
    return detail::concat("training images of ", train.width, "x", train.height, " cannot pass through the model's ",
                          channels.size(), " levels: each side must be a multiple of ", factor,
                          " (use fewer model.channels entries)");
  }
  const int64_t batch = defaults.train.batch_size();
  if (batch > train.count) {
    return detail::concat("train.batch_size = ", batch, " exceeds the ", train.count, " training images");
  }
  return "";
}

// What `path` is when it exists and is no directory to look in: "a FIFO", "a file", ...; "" otherwise.
std::string not_a_directory(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec.value() == ELOOP) return "a loop of symbolic links";
  if (ec || status.type() == fs::file_type::not_found || status.type() == fs::file_type::directory) return "";
  switch (status.type()) {
    case fs::file_type::regular:
      return "a file";
    case fs::file_type::fifo:
      return "a FIFO";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::block:
    case fs::file_type::character:
      return "a device";
    default:
      return "not a directory";
  }
}

Findings examine(const DoctorOptions& opt) {
  Findings f;
  f.cpu = detect_cpu();
  f.threads = opt.threads > 0 ? choose_threads(opt.threads).threads : f.cpu.logical_cores;
  f.threads_from_flag = opt.threads > 0;
  at::set_num_threads(f.threads);
  // Measure before asking the BLAS its thread count: OpenMP OpenBLAS adopts it at its next call.
  f.sgemm_gflops = measure_sgemm_gflops(kSgemmN, opt.quick ? kSgemmSecondsQuick : kSgemmSeconds);
  f.triad_gbs = measure_triad_bandwidth_gbs(opt.quick ? kTriadElementsQuick : kTriadElements,
                                            opt.quick ? kTriadSecondsQuick : kTriadSeconds);
  f.blas = detect_blas();
  f.recommended_core = recommended_openblas_coretype(f.cpu);
  f.core_by_lockstep = coretype_set_by_lockstep();
  f.core_env = std::getenv(kCoretypeEnv);
  f.backends = dist::report_backends();
  f.data = data::locate_fashion_mnist(opt.data_dir);
  f.data_not_a_directory = not_a_directory(opt.data_dir);
  if (f.data.found) {
    // Opened and checked as training would (headers, sizes, labels), not only looked for.
    try {
      const data::ImageSet train = data::load_fashion_mnist(opt.data_dir, data::Split::Train);
      const data::ImageSet test = data::load_fashion_mnist(opt.data_dir, data::Split::Test);
      f.train_images = train.count;
      f.test_images = test.count;
      f.data_unusable = default_training_refuses(train, test);
    } catch (const std::exception& e) {
      f.data_error = e.what();
    }
  } else if (std::error_code ec; f.data_not_a_directory.empty() && std::filesystem::is_directory(opt.data_dir, ec)) {
    try {  // the scan `lockstep train --data DIR` makes (headers only)
      const data::Manifest m = data::scan_image_folder(opt.data_dir);
      f.folder_files = static_cast<int64_t>(m.entries.size());
      f.folder_readable = m.readable_count();
    } catch (const std::exception& e) {
      f.folder_error = e.what();
    }
  }
  return f;
}

std::vector<std::pair<std::string, std::string>> report_rows(const Findings& f) {
  const auto& cpu = f.cpu;
  const auto& blas = f.blas;
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("lockstep", LOCKSTEP_VERSION);
  const auto& b = f.backends;
  rows.emplace_back(
      "LibTorch", b.libtorch_version + (b.libtorch_origin == "system" ? " (the system's)"
                                                                      : " (PyPI wheel in " + b.libtorch_origin + ")"));
  rows.emplace_back("CUDA", b.cuda_built ? "built with CUDA " + b.cuda_version
                                         : "not built (this LibTorch has no CUDA, or LOCKSTEP_WITH_CUDA=OFF)");
  if (b.cuda_built) {
    rows.emplace_back("CUDA kernels", LOCKSTEP_HAVE_CUDA_KERNELS
                                          ? std::string("nearest-code search, FSQ, code statistics; built for ") +
                                                LOCKSTEP_CUDA_ARCHITECTURES
                                          : "not built (no nvcc at build time): CUDA tensors take torch operations");
    if (b.devices.empty()) rows.emplace_back("CUDA devices", "none: " + b.device_note);
    for (const auto& device : b.devices) rows.emplace_back("CUDA device", device);
  }
  rows.emplace_back("CPU", cpu.model_name + " (" + cpu.vendor + " family " + std::to_string(cpu.family) + " model " +
                               std::to_string(cpu.model) + ", " + std::to_string(cpu.logical_cores) +
                               " logical cores)");
  rows.emplace_back("CPU features", cpu_features(cpu));
  rows.emplace_back("BLAS library", blas.library_path.empty() ? "none found loaded" : blas.library_path);
  rows.emplace_back("BLAS vendor", blas.config.empty() ? blas.vendor : blas.vendor + " (" + blas.config + ")");
  if (blas.vendor == "OpenBLAS") {
    const std::string want = f.recommended_core;
    rows.emplace_back("BLAS core", blas.core + (want.empty() ? "" : " (recommended for this CPU: " + want + ")"));
    rows.emplace_back(kCoretypeEnv, !f.core_by_lockstep.empty()
                                        ? f.core_by_lockstep + " (set by lockstep, which re-executed itself)"
                                    : f.core_env ? std::string(f.core_env) + " (from the environment)"
                                                 : std::string("unset"));
  }
  rows.emplace_back("BLAS threads", blas.threads > 0 ? std::to_string(blas.threads) : "unknown");
  rows.emplace_back("intra-op threads", std::to_string(at::get_num_threads()) +
                                            (f.threads_from_flag ? " (--threads)" : " (one per logical core)"));
  rows.emplace_back("sgemm n=" + std::to_string(kSgemmN), fixed(f.sgemm_gflops, 1) + " GFLOP/s" +
                                                              with_threads(f.threads) + " (" +
                                                              fixed(f.sgemm_gflops / f.threads, 1) + " per thread)");
  rows.emplace_back("triad bandwidth", fixed(f.triad_gbs, 1) + " GB/s" + with_threads(f.threads));
  rows.emplace_back("Gloo transport",
                    b.gloo ? "built (CPU tensors between processes)" : "not built (install libgloo-dev, rebuild)");
  rows.emplace_back("NCCL transport", !b.nccl_built ? "not built (needs a LibTorch with CUDA: make LIBTORCH=pip)"
                                      : b.devices.empty()
                                          ? "built (NCCL " + b.nccl_version + "), unusable here: no CUDA device"
                                          : "built (NCCL " + b.nccl_version + "), usable on " +
                                                std::to_string(b.devices.size()) + " CUDA device(s)");
  const std::string decoder = io::image_decoder_version();
  rows.emplace_back("image folders", decoder.empty() ? "unavailable: built without OpenCV (install the packages "
                                                       "scripts/install-deps lists, rebuild)"
                                                     : "decoded with " + decoder);
  if (f.folder_files > 0) {
    rows.emplace_back("image folder", detail::concat(f.data.dir, ": ", f.folder_readable, " of ", f.folder_files,
                                                     " image files readable (`lockstep train --data ", f.data.dir,
                                                     "` trains on them)"));
  }
  rows.emplace_back("Fashion-MNIST",
                    !f.data_not_a_directory.empty() ? "not looked for: " + f.data.dir + " is " + f.data_not_a_directory
                    : !f.data.found                 ? "missing (" + std::to_string(f.data.missing_files.size()) +
                                          " of 4 files absent from " + f.data.dir + ")"
                    : !f.data_error.empty() ? "damaged in " + f.data.dir
                                            : "read from " + f.data.dir + " (" + std::to_string(f.train_images) +
                                                  " training and " + std::to_string(f.test_images) + " test images)" +
                                                  (f.data_unusable.empty() ? "" : ", refused by training: see below"));
  return rows;
}

std::vector<std::string> report_warnings(const Findings& f) {
  std::vector<std::string> warnings;
  const auto& blas = f.blas;
  if (blas.vendor == "reference") {
    warnings.push_back("BLAS is the reference implementation (~4 GFLOP/s): install libopenblas0-openmp");
  }
  if (blas.vendor == "OpenBLAS" && f.core_env && strcasecmp(f.core_env, blas.core.c_str()) != 0) {
    warnings.push_back(std::string("OPENBLAS_CORETYPE is ") + f.core_env + " but OpenBLAS runs its " + blas.core +
                       " kernels: this OpenBLAS does not know that name");
  } else if (blas.vendor == "OpenBLAS" && !f.core_env && !f.recommended_core.empty() &&
             strcasecmp(f.recommended_core.c_str(), blas.core.c_str()) != 0) {
    warnings.push_back("OpenBLAS chose its " + blas.core + " kernels; this CPU should use " + f.recommended_core +
                       ": export OPENBLAS_CORETYPE=" + f.recommended_core + " (or unset LOCKSTEP_NO_REEXEC)");
  }
  const double per_thread = f.sgemm_gflops / f.threads;
  if (!std::isfinite(per_thread) || per_thread < kMinSgemmGflopsPerThread) {
    warnings.push_back(
        "sgemm reached only " + fixed(per_thread, 1) +
        " GFLOP/s per thread; expected >= " + fixed(kMinSgemmGflopsPerThread, 0) + " on a modern x86-64 core: check " +
        (blas.vendor == "OpenBLAS" ? "OPENBLAS_CORETYPE" : "which BLAS is loaded") + " and that the machine is idle");
  }
  if (io::image_decoder_version().empty()) {
    warnings.push_back(
        "this build cannot decode images, so `lockstep train --data FOLDER` is unavailable: "
        "install libopencv-imgcodecs-dev and libopencv-imgproc-dev (scripts/install-deps) and rebuild");
  }
  if (f.data.found && !f.data_error.empty()) {
    warnings.push_back("Fashion-MNIST in " + f.data.dir + " cannot be read: " + f.data_error +
                       " (reinstall it: apt-get install --reinstall dataset-fashion-mnist)");
  }
  if (f.data.found && f.data_error.empty() && !f.data_unusable.empty()) {
    warnings.push_back("Fashion-MNIST in " + f.data.dir +
                       " is readable, but `lockstep train` with the default "
                       "settings refuses it: " +
                       f.data_unusable);
  }
  if (f.folder_files > 0 && f.folder_readable == 0) {
    warnings.push_back(detail::concat("none of the ", f.folder_files, " image files in ", f.data.dir,
                                      " can be decoded: `lockstep train --data ", f.data.dir, "` would refuse it"));
  }
  if (!f.folder_error.empty()) warnings.push_back(f.data.dir + " cannot be scanned: " + f.folder_error);
  std::error_code ec;
  if (!f.data_not_a_directory.empty()) {
    warnings.push_back(f.data.dir + " is " + f.data_not_a_directory +
                       ", not a directory: pass --data the directory that holds Fashion-MNIST's files or your images");
  } else if (!f.data.found && f.folder_files == 0 && f.folder_error.empty() &&
             std::filesystem::is_directory(f.data.dir, ec)) {
    warnings.push_back(f.data.dir +
                       " holds neither Fashion-MNIST's 4 files nor an image file: install "
                       "Fashion-MNIST with `apt-get install dataset-fashion-mnist` (or scripts/install-deps), "
                       "or pass --data the directory of your images");
  } else if (!f.data.found && f.folder_files == 0 && f.folder_error.empty()) {
    warnings.push_back("Fashion-MNIST is missing from " + f.data.dir +
                       ": install it with `apt-get install dataset-fashion-mnist` (or scripts/install-deps), "
                       "or pass --data DIR");
  }
  return warnings;
}

int run_doctor(const DoctorOptions& opt) {
  const Findings findings = examine(opt);
  const auto rows = report_rows(findings);
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  for (const auto& [label, value] : rows) {
    std::cout << std::left << std::setw(static_cast<int>(width) + 2) << label << value << "\n";
  }
  const auto warnings = report_warnings(findings);
  for (const auto& w : warnings) std::cout << "WARNING: " << w << "\n";
  if (warnings.empty()) std::cout << "no problems found\n";
  std::cout.flush();
  return kExitOk;  // the doctor reports; warnings are not failures
}

}  // namespace

void add_doctor_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<DoctorOptions>();
  auto* cmd = app.add_subcommand(
      "doctor",
      "Check this machine and print, one item per line: lockstep and LibTorch versions, CPU model and "
      "features, the BLAS in use (library, vendor, OpenBLAS core type, threads), measured sgemm "
      "GFLOP/s and memory (triad) GB/s, CUDA (built with, devices visible), the transports between "
      "ranks (Gloo, NCCL and its version) and where Fashion-MNIST is; then warnings. Exits 0 even "
      "when it warns.");
  cmd->add_option("--threads", opt->threads, "Intra-op threads to measure with (default: one per logical core)")
      ->check(kPositiveInt);
  cmd->add_option("--data", opt->data_dir,
                  "Directory to look for Fashion-MNIST in; without it, the image folder to scan as training would")
      ->capture_default_str()
      ->check(kNonEmptyPath);
  cmd->add_flag("--quick", opt->quick, "Shorter measurements (about 1 s in all instead of 3-5)");
  cmd->callback([&run, opt] { run = [opt] { return run_doctor(*opt); }; });
}

}  // namespace lockstep::cli
