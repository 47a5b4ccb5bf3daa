// Checkpoint::open on broken directories: duplicates across shards, an index that names a missing tensor, a
// missing shard or the wrong shard, malformed indices, and broken shards. Each error names the file and tensor.
#include <gtest/gtest.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
#include "helpers.h"

namespace dsv4::ckpt {
namespace {

using testing::ThrowsErrorWith;

void write_one(const std::string& path, const std::string& name) {
  SafetensorsWriter w;
  w.add(name, DType::U8, {2}, {1, 2});
  w.write(path);
}

TEST(CheckpointDir, DuplicateTensorAcrossShards) {
  testing::ScratchDir dir;
  write_one(dir.file("a.safetensors"), "layers.0.ffn.w1.weight");
  write_one(dir.file("b.safetensors"), "layers.0.ffn.w1.weight");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); },
                              {"'layers.0.ffn.w1.weight'", "a.safetensors", "b.safetensors", "unique"}));
  // Also when an index lists both shards.
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"weight_map":{"layers.0.ffn.w1.weight":"a.safetensors","other":"b.safetensors"}})");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {"'layers.0.ffn.w1.weight'", "unique"}));
}

TEST(CheckpointDir, IndexNamesMissingTensor) {
  testing::ScratchDir dir;
  write_one(dir.file("s1.safetensors"), "present");
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"metadata":{"total_size":2},"weight_map":{"present":"s1.safetensors","ghost":"s1.safetensors"}})");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); },
                              {"model.safetensors.index.json", "'ghost'", "s1.safetensors"}));
}

TEST(CheckpointDir, IndexNamesMissingShard) {
  testing::ScratchDir dir;
  write_one(dir.file("s1.safetensors"), "present");
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"weight_map":{"present":"s1.safetensors","head.weight":"model-00009-of-00009.safetensors"}})");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); },
                              {"model.safetensors.index.json", "'head.weight'", "model-00009-of-00009.safetensors",
                               "does not exist"}));
}

TEST(CheckpointDir, IndexNamesWrongShard) {
  testing::ScratchDir dir;
  write_one(dir.file("s1.safetensors"), "x");
  write_one(dir.file("s2.safetensors"), "y");
  testing::write_text(dir.file("model.safetensors.index.json"),
                      R"({"weight_map":{"x":"s2.safetensors","y":"s1.safetensors"}})");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {"model.safetensors.index.json", "'x'", "s2"}));
}

TEST(CheckpointDir, MalformedIndex) {
  testing::ScratchDir dir;
  write_one(dir.file("s1.safetensors"), "x");
  const std::string idx = dir.file("model.safetensors.index.json");
  testing::write_text(idx, R"({"weight_map":{"x":"s1.safetensors")");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {idx, "JSON"}));
  testing::write_text(idx, R"({"metadata":{}})");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {idx, "weight_map"}));
  testing::write_text(idx, R"({"weight_map":{"x":3}})");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {idx, "'x'"}));
  testing::write_text(idx, R"({"weight_map":{"x":"../s1.safetensors"}})");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {idx, "'x'", "invalid shard name"}));
  testing::write_text(idx, R"({"weight_map":{"x":"/etc/passwd"}})");
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {idx, "'x'", "invalid shard name"}));
}

TEST(CheckpointDir, BrokenShardIsNamed) {
  testing::ScratchDir dir;
  SafetensorsWriter w;
  w.add("embed.weight", DType::BF16, {4, 8}, std::vector<uint8_t>(64, 3));
  w.add("norm.weight", DType::BF16, {8}, std::vector<uint8_t>(16, 4));
  w.write_sharded(dir.str(), 2);
  // Truncate the shard holding norm.weight by a few bytes: its data now runs past the end of the file.
  const std::string shard = dir.file("model-00002-of-00002.safetensors");
  auto bytes = testing::read_bytes(shard);
  bytes.resize(bytes.size() - 3);
  testing::write_bytes(shard, bytes);
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {shard, "'norm.weight'", "past the end"}));
  // Cut inside the header: the declared header length now runs past the end.
  bytes.resize(20);
  testing::write_bytes(shard, bytes);
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {shard, "header length"}));
  bytes.resize(5);
  testing::write_bytes(shard, bytes);
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {shard, "too small"}));
}

TEST(CheckpointDir, NotACheckpoint) {
  testing::ScratchDir dir;
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.str()); }, {dir.str(), "no "}));
  EXPECT_TRUE(ThrowsErrorWith([&] { Checkpoint::open(dir.file("missing")); }, {"missing", "not a checkpoint"}));
}

}  // namespace
}  // namespace dsv4::ckpt
