#include "lockstep/core/call_site.h"

#include "lockstep/core/error.h"

namespace lockstep {

std::string CallSite::to_string() const { return detail::concat(tag, " (", file, ":", line, ")"); }

}  // namespace lockstep
