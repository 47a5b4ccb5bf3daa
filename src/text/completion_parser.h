#pragma once
// Streaming parser for DeepSeek-V4 completions (CHAT_FORMAT.md §3): splits generated text into reasoning, content
// and DSML tool calls. A byte-level state machine that holds back only bytes that could still start a marker (or
// finish a UTF-8 character), so feeding the text in any chunking gives the same result as parsing it at once.
//
// On well-formed output it agrees with the official strict parser (parse_message_from_completion_text), including
// the arguments JSON text it builds. Tolerance for known model misbehaviour (§3.4), never dropping text:
//   * thinking mode without </think>: a DSML block ends the reasoning; EOS inside reasoning with no tool call moves
//     the reasoning to content (the model answered without thinking);
//   * a stray </think> in content (chat mode, or a second one) is skipped;
//   * a DSML block not preceded by "\n\n": up to two newlines before it are stripped from content;
//   * malformed DSML: the complete invokes before the fault are kept as calls, the raw text of the faulty part is
//     returned as content;
//   * text after </｜DSML｜tool_calls>: whitespace is dropped, anything else is content;
//   * a string="false" value that is not valid JSON is passed as a JSON string instead of breaking the arguments;
//   * EOS is stripped; a missing EOS is allowed (finish by length).
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_encoder.h"

namespace dsv4::text {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON object text, built like the official parser: {"k": "v", "n": <raw>}
};

struct ParsedCompletion {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool saw_eos = false;                     // finished by EOS (else: by length)
  bool reasoning_moved_to_content = false;  // EOS reached inside reasoning: see the policy above
  std::vector<std::string> warnings;        // each tolerance rule that fired
};

// What one feed() adds. Streaming consumers send these; the final ParsedCompletion is authoritative (it differs
// from the concatenated deltas only when reasoning_moved_to_content is set).
struct CompletionDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
};

class CompletionParser {
 public:
  explicit CompletionParser(ThinkingMode mode);

  CompletionDelta feed(std::string_view chunk);
  // Ends the stream: flushes held-back text and applies the end-of-stream policies.
  CompletionDelta finish();
  const ParsedCompletion& result() const { return out_; }

 private:
  enum class State { kReasoning, kContent, kAfterBlock, kBlockOpen, kBlock, kInvokeHead, kInvokeBody, kParamValue, kDone };
  bool step(CompletionDelta& d);  // false: needs more input
  void emit_text(std::string_view text, CompletionDelta& d);
  void consume(std::size_t n, bool into_unit);
  void malformed(std::size_t upto, CompletionDelta& d, const char* why);
  bool finish_param(std::string_view text);
  void end_invoke(CompletionDelta& d);

  State state_;
  std::string buf_;          // input not consumed yet
  std::size_t searched_ = 0;  // prefix of buf_ already known to hold no complete marker start (block states)
  bool eof_ = false;
  bool saw_think_end_ = false;
  std::string unit_raw_;    // raw text of the DSML part not yet turned into calls (returned as content on a fault)
  ParsedToolCall call_;     // invoke being parsed
  std::vector<std::pair<std::string, std::string>> params_;  // key -> JSON value text
  ParsedCompletion out_;
};

// One-shot parse (same as feeding everything, then finish()).
ParsedCompletion parse_completion(std::string_view text, ThinkingMode mode);

}  // namespace dsv4::text
