// SafetensorsWriter -> SafetensorsFile / Checkpoint round trips: every dtype, metadata, header padding, sharded
// output with its index, and the writer's own argument checks.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
#include "helpers.h"

namespace dsv4::ckpt {
namespace {

using testing::ThrowsErrorWith;

const DType kAllDtypes[] = {DType::BOOL, DType::U8,  DType::I8,  DType::U16,     DType::I16,     DType::U32,
                            DType::I32,  DType::U64, DType::I64, DType::F16,     DType::BF16,    DType::F32,
                            DType::F64,  DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0};

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 37 + seed * 11 + 1);
  return b;
}

std::vector<uint8_t> view_bytes(const TensorView& v) { return std::vector<uint8_t>(v.data, v.data + v.nbytes()); }

TEST(RoundTrip, EveryDtypeSingleFile) {
  testing::ScratchDir dir;
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> payloads;
  for (DType t : kAllDtypes) {
    payloads.push_back(pattern(3 * 5 * dtype_size(t), static_cast<uint32_t>(t)));
    w.add(std::string("t.") + std::string(dtype_name(t)), t, {3, 5}, payloads.back());
  }
  w.add_f32("scalar", {}, {2.5f});
  w.add("empty", DType::BF16, {0, 4}, {});
  w.set_metadata("format", "pt");
  w.set_metadata("producer", "dsv4 tests");
  EXPECT_TRUE(w.has("scalar"));
  EXPECT_FALSE(w.has("nope"));
  EXPECT_EQ(w.size(), std::size(kAllDtypes) + 2);
  const std::string path = dir.file("model.safetensors");
  w.write(path);

  SafetensorsFile f(path);
  const ParsedHeader& h = f.header();
  ASSERT_EQ(h.tensors.size(), w.size());
  EXPECT_EQ(h.data_offset % 8, 0u) << "header must be padded to a multiple of 8";
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.at("producer"), "dsv4 tests");
  for (size_t i = 0; i < std::size(kAllDtypes); ++i) {
    const TensorView v = f.view(i);
    EXPECT_EQ(v.name(), std::string("t.") + std::string(dtype_name(kAllDtypes[i])));  // insertion order kept
    EXPECT_EQ(v.dtype(), kAllDtypes[i]);
    EXPECT_EQ(v.shape(), (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(v.numel(), 15);
    EXPECT_EQ(v.ndim(), 2);
    EXPECT_EQ(v.dim(1), 5);
    EXPECT_EQ(*v.file, path);
    EXPECT_EQ(view_bytes(v), payloads[i]) << v.name();
  }
  const TensorView s = f.view(std::size(kAllDtypes));
  EXPECT_EQ(s.numel(), 1);
  float val;
  std::memcpy(&val, s.data, sizeof val);
  EXPECT_EQ(val, 2.5f);
  EXPECT_EQ(f.view(std::size(kAllDtypes) + 1).numel(), 0);
  EXPECT_TRUE(ThrowsErrorWith([&] { f.view(99); }, {path, "99"}));

  // The padding is spaces, and the data section is exactly the tensors back to back.
  const auto bytes = testing::read_bytes(path);
  EXPECT_EQ(bytes.size(), f.file_size());
  EXPECT_NE(bytes[h.data_offset - 1], '\0');
  uint64_t sum = 0;
  for (const auto& e : h.tensors) sum += e.end - e.begin;
  EXPECT_EQ(h.data_offset + sum, bytes.size());
}

TEST(RoundTrip, CheckpointFromOneFile) {
  testing::ScratchDir dir;
  SafetensorsWriter w;
  w.add_f32("b", {2}, {1.0f, -1.0f});
  w.add("a", DType::F8_E4M3, {4}, {0x38, 0x7E, 0x01, 0x80});
  w.write(dir.file("only.safetensors"));
  const Checkpoint ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck.dir(), dir.str());
  EXPECT_EQ(ck.tensor_count(), 2u);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(ck.has("a"));
  EXPECT_EQ(ck.find("zz"), nullptr);
  EXPECT_EQ(ck.total_tensor_bytes(), 12u);
  EXPECT_EQ(view_bytes(ck.get("a")), (std::vector<uint8_t>{0x38, 0x7E, 0x01, 0x80}));
  EXPECT_TRUE(ThrowsErrorWith([&] { ck.get("layers.3.ffn.gate.weight"); }, {dir.str(), "'layers.3.ffn.gate.weight'"}));
}

TEST(RoundTrip, Sharded) {
  testing::ScratchDir dir;
  SafetensorsWriter w;
  std::map<std::string, std::vector<uint8_t>> want;
  uint64_t total = 0;
  for (int i = 0; i < 20; ++i) {
    const DType t = kAllDtypes[i % std::size(kAllDtypes)];
    const std::string name = "layers." + std::to_string(i) + ".w";
    auto bytes = pattern(static_cast<size_t>(i + 1) * 3 * dtype_size(t), static_cast<uint32_t>(i));
    want[name] = bytes;
    total += bytes.size();
    w.add(name, t, {i + 1, 3}, std::move(bytes));
  }
  w.set_metadata("format", "pt");
  w.write_sharded(dir.str(), 3);

  // Index: total_size and a weight_map that covers every tensor, pointing at existing shards.
  const auto index = nlohmann::json::parse(testing::read_bytes(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
  EXPECT_EQ(index.at("weight_map").size(), 20u);
  for (int s = 1; s <= 3; ++s)
    EXPECT_TRUE(std::filesystem::exists(dir.file("model-0000" + std::to_string(s) + "-of-00003.safetensors")));

  const Checkpoint ck = Checkpoint::open(dir.str());
  EXPECT_EQ(ck.files().size(), 3u);
  EXPECT_EQ(ck.tensor_count(), 20u);
  EXPECT_EQ(ck.total_tensor_bytes(), total);
  for (const auto& [name, bytes] : want) {
    const TensorView& v = ck.get(name);
    EXPECT_EQ(view_bytes(v), bytes) << name;
    const std::string shard = index.at("weight_map").at(name).get<std::string>();
    EXPECT_EQ(std::filesystem::path(*v.file).filename().string(), shard) << name;
  }
  for (const auto& f : ck.files()) {
    EXPECT_FALSE(f->header().tensors.empty()) << "greedy balancing leaves no shard empty here";
    EXPECT_EQ(f->header().metadata.at("format"), "pt");
  }
}

TEST(RoundTrip, ShardedSingleShardAndNoIndexDirectory) {
  testing::ScratchDir dir;
  SafetensorsWriter w;
  w.add("x", DType::U8, {1}, {42});
  w.write_sharded(dir.str(), 1);
  EXPECT_EQ(view_bytes(Checkpoint::open(dir.str()).get("x")), std::vector<uint8_t>{42});

  // Without an index every *.safetensors file is read, in name order.
  testing::ScratchDir plain;
  SafetensorsWriter w2, w1;
  w2.add("second", DType::U8, {1}, {2});
  w1.add("first", DType::U8, {1}, {1});
  w2.write(plain.file("b.safetensors"));
  w1.write(plain.file("a.safetensors"));
  testing::write_text(plain.file("notes.txt"), "ignored");
  const Checkpoint ck = Checkpoint::open(plain.str());
  ASSERT_EQ(ck.files().size(), 2u);
  EXPECT_EQ(ck.files()[0]->path(), plain.file("a.safetensors"));
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"first", "second"}));
}

TEST(Writer, RejectsBadInput) {
  testing::ScratchDir dir;
  {
    SafetensorsWriter w;
    w.add("short", DType::F32, {2, 2}, std::vector<uint8_t>(12));
    EXPECT_TRUE(ThrowsErrorWith([&] { w.write(dir.file("x.safetensors")); }, {"'short'", "12", "16"}));
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.safetensors")));
  }
  {
    SafetensorsWriter w;
    w.add("neg", DType::U8, {-1}, {});
    EXPECT_TRUE(ThrowsErrorWith([&] { w.write(dir.file("y.safetensors")); }, {"'neg'", "negative"}));
  }
  {
    SafetensorsWriter w;
    w.add_f32("twice", {1}, {1.0f});
    EXPECT_TRUE(ThrowsErrorWith([&] { w.add_f32("twice", {1}, {1.0f}); }, {"'twice'"}));
    EXPECT_TRUE(ThrowsErrorWith([&] { w.add("__metadata__", DType::U8, {0}, {}); }, {"__metadata__"}));
    EXPECT_TRUE(ThrowsErrorWith([&] { w.write_sharded(dir.file("s"), 0); }, {"shard count"}));
    EXPECT_TRUE(ThrowsErrorWith([&] { w.write(dir.file("no/such/dir/z.safetensors")); }, {"z.safetensors"}));
  }
  {
    SafetensorsWriter w;
    w.add("bad\xff", DType::U8, {0}, {});
    EXPECT_TRUE(ThrowsErrorWith([&] { w.write(dir.file("u.safetensors")); }, {"u.safetensors", "UTF-8"}));
    EXPECT_FALSE(std::filesystem::exists(dir.file("u.safetensors.tmp")));
  }
}

}  // namespace
}  // namespace dsv4::ckpt
