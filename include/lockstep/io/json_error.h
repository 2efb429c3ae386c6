// nlohmann's exceptions as a person reads them: the text without the "[json.exception.parse_error.101] "
// tag, which names the library's internals and says nothing about the file.
#pragma once

#include <exception>
#include <string>

namespace lockstep::io {

inline std::string json_error_text(const std::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const auto close = text.find("] ");
    if (close != std::string::npos) text.erase(0, close + 2);
  }
  return text;
}

}  // namespace lockstep::io
