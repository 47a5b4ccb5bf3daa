// The 60 hand-picked vectors of ../shared/data/tokenizer/vectors.json (copied to tests/data/tokenizer/), the decode
// vectors of CHAT_FORMAT.md §5.4 and the id layout of §1, all against the real V4 tokenizer.json.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "shared_tokenizer.h"
#include "text/byte_level.h"

namespace dsv4::text {
namespace {

using testing::v4_tokenizer;

nlohmann::json load_vectors() {
  std::ifstream f(testing::source_path("tests/data/tokenizer/vectors.json"));
  return nlohmann::json::parse(f);
}

TEST(TokenizerVectors, AllSixtyVectorsEncodeExactly) {
  const auto doc = load_vectors();
  ASSERT_EQ(doc["vectors"].size(), 60u);
  for (const auto& v : doc["vectors"]) {
    const std::string text = v["text"];
    EXPECT_EQ(v4_tokenizer().encode(text), v["ids"].get<std::vector<TokenId>>()) << v["name"];
  }
}

TEST(TokenizerVectors, DecodeOfEveryVectorIsTheInput) {
  const auto doc = load_vectors();  // keep the document alive: a range-for over a temporary's member dangles
  for (const auto& v : doc["vectors"]) {
    const auto ids = v["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(v4_tokenizer().decode(ids), v["text"].get<std::string>()) << v["name"];
  }
}

TEST(TokenizerVectors, TokenStringsMatchTheVocabulary) {
  // `tokens` are vocabulary strings in the byte-level alphabet (added tokens: their content); find_token takes
  // raw bytes or added-token content.
  const auto& tok = v4_tokenizer();
  const auto doc = load_vectors();
  std::size_t checked = 0;
  for (const auto& v : doc["vectors"]) {
    const auto ids = v["ids"].get<std::vector<TokenId>>();
    ASSERT_EQ(v["tokens"].size(), ids.size()) << v["name"];
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::string s = v["tokens"][k];
      const bool added = ids[k] >= 128000 || ids[k] <= 2;
      const auto raw = byte_level_to_bytes(s);
      ASSERT_TRUE(added || raw.has_value()) << s;
      EXPECT_EQ(tok.find_token(added ? s : *raw), ids[k]) << v["name"] << " token " << k;
      EXPECT_EQ(tok.token_bytes(ids[k]), added ? s : *raw);
      ++checked;
    }
  }
  EXPECT_GT(checked, 500u);
}

TEST(TokenizerDecode, SectionFiveFourVectors) {
  const auto& tok = v4_tokenizer();
  EXPECT_EQ(tok.decode(std::vector<TokenId>{53153}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{53153, 234}), "\U0001F389");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{40965, 124}), "\U0001F3FD");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{128822, 35}), "</think>A");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{0, 1, 2}),
            "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C><\uFF5Cend\u2581of\u2581sentence\uFF5C><\uFF5C\u2581pad\u2581\uFF5C>");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{223}), " ");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{201}), "\n");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{191}), std::string(1, '\0'));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{258}), "\xEF\xBF\xBD");
}

TEST(TokenizerDecode, SkipSpecialDropsOnlySpecialFlaggedTokens) {
  const auto& tok = v4_tokenizer();
  // BOS is special; <｜User｜> and </think> are not (flags from the real tokenizer.json).
  EXPECT_EQ(tok.decode(std::vector<TokenId>{0, 128803, 90, 128822}, true), "<\uFF5CUser\uFF5C>x</think>");
}

TEST(TokenizerDecode, UnknownIdIsAnError) {
  EXPECT_THROW(v4_tokenizer().decode(std::vector<TokenId>{129280}), Error);
  EXPECT_THROW(v4_tokenizer().decode(std::vector<TokenId>{-1}), Error);
}

TEST(TokenizerLayout, KeyIdsAndSizes) {
  const auto& tok = v4_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 129280);
  EXPECT_EQ(tok.added_token_count(), 1283u);
  const std::pair<const char*, TokenId> key[] = {
      {"<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>", 0}, {"<\uFF5Cend\u2581of\u2581sentence\uFF5C>", 1},
      {"<\uFF5CUser\uFF5C>", 128803}, {"<\uFF5CAssistant\uFF5C>", 128804}, {"<think>", 128821},
      {"</think>", 128822}, {"\uFF5CDSML\uFF5C", 128825}, {"<\uFF5Clatest_reminder\uFF5C>", 128828},
      {"<|EOT|>", 128805}, {"<\uFF5Cimage\uFF5C>", 129279}};
  for (const auto& [s, id] : key) {
    EXPECT_EQ(tok.find_token(s), id) << s;
    EXPECT_EQ(tok.encode(s), std::vector<TokenId>{id}) << s;
  }
  // Single-byte tokens: id = 3 + rank of the mapped code point.
  EXPECT_EQ(tok.encode(" "), std::vector<TokenId>{223});
  EXPECT_EQ(tok.encode("!"), std::vector<TokenId>{3});
}

TEST(TokenizerEncode, InvalidUtf8IsRejected) {
  EXPECT_THROW(v4_tokenizer().encode("ab\xC3"), Error);
  EXPECT_THROW(v4_tokenizer().encode("\xED\xA0\x80"), Error);  // surrogate
  EXPECT_TRUE(v4_tokenizer().encode("").empty());
}

TEST(TokenizerLoad, BadFilesFailCleanly) {
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
  EXPECT_THROW(Tokenizer::from_json("{not json"), Error);
  EXPECT_THROW(Tokenizer::from_json("{}"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "WordPiece"}})"), Error);
}

}  // namespace
}  // namespace dsv4::text
