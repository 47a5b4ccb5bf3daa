// Random and hostile inputs: every entry point either succeeds or throws dsv4::Error — never crashes, hangs or
// returns invalid UTF-8.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "shared_tokenizer.h"
#include "text/chat_request.h"
#include "text/completion_parser.h"
#include "text/py_json.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

std::string random_bytes(std::mt19937& rng, std::size_t n, const std::vector<std::string>& vocab) {
  std::string s;
  while (s.size() < n) {
    if (rng() % 3 == 0)
      s += vocab[rng() % vocab.size()];
    else
      s += static_cast<char>(rng() % 256);
  }
  return s;
}

const std::vector<std::string> kPieces = {
    "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"", "</｜DSML｜invoke>",
    "<｜DSML｜parameter name=\"", "\" string=\"true\">", "\" string=\"false\">", "</｜DSML｜parameter>",
    "</think>", "<think>", "<｜end▁of▁sentence｜>", "\n\n", "\">\n", "{", "}", "[", "]", "\"", ":", ",", "1.5e3",
    "null", "é", "😀", "\\u00e9", "\\"};

TEST(Robustness, ParserNeverFailsOnRandomText) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string t = random_bytes(rng, 1 + rng() % 200, kPieces);
    for (ThinkingMode mode : {ThinkingMode::kChat, ThinkingMode::kThinking}) {
      CompletionParser p(mode);
      const std::size_t cut = rng() % (t.size() + 1);
      p.feed(std::string_view(t).substr(0, cut));
      p.feed(std::string_view(t).substr(cut));
      p.finish();
      const auto& one = parse_completion(t, mode);
      ASSERT_EQ(p.result().content, one.content);
      ASSERT_EQ(p.result().reasoning_content, one.reasoning_content);
      ASSERT_EQ(p.result().tool_calls.size(), one.tool_calls.size());
      for (const auto& c : one.tool_calls) EXPECT_NO_THROW(py_json_loads(c.arguments)) << c.arguments;
    }
  }
}

TEST(Robustness, JsonAndRequestsFailCleanly) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 5000; ++trial) {
    const std::string t = random_bytes(rng, 1 + rng() % 60, kPieces);
    try {
      const PyJson j = py_json_loads(t);
      EXPECT_EQ(find_invalid_utf8(py_json_dumps(j)), std::string::npos);
    } catch (const Error&) {
    }
    try {
      const ChatRequest r = parse_chat_request("{\"messages\": [{\"role\": \"user\", \"content\": " + t + "}]}");
      encode_chat(r.messages, r.options);
    } catch (const Error&) {
    }
  }
}

TEST(Robustness, EncodeRejectsOrRoundTrips) {
  std::mt19937 rng(13);
  const auto& tok = testing::v4_tokenizer();
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string t = random_bytes(rng, rng() % 100, kPieces);
    if (find_invalid_utf8(t) != std::string::npos) {
      EXPECT_THROW(tok.encode(t), Error);
    } else {
      EXPECT_EQ(tok.decode(tok.encode(t)), t);
    }
  }
}

}  // namespace
}  // namespace dsv4::text
