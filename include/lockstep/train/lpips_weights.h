// Reading the user's LPIPS-VGG weights (a safetensors file; docs/losses.md says how to make one).
#pragma once

#include <string>

#include "lockstep/model/lpips.h"

namespace lockstep::train {

// Throws IoError when `path` is missing, CorruptInput when it is not a safetensors file, and
// InvalidArgument (from model::LpipsImpl) when it holds another layout. `key` names the setting
// the path came from, for the messages.
model::Lpips load_lpips(const std::string& path, const std::string& key);

}  // namespace lockstep::train
