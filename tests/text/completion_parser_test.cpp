// The completion parser: the official strict parser's results on well-formed output (CHAT_FORMAT.md §5.6 and the
// parser checks of the golden fixtures), the tolerance rules of §3.4, and identical results for every chunking.
#include <gtest/gtest.h>

#include "shared_tokenizer.h"
#include "text/chat_tokens.h"
#include "text/completion_parser.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

const std::string EOS = "<｜end▁of▁sentence｜>";
constexpr auto kChat = ThinkingMode::kChat;
constexpr auto kThink = ThinkingMode::kThinking;

std::string dsml(const std::string& invokes) {
  return "<｜DSML｜tool_calls>\n" + invokes + "</｜DSML｜tool_calls>";
}
std::string invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "</｜DSML｜invoke>\n";
}
std::string param(const std::string& k, bool str, const std::string& v) {
  return "<｜DSML｜parameter name=\"" + k + "\" string=\"" + (str ? "true" : "false") + "\">" + v +
         "</｜DSML｜parameter>\n";
}

void expect_same(const ParsedCompletion& a, const ParsedCompletion& b, const std::string& where) {
  EXPECT_EQ(a.reasoning_content, b.reasoning_content) << where;
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << where;
  for (std::size_t k = 0; k < a.tool_calls.size(); ++k) {
    EXPECT_EQ(a.tool_calls[k].name, b.tool_calls[k].name) << where;
    EXPECT_EQ(a.tool_calls[k].arguments, b.tool_calls[k].arguments) << where;
  }
  EXPECT_EQ(a.saw_eos, b.saw_eos) << where;
  EXPECT_EQ(a.reasoning_moved_to_content, b.reasoning_moved_to_content) << where;
}

// Parses `text` one-shot, then split at every byte into two chunks, then byte by byte; all must agree. The
// streamed deltas must concatenate to the final result and each delta must be valid UTF-8.
ParsedCompletion parse_all_chunkings(const std::string& text, ThinkingMode mode) {
  const ParsedCompletion whole = parse_completion(text, mode);
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    CompletionParser p(mode);
    p.feed(std::string_view(text).substr(0, cut));
    p.feed(std::string_view(text).substr(cut));
    p.finish();
    expect_same(whole, p.result(), "cut at " + std::to_string(cut));
  }
  CompletionParser p(mode);
  std::string reasoning, content;
  std::size_t calls = 0;
  auto take = [&](const CompletionDelta& d) {
    EXPECT_EQ(find_invalid_utf8(d.reasoning), std::string::npos);
    EXPECT_EQ(find_invalid_utf8(d.content), std::string::npos);
    reasoning += d.reasoning;
    content += d.content;
    calls += d.tool_calls.size();
  };
  for (char c : text) take(p.feed(std::string_view(&c, 1)));
  take(p.finish());
  expect_same(whole, p.result(), "byte by byte");
  if (!whole.reasoning_moved_to_content) {
    EXPECT_EQ(reasoning, whole.reasoning_content);
    EXPECT_EQ(content, whole.content);
  }
  EXPECT_EQ(calls, whole.tool_calls.size());
  return whole;
}

// --- §5.6: official strict parser results on well-formed output ---------------------------------------------------

TEST(CompletionParser, ChatPlain) {
  const auto r = parse_all_chunkings("Hello there." + EOS, kChat);
  EXPECT_EQ(r.content, "Hello there.");
  EXPECT_EQ(r.reasoning_content, "");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_TRUE(r.saw_eos);
  EXPECT_TRUE(r.warnings.empty());
}

TEST(CompletionParser, ThinkingReasoningThenContent) {
  const auto r = parse_all_chunkings("Let me think.</think>Answer." + EOS, kThink);
  EXPECT_EQ(r.reasoning_content, "Let me think.");
  EXPECT_EQ(r.content, "Answer.");
  EXPECT_TRUE(r.warnings.empty());
}

TEST(CompletionParser, ToolCallsArgumentsBuiltLikeTheOfficialParser) {
  const std::string text = "Need tool.</think>\n\n" +
                           dsml(invoke("f", param("a", true, "x \"q\" <b>") + param("n", false, "{\"k\": [1,2]}")) +
                                invoke("g", "")) + EOS;
  const auto r = parse_all_chunkings(text, kThink);
  EXPECT_EQ(r.reasoning_content, "Need tool.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"a\": \"x \\\"q\\\" <b>\", \"n\": {\"k\": [1,2]}}");
  EXPECT_EQ(r.tool_calls[1].name, "g");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  EXPECT_TRUE(r.warnings.empty());
}

TEST(CompletionParser, ChatContentBeforeCalls) {
  const auto r = parse_all_chunkings("Checking.\n\n" + dsml(invoke("f", param("a", true, "1"))) + EOS, kChat);
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"a\": \"1\"}");
}

TEST(CompletionParser, RenderedEmptyInvokeAndValuesWithNewlines) {
  // The encoder renders an empty invoke with a blank line; values may span lines and contain markup.
  const std::string text = "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n" +
                           invoke("h", param("code", true, "a\n<b>\n</c>") + param("x", false, "1.50")) +
                           "</｜DSML｜tool_calls>" + EOS;
  const auto r = parse_all_chunkings(text, kThink);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
  EXPECT_EQ(r.tool_calls[1].arguments, "{\"code\": \"a\\n<b>\\n</c>\", \"x\": 1.50}");
}

TEST(CompletionParser, UnicodeSurvivesEveryCut) {
  const auto r = parse_all_chunkings("思考中😀</think>答案：22°C 👍🏽" + EOS, kThink);
  EXPECT_EQ(r.reasoning_content, "思考中😀");
  EXPECT_EQ(r.content, "答案：22°C 👍🏽");
}

// --- golden fixtures: the official driver's parser checks --------------------------------------------------------

std::string between(const std::string& s, const std::string& a, const std::string& b, std::size_t from = 0) {
  const std::size_t i = s.find(a, from);
  const std::size_t j = s.find(b, i + a.size());
  return s.substr(i + a.size(), j - i - a.size());
}

TEST(CompletionParser, Fixture1Completions) {
  const std::string prompt = testing::read_source_file("tests/data/chat/test_output_1.txt");
  const std::string open = "<｜Assistant｜><think>";
  const auto first = parse_all_chunkings(between(prompt, open, "<｜User｜>"), kThink);
  EXPECT_EQ(first.reasoning_content,
            "The user wants to know the weather in Beijing. I should use the get_weather tool.");
  EXPECT_EQ(first.content, "");
  ASSERT_EQ(first.tool_calls.size(), 1u);
  EXPECT_EQ(first.tool_calls[0].name, "get_weather");
  EXPECT_EQ(first.tool_calls[0].arguments, "{\"location\": \"Beijing\", \"unit\": \"celsius\"}");
  const auto last = parse_all_chunkings(prompt.substr(prompt.rfind(open) + open.size()), kThink);
  EXPECT_EQ(last.reasoning_content, "Got the weather data. Let me format a nice response.");
  EXPECT_NE(last.content.find("22°C"), std::string::npos);
  EXPECT_TRUE(last.tool_calls.empty());
}

TEST(CompletionParser, Fixture2Completion) {
  const std::string prompt = testing::read_source_file("tests/data/chat/test_output_2.txt");
  const std::string open = "<｜Assistant｜><think>";
  const auto r = parse_all_chunkings(prompt.substr(prompt.rfind(open) + open.size()), kThink);
  EXPECT_EQ(r.reasoning_content, "The user asks about the capital of France. It is Paris.");
  EXPECT_EQ(r.content, "The capital of France is Paris.");
  EXPECT_TRUE(r.tool_calls.empty());
}

// --- tolerance (§3.4, §5.6 "tolerant" column) ---------------------------------------------------------------------

TEST(CompletionTolerance, CallsWithoutBlankLineBeforeThem) {
  const auto r = parse_all_chunkings("</think>" + dsml(invoke("f", "")) + EOS, kThink);
  EXPECT_EQ(r.reasoning_content, "");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  const auto one_nl = parse_all_chunkings("Text\n" + dsml(invoke("f", "")) + EOS, kChat);
  EXPECT_EQ(one_nl.content, "Text");
  // Three newlines: the official marker takes two, one stays in content (as the strict parser does).
  EXPECT_EQ(parse_all_chunkings("Text\n\n\n" + dsml(invoke("f", "")) + EOS, kChat).content, "Text\n");
}

TEST(CompletionTolerance, MissingEosIsFinishByLength) {
  const auto r = parse_all_chunkings("Hi", kChat);
  EXPECT_EQ(r.content, "Hi");
  EXPECT_FALSE(r.saw_eos);
  const auto t = parse_all_chunkings("still thinking", kThink);
  EXPECT_EQ(t.reasoning_content, "still thinking");  // truncated thinking stays reasoning
  EXPECT_EQ(t.content, "");
}

TEST(CompletionTolerance, EosInsideReasoningMovesItToContent) {
  const auto r = parse_all_chunkings("reasoning only" + EOS, kThink);
  EXPECT_EQ(r.content, "reasoning only");
  EXPECT_EQ(r.reasoning_content, "");
  EXPECT_TRUE(r.reasoning_moved_to_content);
}

TEST(CompletionTolerance, DsmlInsideReasoningEndsIt) {
  const auto r = parse_all_chunkings("R\n\n" + dsml(invoke("f", param("a", true, "v"))) + EOS, kThink);
  EXPECT_EQ(r.reasoning_content, "R");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"a\": \"v\"}");
  EXPECT_FALSE(r.reasoning_moved_to_content);
}

TEST(CompletionTolerance, TextAfterBlockBecomesContentWhitespaceIsDropped) {
  const auto r = parse_all_chunkings("C.\n\n" + dsml(invoke("f", "")) + "trailing" + EOS, kChat);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.content, "C.trailing");
  const auto ws = parse_all_chunkings("C.\n\n" + dsml(invoke("f", "")) + "\n \n" + EOS, kChat);
  EXPECT_EQ(ws.content, "C.");
  // A second block after the first adds more calls.
  const auto two = parse_all_chunkings(dsml(invoke("f", "")) + "\n\n" + dsml(invoke("g", "")) + EOS, kChat);
  ASSERT_EQ(two.tool_calls.size(), 2u);
  EXPECT_EQ(two.content, "");
}

TEST(CompletionTolerance, StrayThinkEndInChatModeIsSkipped) {
  const auto r = parse_all_chunkings("</think>Hi" + EOS, kChat);
  EXPECT_EQ(r.content, "Hi");
  EXPECT_FALSE(r.warnings.empty());
}

TEST(CompletionTolerance, MalformedDsmlIsReturnedAsContentNeverDropped) {
  // Broken invoke tag after a good invoke: the good call survives, the broken part (from the newline that
  // followed the good invoke) is content, raw.
  const std::string bad = "<｜DSML｜invoke nam=\"g\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const auto r = parse_all_chunkings("A\n\n<｜DSML｜tool_calls>\n" + invoke("f", param("a", true, "1")) + bad + EOS, kChat);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  EXPECT_EQ(r.content, "A\n" + bad);
  // Truncated block (finish by length): everything since the block start is content.
  const std::string cut = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x";
  const auto t = parse_all_chunkings("B" + cut, kChat);
  EXPECT_TRUE(t.tool_calls.empty());
  EXPECT_EQ(t.content, "B" + cut);
  // Garbage parameter tag.
  const std::string g = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter oops>v</｜DSML｜parameter>\n";
  const auto gp = parse_all_chunkings("C" + g + EOS, kChat);
  EXPECT_TRUE(gp.tool_calls.empty());
  EXPECT_EQ(gp.content, "C" + g);
}

TEST(CompletionTolerance, InvalidRawJsonValueBecomesAString) {
  const auto r = parse_all_chunkings(dsml(invoke("f", param("n", false, "not json"))) + EOS, kChat);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"n\": \"not json\"}");
}

TEST(CompletionTolerance, TextAfterEosIgnored) {
  const auto r = parse_all_chunkings("Hi" + EOS + "junk", kChat);
  EXPECT_EQ(r.content, "Hi");
}

TEST(CompletionParser, TokenBoundaryStreamingMatchesOneShot) {
  // Feed the decoded text token by token through the streaming detokenizer's granularity.
  const std::string text = "Let me check 天气.</think>\n\n" +
                           dsml(invoke("get_weather", param("location", true, "北京") + param("days", false, "3"))) + EOS;
  const auto& tok = testing::v4_tokenizer();
  const auto ids = tok.encode(text);
  CompletionParser p(kThink);
  for (TokenId id : ids) p.feed(tok.token_bytes(id));
  p.finish();
  expect_same(parse_completion(text, kThink), p.result(), "token by token");
  EXPECT_EQ(p.result().tool_calls.at(0).arguments, "{\"location\": \"北京\", \"days\": 3}");
}

}  // namespace
}  // namespace dsv4::text
