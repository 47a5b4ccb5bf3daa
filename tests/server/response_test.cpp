// SSE framing and the OpenAI response/chunk shapes built from scheduler events.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/openai_response.h"
#include "server/sse.h"

namespace dsv4::server {
namespace {

using nlohmann::json;

const text::Tokenizer& tok() {
  static text::Tokenizer t = text::Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/models/default/tokenizer.json");
  return t;
}

// Splits an SSE text into its data payloads; checks the framing on the way.
std::vector<std::string> payloads(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t e = s.find("\n\n", p);
    EXPECT_NE(e, std::string::npos) << "unterminated event";
    if (e == std::string::npos) break;
    std::string ev = s.substr(p, e - p);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    EXPECT_EQ(ev.find('\n'), std::string::npos) << "one line per event";
    out.push_back(ev.substr(6));
    p = e + 2;
  }
  return out;
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse::event(json{{"a", "x\ny"}}), "data: {\"a\":\"x\\ny\"}\n\n");
  EXPECT_EQ(sse::done(), "data: [DONE]\n\n");
  // Invalid UTF-8 from a split character is replaced, never thrown on.
  std::string ev = sse::event(json{{"a", std::string("\xe4\xbd")}});
  EXPECT_NE(ev.find("\xef\xbf\xbd"), std::string::npos);
  EXPECT_EQ(error_body(ApiError(401, "no", "authentication_error", "", "invalid_api_key")),
            R"({"error":{"code":"invalid_api_key","message":"no","param":null,"type":"authentication_error"}})");
}

ApiRequest chat_req(bool usage, bool logprobs) {
  ApiRequest r;
  r.chat = true;
  r.model = "m";
  r.stream = true;
  r.include_usage = usage;
  r.logprobs = logprobs;
  r.gen.mode = text::ThinkingMode::kThinking;
  return r;
}

GenerationResult result_with_call() {
  GenerationResult g;
  g.finish_reason = "stop";
  g.parsed.reasoning_content = "r";
  g.parsed.tool_calls.push_back({"get", "{\"a\": 1}"});
  g.completion_ids = {10, 1};
  g.sampled = {SampledToken{10, -0.5f, {}}, SampledToken{1, -0.1f, {}}};
  g.timings.prompt_tokens = 9;
  g.timings.prompt_computed = 4;
  g.timings.generated_tokens = 2;
  return g;
}

TEST(Response, StreamToolCallNameThenArguments) {
  ResponseBuilder b(chat_req(true, false), tok(), "chatcmpl-abc", 1);
  std::string s = b.stream_begin();
  RequestEvent t;
  t.delta.reasoning = "r";
  t.sampled = SampledToken{10, -0.5f, {}};
  s += b.stream_event(t);
  RequestEvent c;
  c.delta.tool_calls.push_back({"get", "{\"a\": 1}"});
  c.sampled = SampledToken{1, -0.1f, {}};
  s += b.stream_event(c);
  RequestEvent d;
  d.kind = RequestEvent::Kind::Done;
  d.result = result_with_call();
  s += b.stream_event(d);
  auto p = payloads(s);
  ASSERT_EQ(p.size(), 7u);
  EXPECT_EQ(json::parse(p[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(json::parse(p[1])["choices"][0]["delta"]["reasoning_content"], "r");
  json name = json::parse(p[2])["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(name["function"]["name"], "get");
  EXPECT_EQ(name["function"]["arguments"], "");
  EXPECT_EQ(name["id"], "call_abc_0");
  json args = json::parse(p[3])["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(args["index"], 0);
  EXPECT_EQ(args["function"]["arguments"], "{\"a\": 1}");
  EXPECT_FALSE(args.contains("id"));
  EXPECT_EQ(json::parse(p[4])["choices"][0]["finish_reason"], "tool_calls");
  json u = json::parse(p[5]);
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 11);
  EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"], 5);
  EXPECT_EQ(p[6], "[DONE]");
}

TEST(Response, NonStreamMessage) {
  ResponseBuilder b(chat_req(false, true), tok(), "chatcmpl-abc", 1);
  json r = b.complete(result_with_call());
  json m = r["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null());  // only tool calls: content null
  EXPECT_EQ(m["reasoning_content"], "r");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"].size(), 1u);  // EOS has no logprob entry
  GenerationResult len;
  len.finish_reason = "length";
  EXPECT_EQ(ResponseBuilder::finish_reason(len), "length");
}

TEST(Response, ErrorEventEndsStream) {
  ResponseBuilder b(chat_req(false, false), tok(), "chatcmpl-x", 1);
  RequestEvent e;
  e.kind = RequestEvent::Kind::Error;
  e.error = "boom";
  auto p = payloads(b.stream_event(e));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(json::parse(p[0])["error"]["message"], "boom");
  EXPECT_EQ(p[1], "[DONE]");
}

}  // namespace
}  // namespace dsv4::server
