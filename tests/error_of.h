// The message of the exception a piece of test code throws.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace lockstep::test_util {

// The message of the E that `f` throws; a test failure when it throws nothing.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace lockstep::test_util
