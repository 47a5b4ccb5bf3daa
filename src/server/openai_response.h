#pragma once
// Turns one request's scheduler events into OpenAI response bodies: chat.completion / text_completion objects for
// non-streaming requests, chat.completion.chunk / text_completion SSE events for streaming ones. Tool calls get
// ids and JSON-string arguments; a stream sends each call as a name delta, then an arguments delta.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"
#include "server/scheduler.h"

namespace dsv4::server {

class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& req, const text::Tokenizer& tok, std::string id, int64_t created);

  // Streaming: the SSE text to send for the start of the stream / one event (possibly empty). After the Done or
  // Error event the returned text ends with `data: [DONE]`.
  std::string stream_begin();
  std::string stream_event(const RequestEvent& e);

  // Non-streaming: the whole response object for a finished generation.
  nlohmann::json complete(const GenerationResult& r) const;

  static std::string finish_reason(const GenerationResult& r);  // stop | length | tool_calls
  nlohmann::json usage(const GenerationResult& r) const;

 private:
  nlohmann::json chunk(nlohmann::json choice) const;
  nlohmann::json logprob_entry(const SampledToken& t) const;           // chat format
  nlohmann::json completion_logprobs(const std::vector<SampledToken>& ts, size_t text_offset) const;
  nlohmann::json take_logprobs();                                       // pending tokens, in the endpoint's format
  std::string token_text(int32_t id) const;
  std::string call_id(size_t index) const;

  ApiRequest req_;  // copy of the flags (chat, logprobs, model, include_usage)
  const text::Tokenizer& tok_;
  std::string id_;
  int64_t created_;
  size_t tool_calls_sent_ = 0;
  size_t text_offset_ = 0;
  std::vector<SampledToken> pending_;  // sampled tokens whose logprobs are not sent yet
};

}  // namespace dsv4::server
