#include "lockstep/train/lpips_weights.h"

#include "lockstep/train/weights_file.h"

namespace lockstep::train {

model::Lpips load_lpips(const std::string& path, const std::string& key) {
  return model::Lpips(read_weights_file(path, key,
                                        "LPIPS needs the VGG16 and LPIPS weights as one safetensors file; "
                                        "docs/losses.md shows how to write it from the lpips package"),
                      key + " = " + path);
}

}  // namespace lockstep::train
