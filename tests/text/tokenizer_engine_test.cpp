// Properties of the tokenizer engine that the vectors do not pin down: the BPE cache is transparent, encoding is
// thread-safe, the streaming detokenizer equals decode() for every prefix, and UTF-8 helpers follow Rust's
// from_utf8_lossy.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "shared_tokenizer.h"
#include "text/stream_detokenizer.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

using testing::v4_tokenizer;

const char* kSample =
    "def f(x):\n    return x ** 2  # 平方\n\n\n\tprint(\"héllo 👋🏽 world\")  <｜User｜>1234567 ١٢٣ "
    "        spaces\r\n\u00A0nbsp \u3000ideographic ~/path <think>ok</think>";

TEST(TokenizerEngine, CacheIsTransparent) {
  // Same text twice (second time from the cache) and with a fresh thread (empty cache) give the same ids.
  const auto first = v4_tokenizer().encode(kSample);
  EXPECT_EQ(v4_tokenizer().encode(kSample), first);
  std::vector<TokenId> other;
  std::thread([&] { other = v4_tokenizer().encode(kSample); }).join();
  EXPECT_EQ(other, first);
  EXPECT_EQ(v4_tokenizer().decode(first), kSample);
}

TEST(TokenizerEngine, ConcurrentEncodeIsDeterministic) {
  const auto want = v4_tokenizer().encode(kSample);
  std::vector<std::thread> ts;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int k = 0; k < 50; ++k) ok[t] += v4_tokenizer().encode(kSample) == want;
    });
  for (auto& th : ts) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 50);
}

TEST(TokenizerEngine, LongRunsAreFast) {
  // O(n log n) BPE: a 200 kB single piece must not take quadratic time.
  const std::string spaces(200000, ' ');
  const auto ids = v4_tokenizer().encode(spaces + "x");
  EXPECT_EQ(v4_tokenizer().decode(ids), spaces + "x");
  EXPECT_EQ(v4_tokenizer().decode(v4_tokenizer().encode(std::string(200000, 'a'))), std::string(200000, 'a'));
}

TEST(StreamDetokenizer, EqualsDecodeForRandomIdSequences) {
  std::mt19937 rng(7);
  const auto& tok = v4_tokenizer();
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<TokenId> ids;
    const int n = 1 + rng() % 16;
    for (int k = 0; k < n; ++k) ids.push_back(rng() % 2 ? 3 + rng() % 256 : rng() % tok.vocab_size());
    StreamDetokenizer s(tok);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string piece = s.push(id);
      EXPECT_EQ(find_invalid_utf8(piece), std::string::npos);
      streamed += piece;
    }
    streamed += s.finish();
    EXPECT_EQ(streamed, tok.decode(ids));
  }
}

TEST(StreamDetokenizer, HoldsBackIncompleteCharacters) {
  StreamDetokenizer s(v4_tokenizer());
  EXPECT_EQ(s.push(53153), "");  // first bytes of 🎉
  EXPECT_GT(s.pending_bytes(), 0u);
  EXPECT_EQ(s.push(234), "\U0001F389");
  EXPECT_EQ(s.pending_bytes(), 0u);
  EXPECT_EQ(s.push(53153), "");
  EXPECT_EQ(s.finish(), "\uFFFD");  // an unfinished character at the end is replaced, not dropped
}

TEST(Utf8, LossyFollowsMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("a\xF0\x9F\x8E"), "a\uFFFD");             // truncated 4-byte: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xC0\x80"), "\uFFFD\uFFFD");              // overlong lead: each byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");    // surrogate
  EXPECT_EQ(utf8_lossy("\xE2\x82x"), "\uFFFDx");
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // > U+10FFFF
  EXPECT_EQ(utf8_stable_prefix_len("ab\xE2\x82"), 2u);
  EXPECT_EQ(utf8_stable_prefix_len("ab\xE2\x28"), 4u);  // already invalid: nothing to wait for
  EXPECT_EQ(utf8_stable_prefix_len("ab\xE2\x82\xAC"), 5u);
}

}  // namespace
}  // namespace dsv4::text
