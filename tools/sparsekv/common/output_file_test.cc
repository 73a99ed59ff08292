#include "tools/sparsekv/common/output_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace sparsekv::tools {
namespace {

std::string Read(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(OutputFileTest, CheckAcceptsAWritablePathAndLeavesNothingBehind) {
  const std::string path = ::testing::TempDir() + "sparsekv_output_file_new.txt";
  std::remove(path.c_str());
  EXPECT_TRUE(CheckOutputPath("--json", path).ok());
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_TRUE(CheckOutputPath("--json", "").ok());  // not given
}

TEST(OutputFileTest, CheckKeepsAnExistingFile) {
  const std::string path = ::testing::TempDir() + "sparsekv_output_file_old.txt";
  std::ofstream(path) << "old";
  EXPECT_TRUE(CheckOutputPath("--json", path).ok());
  EXPECT_EQ(Read(path), "old");
}

TEST(OutputFileTest, CheckNamesTheOptionAndTheReason) {
  const Status missing_dir = CheckOutputPath("--csv", "/nonexistent-dir/x.csv");
  EXPECT_EQ(missing_dir.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing_dir.message(),
            "--csv: cannot open '/nonexistent-dir/x.csv' for writing: No such file or directory");
  EXPECT_FALSE(CheckOutputPath("--json", ::testing::TempDir()).ok());  // a directory
}

TEST(OutputFileTest, WriteReplacesTheFileAndReportsFailures) {
  const std::string path = ::testing::TempDir() + "sparsekv_output_file_write.txt";
  std::ofstream(path) << "a longer old text";
  ASSERT_TRUE(WriteOutputFile(path, "new", "JSON").ok());
  EXPECT_EQ(Read(path), "new");
  const Status s = WriteOutputFile("/nonexistent-dir/x.json", "{}", "JSON");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("cannot write JSON to '/nonexistent-dir/x.json'"), std::string::npos);
  if (std::ifstream("/dev/full").good()) {
    const Status full = WriteOutputFile("/dev/full", std::string(1 << 16, 'x'), "JSON");
    EXPECT_FALSE(full.ok());
  }
}

}  // namespace
}  // namespace sparsekv::tools
