// test/support/temp_dir.h: the temporary-directory fixture the CPU tests share. Each test gets a fresh, empty
// directory under the system temp dir, named after the process and the test (so parallel ctest runs never meet), and
// removed with everything in it when the test ends.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace llmc_test {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name)
      if (c == '/') c = '_';  // parameterised tests
    dir_ = (std::filesystem::temp_directory_path() / ("llm8_" + std::to_string(::getpid()) + "_" + name)).string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // dir_/name
  std::string path(const std::string& name) const { return (std::filesystem::path(dir_) / name).string(); }

  std::string dir_;
};

}  // namespace llmc_test
