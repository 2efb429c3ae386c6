// Where a collective is issued from: a short tag plus the source location, so that a mismatch
// between ranks can name both call sites. Build one with LOCKSTEP_CALL_SITE("tag"). It lives in
// core because quantizers name their own call sites without knowing about process groups.
#pragma once

#include <string>

namespace lockstep {

struct CallSite {
  const char* tag = "";  // must outlive the call it names (a literal, or a string the caller holds)
  const char* file = "";
  int line = 0;
  std::string to_string() const;  // "tag (file:line)"
};

}  // namespace lockstep

#define LOCKSTEP_CALL_SITE(tag) (::lockstep::CallSite{(tag), __FILE__, __LINE__})
