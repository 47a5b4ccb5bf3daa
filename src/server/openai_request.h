#pragma once
// Parsing and validation of OpenAI request bodies (/v1/chat/completions, /v1/completions) into a
// GenerationRequest. Everything a client can get wrong becomes an ApiError (400, or 404 for an unknown model)
// naming the field; nothing here may throw anything else for any input.
#include <string>
#include <string_view>

#include "runtime/generation.h"
#include "text/tokenizer.h"

namespace dsv4::server {

struct ParseContext {
  const text::Tokenizer& tok;
  int64_t max_context;
  std::string served_model_name;
  // Test hook (`dsv4 serve --enable-test-hooks`, never on by default): the request field "dsv4_test_completion"
  // (a string) replaces sampling with that exact completion text (tokenized, then EOS), so tests can drive DSML tool
  // calls and reasoning through the real parser / response / SSE code with a random-weight model. Tokens forced by
  // tool_choice stay forced: the script continues after them.
  bool test_hooks = false;
};

struct ApiRequest {
  bool chat = true;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  bool tools_offered = false;  // tools given and tool_choice != none
  GenerationRequest gen;       // prompt_ids, mode, sampling, stop, forced tokens
};

ApiRequest parse_chat_request_body(std::string_view body, const ParseContext& ctx);
ApiRequest parse_completion_request_body(std::string_view body, const ParseContext& ctx);

}  // namespace dsv4::server
