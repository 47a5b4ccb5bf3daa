#pragma once
// One completion: prefill the prompt through a Session (prefix reuse), sample until EOS / a stop string in the
// answer / max tokens, and stream the parsed deltas (reasoning, content, tool calls). Shared by `dsv4 run`,
// `dsv4 chat` and the server.
#include <functional>
#include <string>
#include <vector>

#include "dsv4/engine.h"
#include "text/completion_parser.h"
#include "text/tokenizer.h"

namespace dsv4 {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  text::ThinkingMode mode = text::ThinkingMode::kThinking;
  int max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;  // matched on answer content only, never on reasoning
};

struct GenerationTimings {
  int64_t prompt_tokens = 0;
  int64_t prompt_computed = 0;  // prompt tokens actually prefilled (the rest came from the session's prefix)
  int64_t generated_tokens = 0;
  double ttft_s = 0;            // prefill + first sample
  double prefill_s = 0;
  double decode_s = 0;          // after the first token
  double prefill_tok_s() const { return prefill_s > 0 ? static_cast<double>(prompt_computed) / prefill_s : 0; }
  double decode_tok_s() const {
    return decode_s > 0 && generated_tokens > 1 ? static_cast<double>(generated_tokens - 1) / decode_s : 0;
  }
};

struct GenerationResult {
  std::vector<int32_t> completion_ids;  // includes the EOS token when generation ended on it
  std::vector<SampledToken> sampled;    // per completion token (logprobs)
  std::string text;                     // decoded completion, EOS excluded
  text::ParsedCompletion parsed;        // reasoning_content / content (cut at a stop string) / tool_calls
  std::string finish_reason;            // "stop" (EOS or stop string) | "length" | "cancelled"
  GenerationTimings timings;
};

struct GenerationCallbacks {
  std::function<void(const text::CompletionDelta&)> on_delta;  // streamed pieces, already stop-string safe
  std::function<bool()> cancelled;                              // polled between tokens
};

GenerationResult generate(Session& session, const text::Tokenizer& tok, const GenerationRequest& req,
                          const GenerationCallbacks& cb = {});

}  // namespace dsv4
