#pragma once
// The DeepSeek-V4 chat-prompt encoder, byte-exact with the official encoding_dsv4.py (CHAT_FORMAT.md §2): tool
// messages merged into user turns and sorted by call order, drop_thinking, DSML tool calls, tools blocks,
// response_format, developer / latest_reminder / task messages, chat vs thinking transitions, reasoning effort.
// Messages are OpenAI-style JSON objects; the result is one string, meant to be tokenized as a whole.
#include <optional>
#include <string>

#include "text/py_json.h"

namespace dsv4::text {

enum class ThinkingMode { kChat, kThinking };

// Which reasoning-effort prefix table the checkpoint was trained with (§2.11).
enum class EffortTable {
  kOriginalV4,   // None | "high" (no prefix) | "max" ("Absolute maximum ...")
  kFlash0731,    // "low" (default, no prefix) | "high" ("Absolute maximum ...") | "max" ("Beyond maximum ...")
};

struct ChatOptions {
  ThinkingMode mode = ThinkingMode::kThinking;
  bool drop_thinking = true;
  bool add_bos = true;
  std::optional<std::string> reasoning_effort;  // nullopt = None
  EffortTable effort_table = EffortTable::kOriginalV4;
};

// Throws dsv4::Error where the official encoder raises (unknown role, empty developer content, invalid task or
// effort, malformed tool definitions) and on values a prompt cannot hold.
std::string encode_chat(const PyJson& messages, const ChatOptions& options);

// Pieces, exposed for tests.
std::string render_tools_block(const PyJson& tools);     // tools in OpenAI format: [{"type":..., "function":{...}}]
std::string render_dsml_parameters(const PyJson& arguments);  // a tool call's "arguments" (string or object)
std::string reasoning_effort_prefix(const std::optional<std::string>& effort, EffortTable table);

}  // namespace dsv4::text
