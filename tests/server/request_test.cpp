// OpenAI request parsing/validation: every client mistake is an ApiError with the right status and field.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace dsv4::server {
namespace {

const text::Tokenizer& tok() {
  static text::Tokenizer t = text::Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/models/default/tokenizer.json");
  return t;
}
ParseContext ctx(bool hooks = false) { return ParseContext{tok(), 256, "deepseek-v4", hooks}; }

int status_of(const std::string& body, bool chat = true, bool hooks = false) {
  try {
    chat ? parse_chat_request_body(body, ctx(hooks)) : parse_completion_request_body(body, ctx(hooks));
  } catch (const ApiError& e) {
    return e.status;
  }
  return 200;
}

const char* kUser = R"("messages":[{"role":"user","content":"Hi"}])";

TEST(Request, ChatDefaultsAndSampling) {
  ApiRequest r = parse_chat_request_body(std::string("{") + kUser +
                                             R"(,"temperature":0.5,"top_p":0.9,"top_k":-1,"seed":42,"max_tokens":7,
                                                 "stop":"x","stream":true,"stream_options":{"include_usage":true}})",
                                         ctx());
  EXPECT_TRUE(r.chat);
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.gen.mode, text::ThinkingMode::kChat);  // default: chat mode
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_EQ(r.gen.sampling.top_k, 0);
  EXPECT_EQ(r.gen.sampling.seed, 42u);
  EXPECT_EQ(r.gen.max_tokens, 7);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"x"});
  EXPECT_FALSE(r.gen.prompt_ids.empty());
}

TEST(Request, ThinkingControls) {
  auto mode = [](const std::string& extra) {
    return parse_chat_request_body(std::string("{") + kUser + extra + "}", ctx()).gen.mode;
  };
  EXPECT_EQ(mode(R"(,"chat_template_kwargs":{"thinking":true})"), text::ThinkingMode::kThinking);
  EXPECT_EQ(mode(R"(,"reasoning_effort":"max")"), text::ThinkingMode::kThinking);
  EXPECT_EQ(mode(R"(,"chat_template_kwargs":{"thinking":true},"reasoning_effort":"none")"), text::ThinkingMode::kChat);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"reasoning_effort":"extreme"})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"chat_template_kwargs":{"thinking":"yes"}})"), 400);
}

TEST(Request, ToolChoice) {
  const std::string tools =
      R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}])";
  auto with = [&](const std::string& extra) { return parse_chat_request_body(std::string("{") + kUser + tools + extra + "}", ctx()); };
  ApiRequest a = with("");
  ApiRequest none = with(R"(,"tool_choice":"none")");
  EXPECT_TRUE(a.tools_offered);
  EXPECT_FALSE(none.tools_offered);
  EXPECT_LT(none.gen.prompt_ids.size(), a.gen.prompt_ids.size());  // none: tools left out of the prompt
  EXPECT_TRUE(a.gen.forced.empty());
  ApiRequest named = with(R"(,"tool_choice":{"type":"function","function":{"name":"f"}})");
  EXPECT_EQ(tok().decode(named.gen.forced), "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n");
  ApiRequest req_think = with(R"(,"tool_choice":"required","chat_template_kwargs":{"thinking":true})");
  EXPECT_TRUE(req_think.gen.forced.empty());  // thinking: forced only after </think>
  EXPECT_FALSE(req_think.gen.forced_after_think.empty());
  EXPECT_EQ(status_of(std::string("{") + kUser + tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"tool_choice":"required"})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"tools":[{"type":"function","function":{}}]})"), 400);
}

TEST(Request, Errors) {
  EXPECT_EQ(status_of("not json"), 400);
  EXPECT_EQ(status_of("[1,2]"), 400);
  EXPECT_EQ(status_of("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}"), 400);  // invalid UTF-8
  EXPECT_EQ(status_of("{}"), 400);
  EXPECT_EQ(status_of(R"({"messages":[]})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"wizard","content":"x"}]})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":5}]})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"n":2})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"temperature":"hot"})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"temperature":5})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"max_tokens":1e400})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"max_tokens":-1})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"seed":123456789012345678901234567890})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"stop":[1]})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"top_logprobs":3})"), 400);  // needs logprobs
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"stream_options":{"include_usage":true}})"), 400);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"model":"gpt-4"})"), 404);
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"dsv4_test_completion":"x"})"), 400);  // hooks off
  EXPECT_EQ(status_of(std::string("{") + kUser + R"(,"dsv4_test_completion":"x"})", true, true), 200);
  std::string deep = R"({"messages":[{"role":"user","content":"x"}],"extra":)" + std::string(5000, '[') + std::string(5000, ']') + "}";
  EXPECT_EQ(status_of(deep), 400);
  std::string longp = R"({"messages":[{"role":"user","content":")";
  for (int i = 0; i < 300; ++i) longp += "word ";
  longp += "\"}]}";
  try {
    parse_chat_request_body(longp, ctx());
    FAIL() << "prompt longer than the context accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "context_length_exceeded");
  }
}

TEST(Request, CompletionPromptForms) {
  EXPECT_EQ(parse_completion_request_body(R"({"prompt":[5,6,7]})", ctx()).gen.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(parse_completion_request_body(R"({"prompt":[[5,6]]})", ctx()).gen.prompt_ids, (std::vector<int32_t>{5, 6}));
  ApiRequest r = parse_completion_request_body(R"({"prompt":"Hello","logprobs":2})", ctx());
  EXPECT_FALSE(r.gen.parse);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(status_of(R"({"prompt":[-1]})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":[999999999]})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":["a","b"]})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":""})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":"x","echo":true})", false), 400);
  EXPECT_EQ(status_of(R"({"max_tokens":3})", false), 400);
}

}  // namespace
}  // namespace dsv4::server
