#include "lockstep/quant/registry.h"

#include "lockstep/core/error.h"
#include "lockstep/quant/fsq.h"

namespace lockstep::quant {

const std::vector<RegistryEntry>& quantizer_registry() {
  static const std::vector<RegistryEntry> entries = {
      {"fsq", "finite scalar quantization: per-dimension levels, no codebook to learn",
       [](const OptionReader& o) {
         return std::make_shared<Fsq>(FsqOptions(o.int_list("levels")));
       }},
  };
  return entries;
}

std::vector<std::string> quantizer_names() {
  std::vector<std::string> names;
  for (const auto& e : quantizer_registry()) names.push_back(e.name);
  return names;
}

const RegistryEntry& find_quantizer(const std::string& name) {
  std::string valid;
  for (const auto& e : quantizer_registry()) {
    if (e.name == name) return e;
    valid += (valid.empty() ? "" : ", ") + e.name;
  }
  throw InvalidArgument(detail::concat("unknown quantizer '", name, "'; valid: ", valid));
}

std::shared_ptr<Quantizer> make_quantizer(const std::string& name, const OptionReader& options) {
  return find_quantizer(name).make(options);
}

}  // namespace lockstep::quant
