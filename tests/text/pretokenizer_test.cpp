// Pre-tokenizer pieces against the reference's own pieces (vectors.json field
// hf_pretokenizer_pieces_without_added_token_split) and the worked examples of CHAT_FORMAT.md §4.4.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_paths.h"
#include "text/byte_level.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

std::vector<std::string> pieces(const std::string& s) {
  std::vector<Piece> p;
  pretokenize(s, p);
  std::vector<std::string> out;
  std::size_t covered = 0;
  for (const Piece& x : p) {
    EXPECT_EQ(x.begin, covered);  // pieces tile the text
    covered = x.end;
    out.emplace_back(s.substr(x.begin, x.end - x.begin));
  }
  EXPECT_EQ(covered, s.size());
  return out;
}

std::string to_byte_level(const std::string& raw) {
  std::string out;
  for (unsigned char b : raw) append_utf8(out, byte_to_char(b));
  return out;
}

TEST(PreTokenizer, MatchesReferencePiecesOfAllVectors) {
  const auto doc = nlohmann::json::parse(testing::read_source_file("tests/data/tokenizer/vectors.json"));
  for (const auto& v : doc["vectors"]) {
    std::vector<std::string> got;
    for (const auto& p : pieces(v["text"].get<std::string>())) got.push_back(to_byte_level(p));
    EXPECT_EQ(got, v["hf_pretokenizer_pieces_without_added_token_split"].get<std::vector<std::string>>()) << v["name"];
  }
}

TEST(PreTokenizer, SpecExamples) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello 世界 and  你好"), (V{"Hello", " ", "世界", " and", "  ", "你好"}));
  EXPECT_EQ(pieces("x   \n  y"), (V{"x", "   \n", " ", " y"}));
  EXPECT_EQ(pieces("    int"), (V{"   ", " int"}));
  EXPECT_EQ(pieces("\t\tfoo"), (V{"\t", "\tfoo"}));
  EXPECT_EQ(pieces("a\u00A0b"), (V{"a", "\u00A0b"}));
  EXPECT_EQ(pieces(" ~~~"), (V{" ~~~"}));
  EXPECT_EQ(pieces("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(pieces("👍🏽 👨\u200D👩"), (V{"👍🏽", " 👨", "\u200D", "👩"}));
  EXPECT_EQ(pieces(" .NET"), (V{" .", "NET"}));
  EXPECT_EQ(pieces("x=1234"), (V{"x", "=", "123", "4"}));
  EXPECT_TRUE(pieces("").empty());
}

}  // namespace
}  // namespace dsv4::text
