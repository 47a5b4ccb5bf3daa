#pragma once
// Server-sent events framing as the OpenAI streaming API uses it: each event is one `data: <json>` line followed by
// a blank line; the stream ends with `data: [DONE]`. Comments (`: ...`) are ignored by clients and serve as
// heartbeats that reveal a disconnected client (the write fails).
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dsv4::server::sse {

// `data: <compact json>\n\n`; invalid UTF-8 is replaced, never thrown on (model text can split characters).
std::string event(const nlohmann::json& payload);
inline std::string done() { return "data: [DONE]\n\n"; }
inline std::string heartbeat() { return ": keep-alive\n\n"; }

// JSON dump used for every response body: compact, lossy on invalid UTF-8.
std::string dump(const nlohmann::json& j);

}  // namespace dsv4::server::sse
