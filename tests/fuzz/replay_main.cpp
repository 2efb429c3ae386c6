// Replays the committed fuzz corpus (tests/fuzz/corpus/TARGET) through each target's entry point
// in the ordinary build, so that `make test` (and CI's sanitizer build) keeps every input that
// once broke a parser fixed, without clang or libFuzzer:
//   lockstep_fuzz_replay TARGET FILE_OR_DIR...
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

// Each target's LLVMFuzzerTestOneInput, renamed when compiled into this program (tests/CMakeLists.txt).
#define LOCKSTEP_FUZZ_TARGETS(X) \
  X(fuzz_config_override)        \
  X(fuzz_config_toml)            \
  X(fuzz_idx)                    \
  X(fuzz_image_header)           \
  X(fuzz_manifest)               \
  X(fuzz_npy)                    \
  X(fuzz_safetensors)

#define LOCKSTEP_DECLARE(name) extern "C" int name##_entry(const uint8_t* data, size_t size);
LOCKSTEP_FUZZ_TARGETS(LOCKSTEP_DECLARE)

int main(int argc, char** argv) {
  using Entry = int (*)(const uint8_t*, size_t);
  std::map<std::string, Entry> entries;
#define LOCKSTEP_REGISTER(name) entries[#name] = &name##_entry;
  LOCKSTEP_FUZZ_TARGETS(LOCKSTEP_REGISTER)
  if (argc < 3 || !entries.count(argv[1])) {
    std::fprintf(stderr, "usage: lockstep_fuzz_replay TARGET FILE_OR_DIR... (TARGET: one of");
    for (const auto& [name, entry] : entries) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, ")\n");
    return 2;
  }
  std::vector<std::filesystem::path> files;
  for (int i = 2; i < argc; ++i) {
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[i])) files.push_back(e.path());
    } else {
      files.emplace_back(argv[i]);
    }
  }
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::printf("%s: %s (%zu bytes)\n", argv[1], file.filename().c_str(), bytes.size());
    std::fflush(stdout);  // a crash shows which input
    entries[argv[1]](reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%s: %zu inputs replayed, every property held\n", argv[1], files.size());
  return files.empty() ? 1 : 0;
}
