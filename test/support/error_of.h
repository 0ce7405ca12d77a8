// test/support/error_of.h: the text of the llmc::Error a callable throws, for the CPU tests that check error
// messages (that they name the key, the file and the fix).
//   error_of(f)        the message, or "" when f throws nothing (a test can then expect success with EXPECT_EQ)
//   thrown_error(f)    the message; the test fails when f throws nothing or an exception other than llmc::Error
#pragma once

#include <exception>
#include <string>

#include <gtest/gtest.h>

#include "llmc/core/common.h"

namespace llmc_test {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const llmc::Error& e) {
    return e.what();
  }
  return "";
}

template <class F>
std::string thrown_error(F&& f) {
  try {
    f();
  } catch (const llmc::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected an llmc::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an llmc::Error, none was thrown";
  return "";
}

}  // namespace llmc_test
