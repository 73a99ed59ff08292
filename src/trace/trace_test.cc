// Tests of the top-k trace format: a round trip and the files it rejects.
#include "sparsekv/trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

namespace sparsekv {
namespace {

Trace SmallTrace() {
  Trace t;
  t.Resize(2, 3, 4);
  t.metadata = R"({"source": "test"})";
  for (size_t i = 0; i < t.seq_len.size(); ++i) t.seq_len[i] = 10 + static_cast<int32_t>(i);
  for (size_t i = 0; i < t.positions.size(); ++i) t.positions[i] = static_cast<int32_t>(i % 9) - 1;
  return t;
}

TEST(TraceFormatTest, RoundTrips) {
  const std::string path = ::testing::TempDir() + "/round.skvt";
  const Trace t = SmallTrace();
  ASSERT_TRUE(WriteTrace(path, t).ok());
  StatusOr<Trace> back = ReadTrace(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layers, 2);
  EXPECT_EQ(back->top_k, 3);
  EXPECT_EQ(back->steps, 4);
  EXPECT_EQ(back->metadata, t.metadata);
  EXPECT_EQ(back->seq_len, t.seq_len);
  EXPECT_EQ(back->positions, t.positions);
  EXPECT_EQ(back->row(1, 1)[0], t.positions[9]);
}

TEST(TraceFormatTest, RejectsBadFiles) {
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/bad_magic.skvt") << "NOTATRACE-------------------";
  EXPECT_EQ(ReadTrace(dir + "/bad_magic.skvt").status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteTrace(dir + "/whole.skvt", SmallTrace()).ok());
  std::ifstream whole(dir + "/whole.skvt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(whole)), {});
  std::ofstream(dir + "/cut.skvt", std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  EXPECT_EQ(ReadTrace(dir + "/cut.skvt").status().code(), StatusCode::kInvalidArgument);
  std::ofstream(dir + "/long.skvt", std::ios::binary) << bytes << "x";
  EXPECT_EQ(ReadTrace(dir + "/long.skvt").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadTrace(dir + "/missing.skvt").status().code(), StatusCode::kUnavailable);
  Trace wrong = SmallTrace();
  wrong.positions.pop_back();
  EXPECT_EQ(WriteTrace(dir + "/wrong.skvt", wrong).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sparsekv
