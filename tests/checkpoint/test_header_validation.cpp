// parse_safetensors_header / SafetensorsFile on hostile input: every violation must be a dsv4::Error naming the
// file label and (when one is involved) the tensor; valid edge cases must still parse.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "helpers.h"

namespace dsv4::ckpt {
namespace {

using testing::raw_safetensors;
using testing::ThrowsErrorWith;

const std::string kLabel = "shard-under-test.safetensors";

ParsedHeader parse(const std::vector<uint8_t>& bytes) {
  return parse_safetensors_header(bytes.data(), bytes.size(), kLabel);
}

// Expects parsing `header` (followed by `data_len` zero bytes) to fail with all of `fragments` (plus the label).
::testing::AssertionResult Rejects(const std::string& header, size_t data_len,
                                   std::initializer_list<std::string> fragments) {
  const auto bytes = raw_safetensors(header, std::vector<uint8_t>(data_len, 0));
  auto r = ThrowsErrorWith([&] { parse(bytes); }, fragments);
  if (!r) return r;
  return ThrowsErrorWith([&] { parse(bytes); }, {kLabel});
}

TEST(HeaderValidation, FileTooSmall) {
  for (size_t n : {0, 1, 7}) {
    std::vector<uint8_t> b(n, 0);
    EXPECT_TRUE(ThrowsErrorWith([&] { parse(b); }, {kLabel, "too small"}));
  }
  EXPECT_TRUE(ThrowsErrorWith([&] { parse_safetensors_header(nullptr, 0, kLabel); }, {kLabel}));
}

TEST(HeaderValidation, HeaderLengthBeyondFile) {
  const std::string h = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  const auto b = raw_safetensors(h, {0}, h.size() + 2);  // claims 2 bytes more than there are
  EXPECT_TRUE(ThrowsErrorWith([&] { parse(b); }, {kLabel, "past the end of the file"}));
}

TEST(HeaderValidation, HugeHeaderLength) {
  for (uint64_t n : {uint64_t{200} << 20, uint64_t{1} << 63, ~uint64_t{0}}) {
    const auto b = raw_safetensors("{}", {}, n);
    EXPECT_TRUE(ThrowsErrorWith([&] { parse(b); }, {kLabel, "exceeds"})) << n;
  }
}

TEST(HeaderValidation, MalformedJson) {
  EXPECT_TRUE(Rejects(R"({"w":{"dtype":"U8")", 0, {"not well-formed JSON"}));
  EXPECT_TRUE(Rejects("not json at all", 0, {"not well-formed JSON"}));
  EXPECT_TRUE(Rejects("{} trailing", 0, {"not well-formed JSON"}));
  EXPECT_TRUE(Rejects("", 0, {"not well-formed JSON"}));
  EXPECT_TRUE(Rejects("{\"w\xff\":1}", 0, {"not well-formed JSON"}));  // invalid UTF-8
  EXPECT_TRUE(Rejects("[1,2]", 0, {"must be a JSON object"}));
  EXPECT_TRUE(Rejects(std::string(100000, '['), 0, {"nests deeper"}));
  EXPECT_TRUE(Rejects(R"({"w":)" + std::string(50, '[') + std::string(50, ']') + "}", 0, {"nests deeper"}));
}

TEST(HeaderValidation, UnknownDtype) {
  EXPECT_TRUE(Rejects(R"({"wq":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", 1, {"'wq'", "unknown dtype", "F7"}));
  EXPECT_TRUE(Rejects(R"({"wq":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4, {"'wq'", "unknown dtype"}));
  EXPECT_TRUE(Rejects(R"({"wq":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4, {"'wq'", "dtype"}));
  EXPECT_TRUE(Rejects(R"({"wq":{"shape":[1],"data_offsets":[0,4]}})", 4, {"'wq'", "missing \"dtype\""}));
}

TEST(HeaderValidation, BadShape) {
  EXPECT_TRUE(Rejects(R"({"wk":{"dtype":"U8","shape":[-1,2],"data_offsets":[0,0]}})", 0, {"'wk'", "negative"}));
  EXPECT_TRUE(Rejects(R"({"wk":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1, {"'wk'", "non-integer"}));
  EXPECT_TRUE(Rejects(R"({"wk":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", 2, {"'wk'", "non-integer"}));
  EXPECT_TRUE(Rejects(R"({"wk":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2, {"'wk'", "shape[0]"}));
  EXPECT_TRUE(Rejects(R"({"wk":{"dtype":"U8","shape":4,"data_offsets":[0,4]}})", 4, {"'wk'", "must be an array"}));
  EXPECT_TRUE(Rejects(R"({"wk":{"dtype":"U8","data_offsets":[0,4]}})", 4, {"'wk'", "missing \"shape\""}));
  EXPECT_TRUE(Rejects(R"({"wk":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0,
                      {"'wk'", "too large"}));
  // 2^32 * 2^32 * 4 wraps to 0 in 64 bits; the check must catch the overflow, not accept the empty range.
  EXPECT_TRUE(Rejects(R"({"wk":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
                      {"'wk'", "overflow"}));
}

TEST(HeaderValidation, SizeMismatch) {
  EXPECT_TRUE(Rejects(R"({"wo":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16,
                      {"'wo'", "size mismatch", "16", "12"}));
  EXPECT_TRUE(Rejects(R"({"wo":{"dtype":"BF16","shape":[],"data_offsets":[0,4]}})", 4, {"'wo'", "size mismatch"}));
}

TEST(HeaderValidation, BadOffsets) {
  EXPECT_TRUE(Rejects(R"({"w1":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", 8, {"'w1'", "past the end"}));
  EXPECT_TRUE(Rejects(R"({"w1":{"dtype":"U8","shape":[0],"data_offsets":[9,9]}})", 8, {"'w1'", "past the end"}));
  EXPECT_TRUE(Rejects(R"({"w1":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", 8,
                      {"'w1'", "begin"}));
  EXPECT_TRUE(Rejects(R"({"w1":{"dtype":"U8","shape":[2],"data_offsets":[4,2]}})", 8, {"'w1'", "begin"}));
  EXPECT_TRUE(Rejects(R"({"w1":{"dtype":"U8","shape":[2],"data_offsets":[0,2,4]}})", 8, {"'w1'", "data_offsets"}));
  EXPECT_TRUE(Rejects(R"({"w1":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})", 8, {"'w1'", "data_offsets"}));
  EXPECT_TRUE(Rejects(R"({"w1":{"dtype":"U8","shape":[2],"data_offsets":{"a":1}}})", 8, {"'w1'", "data_offsets"}));
  EXPECT_TRUE(Rejects(R"({"w1":{"dtype":"U8","shape":[2]}})", 8, {"'w1'", "missing \"data_offsets\""}));
}

TEST(HeaderValidation, OverlappingTensors) {
  EXPECT_TRUE(Rejects(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                      12, {"'a'", "'b'", "overlaps"}));
  // Same range twice, listed in reverse order.
  EXPECT_TRUE(Rejects(R"({"z":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                      R"("y":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})",
                      16, {"'z'", "'y'", "overlaps"}));
}

TEST(HeaderValidation, DuplicatesAndEntryShape) {
  EXPECT_TRUE(Rejects(R"({"dup":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                      R"("dup":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                      2, {"'dup'", "duplicate"}));
  EXPECT_TRUE(Rejects(R"({"w":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", 1,
                      {"'w'", "duplicate key 'dtype'"}));
  EXPECT_TRUE(Rejects(R"({"w":[1,2]})", 0, {"'w'", "must be an object"}));
  EXPECT_TRUE(Rejects(R"({"__metadata__":{"k":1}})", 0, {"__metadata__", "'k'"}));
  EXPECT_TRUE(Rejects(R"({"__metadata__":"x"})", 0, {"__metadata__"}));
}

TEST(HeaderValidation, ValidEdgeCases) {
  // Empty header, no data.
  EXPECT_TRUE(parse(raw_safetensors("{}", {})).tensors.empty());
  // Header padded with spaces; scalar; empty tensors sharing an offset with a real one; metadata; order kept.
  const std::string h = R"({"__metadata__":{"format":"pt"},"z":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                        R"("e":{"dtype":"BF16","shape":[0,7],"data_offsets":[2,2]},)"
                        R"("a":{"dtype":"U8","shape":[2,2],"data_offsets":[4,8]}}     )";
  const ParsedHeader p = parse(raw_safetensors(h, std::vector<uint8_t>(8, 1)));
  ASSERT_EQ(p.tensors.size(), 3u);
  EXPECT_EQ(p.tensors[0].name, "z");
  EXPECT_EQ(p.tensors[1].name, "e");
  EXPECT_EQ(p.tensors[2].name, "a");
  EXPECT_TRUE(p.tensors[0].shape.empty());
  EXPECT_EQ(p.tensors[1].shape, (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(p.tensors[2].begin, 4u);
  EXPECT_EQ(p.tensors[2].end, 8u);
  EXPECT_EQ(p.tensors[2].dtype, DType::U8);
  EXPECT_EQ(p.metadata.at("format"), "pt");
  EXPECT_EQ(p.data_offset, 8 + h.size());
  // Unknown extra keys in an entry are ignored (as the reference reader does).
  EXPECT_EQ(parse(raw_safetensors(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{"y":[1]}}})", {7}))
                .tensors.size(),
            1u);
}

TEST(HeaderValidation, FileErrorsNameThePath) {
  testing::ScratchDir dir;
  const std::string path = dir.file("broken.safetensors");
  testing::write_bytes(path, raw_safetensors(R"({"layers.0.attn.wq_a.weight":{"dtype":"F8_E4M3","shape":[4,4],)"
                                             R"("data_offsets":[0,16]}})",
                                             std::vector<uint8_t>(10, 0)));
  EXPECT_TRUE(ThrowsErrorWith([&] { SafetensorsFile f(path); }, {path, "'layers.0.attn.wq_a.weight'", "past the end"}));
  EXPECT_TRUE(ThrowsErrorWith([&] { SafetensorsFile f(dir.file("absent.safetensors")); }, {"absent.safetensors"}));
  EXPECT_TRUE(ThrowsErrorWith([&] { SafetensorsFile f(dir.str()); }, {dir.str()}));  // a directory
}

}  // namespace
}  // namespace dsv4::ckpt
