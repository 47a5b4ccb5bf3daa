// Checkpoint::in_memory (synthetic benchmark weights): views onto caller memory, found by name; entries whose byte
// size disagrees with dtype x shape, duplicates, missing data and count mismatches are refused with the tensor's name.
#include <gtest/gtest.h>

#include "checkpoint/safetensors.h"
#include "helpers.h"

namespace dsv4::ckpt {
namespace {

using testing::ThrowsErrorWith;

TEST(CheckpointInMemory, ViewsCallerMemory) {
  std::vector<uint8_t> a(2 * 3 * 2, 7), b(4, 9);
  Checkpoint ck = Checkpoint::in_memory("mem", {{"a", DType::BF16, {2, 3}, 0, 12}, {"b", DType::U8, {4}, 0, 4}},
                                        {a.data(), b.data()});
  ASSERT_TRUE(ck.has("a"));
  EXPECT_EQ(ck.get("a").data, a.data());
  EXPECT_EQ(ck.get("a").nbytes(), 12u);
  EXPECT_EQ(ck.get("b").dim(0), 4);
  EXPECT_EQ(*ck.get("b").file, "mem");
  EXPECT_EQ(ck.tensor_count(), 2u);
  Checkpoint moved = std::move(ck);  // views stay valid when the checkpoint moves
  EXPECT_EQ(moved.get("a").name(), "a");
  EXPECT_EQ(*moved.get("a").file, "mem");
}

TEST(CheckpointInMemory, RefusesInconsistentEntries) {
  std::vector<uint8_t> a(16);
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::in_memory("mem", {{"a", DType::F32, {3}, 0, 8}}, {a.data()}); },
                              {"mem", "'a'", "12"}));
  EXPECT_TRUE(ThrowsErrorWith(
      [&] { Checkpoint::in_memory("mem", {{"a", DType::U8, {2}, 0, 2}, {"a", DType::U8, {2}, 0, 2}}, {a.data(), a.data()}); },
      {"duplicate", "'a'"}));
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::in_memory("mem", {{"a", DType::U8, {2}, 0, 2}}, {nullptr}); }, {"'a'", "no data"}));
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::in_memory("mem", {{"a", DType::U8, {2}, 0, 2}}, {}); }, {"1 entries", "0 data"}));
}

}  // namespace
}  // namespace dsv4::ckpt
