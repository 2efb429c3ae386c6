// The exceptions lockstep throws. The library never prints or exits: it throws one of these,
// with the values involved in the message, and the caller (the CLI) reports.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace lockstep {

// Base of every error lockstep throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed an option or argument that cannot work (bad value, impossible shape, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file or stream is malformed: truncated, wrong magic, inconsistent sizes, bad header.
class CorruptInput : public Error {
 public:
  using Error::Error;
};

// A file that should exist does not, or cannot be opened, read or written.
class IoError : public Error {
 public:
  using Error::Error;
};

// A condition lockstep itself guarantees does not hold: a bug in lockstep, not in the caller's
// input. Thrown by LOCKSTEP_ASSERT.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

// "a, b, c": for messages that list the valid choices.
inline std::string concat_list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}
}  // namespace detail

}  // namespace lockstep

// Throws `type(message)` when `cond` is false; the message is the remaining arguments streamed.
#define LOCKSTEP_THROW_IF_NOT(cond, type, ...)             \
  do {                                                     \
    if (!(cond)) {                                         \
      throw type(::lockstep::detail::concat(__VA_ARGS__)); \
    }                                                      \
  } while (0)

#define LOCKSTEP_CHECK_ARG(cond, ...) LOCKSTEP_THROW_IF_NOT(cond, ::lockstep::InvalidArgument, __VA_ARGS__)

// An invariant of lockstep's own (never the caller's input): InternalError naming where it broke.
#define LOCKSTEP_ASSERT(cond, ...)                                                                      \
  LOCKSTEP_THROW_IF_NOT(cond, ::lockstep::InternalError, "internal error at ", __FILE__, ":", __LINE__, \
                        " (a bug in lockstep; please report it): ", __VA_ARGS__)
