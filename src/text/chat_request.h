#pragma once
// A render request as the CLI (and later the server) receives it:
//   {"messages": [...], "tools": [...]?, "thinking_mode": "thinking"|"chat", "reasoning_effort": null|"high"|"max",
//    "drop_thinking": true|false, "reasoning_effort_table": "v4"|"0731"?, "add_bos": true|false?}
// Server conventions applied before the official encoder runs:
//   * request-level `tools` attach to the first system message, or to a new empty system message inserted at
//     index 0 when there is none (vLLM's convention). A system/developer message may also carry `tools` itself.
//   * an assistant message's `reasoning` (vLLM's key) is used as `reasoning_content` when the latter is absent.
#include <string_view>

#include "text/chat_encoder.h"
#include "text/py_json.h"

namespace dsv4::text {

struct ChatRequest {
  PyJson messages;  // array, ready for encode_chat
  ChatOptions options;
};

// Throws dsv4::Error on a malformed request (unknown thinking_mode, wrong types, tools given twice, ...).
ChatRequest parse_chat_request(std::string_view request_json);
ChatRequest chat_request_from_json(const PyJson& request);

}  // namespace dsv4::text
