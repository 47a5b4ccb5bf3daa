#include "server/openai_request.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/api_error.h"
#include "text/chat_encoder.h"
#include "text/chat_request.h"
#include "text/py_json.h"

namespace dsv4::server {

using nlohmann::json;

namespace {

constexpr int32_t kEos = 1;

json parse_object(std::string_view body) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());  // rejects invalid UTF-8 inside strings
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "request body must be a JSON object");
  return j;
}

// Field accessors: absent or null -> default; present with the wrong type -> 400 naming the field.
const json* field(const json& j, const char* k) {
  auto it = j.find(k);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}
bool get_bool(const json& j, const char* k, bool def) {
  const json* v = field(j, k);
  if (!v) return def;
  if (!v->is_boolean()) bad_param(k, std::string("'") + k + "' must be a boolean");
  return v->get<bool>();
}
double get_number(const json& j, const char* k, double def, double lo, double hi) {
  const json* v = field(j, k);
  if (!v) return def;
  if (!v->is_number()) bad_param(k, std::string("'") + k + "' must be a number");
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad_param(k, std::string("'") + k + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return d;
}
int64_t get_int(const json& j, const char* k, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(j, k);
  if (!v) return def;
  if (!v->is_number_integer()) bad_param(k, std::string("'") + k + "' must be an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    bad_param(k, std::string("'") + k + "' is too large");
  int64_t i = v->get<int64_t>();
  if (i < lo || i > hi)
    bad_param(k, std::string("'") + k + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return i;
}

// The fields both endpoints share: model, n, stream, sampling, max tokens, stop, seed.
void parse_common(const json& j, const ParseContext& ctx, ApiRequest& r) {
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) bad_param("model", "'model' must be a string");
    r.model = m->get<std::string>();
    if (r.model != ctx.served_model_name)
      throw ApiError(404, "The model '" + r.model + "' does not exist (this server serves '" +
                              ctx.served_model_name + "')", "invalid_request_error", "model", "model_not_found");
  }
  r.model = ctx.served_model_name;
  if (get_int(j, "n", 1, 1, 1 << 20) != 1) bad_param("n", "only n=1 is supported");
  if (get_int(j, "best_of", 1, 1, 1 << 20) != 1) bad_param("best_of", "only best_of=1 is supported");
  r.stream = get_bool(j, "stream", false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad_param("stream_options", "'stream_options' must be an object");
    if (!r.stream) bad_param("stream_options", "'stream_options' is only allowed with stream=true");
    r.include_usage = get_bool(*so, "include_usage", false);
  }
  SamplingParams& s = r.gen.sampling;
  s.temperature = static_cast<float>(get_number(j, "temperature", 1.0, 0.0, 2.0));
  s.top_p = static_cast<float>(get_number(j, "top_p", 1.0, 0.0, 1.0));
  if (s.top_p <= 0) bad_param("top_p", "'top_p' must be > 0");
  int64_t top_k = get_int(j, "top_k", 0, -1, 1 << 30);
  s.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);  // -1 = off (vLLM convention)
  s.min_p = static_cast<float>(get_number(j, "min_p", 0.0, 0.0, 1.0));
  s.presence_penalty = static_cast<float>(get_number(j, "presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = static_cast<float>(get_number(j, "frequency_penalty", 0.0, -2.0, 2.0));
  s.repetition_penalty = static_cast<float>(get_number(j, "repetition_penalty", 1.0, 0.01, 10.0));
  s.seed = static_cast<uint64_t>(get_int(j, "seed", 0, INT64_MIN, INT64_MAX));
  int64_t max_tokens = get_int(j, "max_tokens", -1, 0, INT32_MAX);
  max_tokens = get_int(j, "max_completion_tokens", max_tokens, 0, INT32_MAX);
  // Default and oversized limits are clipped to the context left after the prompt (finish_reason "length").
  r.gen.max_tokens = max_tokens < 0 ? INT32_MAX : static_cast<int>(max_tokens);
  if (const json* st = field(j, "stop")) {
    if (st->is_string()) {
      r.gen.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 16) bad_param("stop", "at most 16 stop strings");
      for (const json& e : *st) {
        if (!e.is_string()) bad_param("stop", "'stop' must be a string or a list of strings");
        r.gen.stop.push_back(e.get<std::string>());
      }
    } else {
      bad_param("stop", "'stop' must be a string or a list of strings");
    }
    for (const auto& x : r.gen.stop)
      if (x.empty()) bad_param("stop", "stop strings must not be empty");
  }
}

void finish_prompt(ApiRequest& r, const json& j, const ParseContext& ctx) {
  if (r.gen.prompt_ids.empty()) bad_param(r.chat ? "messages" : "prompt", "the prompt is empty");
  const int64_t n = static_cast<int64_t>(r.gen.prompt_ids.size());
  if (n >= ctx.max_context)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(ctx.max_context) +
                            " tokens, but the prompt has " + std::to_string(n) + " tokens",
                   "invalid_request_error", r.chat ? "messages" : "prompt", "context_length_exceeded");
  for (int32_t t : r.gen.prompt_ids)
    if (t < 0 || t >= ctx.tok.vocab_size()) bad_param("prompt", "token id " + std::to_string(t) + " is out of range");
  if (const json* t = field(j, "dsv4_test_completion")) {
    if (!ctx.test_hooks) bad_param("dsv4_test_completion", "test hooks are disabled on this server");
    if (!t->is_string()) bad_param("dsv4_test_completion", "must be a string");
    // The script stands for what the model samples: tool_choice forcing still applies around it (a forced DSML
    // opening comes first in chat mode, or right after the script's </think> in thinking mode).
    ctx.tok.encode_append(t->get<std::string>(), r.gen.forced);
    r.gen.forced.push_back(kEos);
  }
}

text::PyJson to_py(std::string_view body) {
  try {
    return text::py_json_loads(body);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what());
  }
}

void check_tools(const json& tools) {
  if (!tools.is_array()) bad_param("tools", "'tools' must be a list");
  for (const json& t : tools) {
    if (!t.is_object() || t.value("type", json("function")) != "function")
      bad_param("tools", "each tool must be an object with \"type\": \"function\"");
    const json* f = field(t, "function");
    if (!f || !f->is_object()) bad_param("tools", "each tool needs a \"function\" object");
    const json* name = field(*f, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      bad_param("tools", "each function needs a non-empty string \"name\"");
    if (const json* p = field(*f, "parameters"); p && !p->is_object())
      bad_param("tools", "a function's \"parameters\" must be an object");
  }
}

}  // namespace

ApiRequest parse_chat_request_body(std::string_view body, const ParseContext& ctx) {
  const json j = parse_object(body);
  ApiRequest r;
  r.chat = true;
  parse_common(j, ctx, r);
  r.logprobs = get_bool(j, "logprobs", false);
  r.top_logprobs = static_cast<int>(get_int(j, "top_logprobs", 0, 0, 20));
  if (r.top_logprobs > 0 && !r.logprobs) bad_param("top_logprobs", "'top_logprobs' requires 'logprobs': true");
  r.gen.sampling.top_logprobs = r.top_logprobs;

  const json* messages = field(j, "messages");
  if (!messages || !messages->is_array() || messages->empty()) bad_param("messages", "'messages' must be a non-empty list");
  for (const json& m : *messages) {
    if (!m.is_object()) bad_param("messages", "each message must be an object");
    const json* role = field(m, "role");
    if (!role || !role->is_string()) bad_param("messages", "each message needs a string 'role'");
    const json* content = field(m, "content");
    if (content && !content->is_string() && !content->is_array())
      bad_param("messages", "a message's 'content' must be a string, a list of parts or null");
    if (content && content->is_array())
      for (const json& part : *content)
        if (!part.is_object() || !part.contains("text") || !part["text"].is_string() ||
            part.value("type", json("text")) != "text")
          bad_param("messages", "only text content parts are supported");
  }
  const json* tools = field(j, "tools");
  if (tools) check_tools(*tools);

  // tool_choice: none drops the tools from the prompt; required/named force the DSML opening (after </think> in
  // thinking mode, so the reasoning is kept).
  std::string choice = tools && !tools->empty() ? "auto" : "none";
  std::string forced_name;
  if (const json* tc = field(j, "tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        bad_param("tool_choice", "'tool_choice' must be none, auto, required or {\"type\":\"function\",...}");
    } else if (tc->is_object()) {
      const json* f = field(*tc, "function");
      const json* name = f && f->is_object() ? field(*f, "name") : nullptr;
      if (!name || !name->is_string()) bad_param("tool_choice", "a named tool_choice needs function.name");
      forced_name = name->get<std::string>();
      choice = "named";
    } else {
      bad_param("tool_choice", "'tool_choice' must be a string or an object");
    }
    if (choice != "none" && (!tools || tools->empty()))
      bad_param("tool_choice", "'tool_choice' " + choice + " needs 'tools'");
    if (choice == "named") {
      bool found = false;
      for (const json& t : *tools) found = found || t["function"]["name"] == forced_name;
      if (!found) bad_param("tool_choice", "tool_choice names '" + forced_name + "', which is not in 'tools'");
    }
  }
  r.tools_offered = choice != "none";

  // Thinking: chat_template_kwargs.thinking (or enable_thinking) and reasoning_effort; default chat mode (vLLM's
  // convention for DeepSeek-V4). reasoning_effort none -> chat; high/max -> thinking with that effort.
  bool thinking = false;
  std::optional<std::string> effort;
  if (const json* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) bad_param("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    thinking = get_bool(*kw, "enable_thinking", thinking);
    thinking = get_bool(*kw, "thinking", thinking);
  }
  if (const json* e = field(j, "reasoning_effort")) {
    if (!e->is_string()) bad_param("reasoning_effort", "'reasoning_effort' must be a string");
    const std::string v = e->get<std::string>();
    if (v == "none") {
      thinking = false;
    } else if (v == "high" || v == "max") {
      thinking = true;
      effort = v;
    } else if (v == "minimal" || v == "low" || v == "medium") {
      thinking = true;  // V4 has no lower effort levels: plain thinking
    } else {
      bad_param("reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium, high or max");
    }
  }
  if (const json* rf = field(j, "response_format")) {
    if (!rf->is_object() || rf->value("type", json("")) != "text")
      bad_param("response_format", "only response_format {\"type\": \"text\"} is supported");
  }

  // The official encoder needs Python-JSON values (key order, number spelling): re-read the body as PyJson.
  const text::PyJson py = to_py(body);
  text::PyJson req = text::PyJson::object();
  req.set("messages", *py.get("messages"));
  if (r.tools_offered && tools) req.set("tools", *py.get("tools"));
  req.set("thinking_mode", text::PyJson::string(thinking ? "thinking" : "chat"));
  if (effort) req.set("reasoning_effort", text::PyJson::string(*effort));
  std::string prompt;
  try {
    text::ChatRequest cr = text::chat_request_from_json(req);
    prompt = text::encode_chat(cr.messages, cr.options);
    r.gen.mode = cr.options.mode;
    r.gen.prompt_ids = ctx.tok.encode(prompt);
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    bad_param("messages", std::string("cannot render the conversation: ") + e.what());
  }
  if (choice == "required" || choice == "named") {
    std::string open = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"";
    if (choice == "named") open += forced_name + "\">\n";
    (thinking ? r.gen.forced_after_think : r.gen.forced) = ctx.tok.encode(open);
  }
  finish_prompt(r, j, ctx);
  return r;
}

ApiRequest parse_completion_request_body(std::string_view body, const ParseContext& ctx) {
  const json j = parse_object(body);
  ApiRequest r;
  r.chat = false;
  parse_common(j, ctx, r);
  r.gen.parse = false;  // raw text continuation: no reasoning / tool-call split
  r.gen.mode = text::ThinkingMode::kChat;
  const int64_t lp = get_int(j, "logprobs", -1, 0, 20);
  r.logprobs = lp >= 0;
  r.top_logprobs = lp > 0 ? static_cast<int>(lp) : 0;
  r.gen.sampling.top_logprobs = r.top_logprobs;
  if (get_bool(j, "echo", false)) bad_param("echo", "echo is not supported");
  if (field(j, "suffix")) bad_param("suffix", "suffix is not supported");
  const json* p = field(j, "prompt");
  if (!p) bad_param("prompt", "'prompt' is required");
  // A string, a list with one string, a list of token ids, or a list with one list of token ids.
  const json* one = p;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) one = &(*p)[0];
  try {
    if (one->is_string()) {
      r.gen.prompt_ids = ctx.tok.encode(one->get<std::string>());
    } else if (one->is_array()) {
      for (const json& t : *one) {
        if (!t.is_number_integer()) bad_param("prompt", "'prompt' must be a string or a list of token ids (one prompt)");
        const int64_t v = t.get<int64_t>();
        if (v < 0 || v >= ctx.tok.vocab_size()) bad_param("prompt", "token id " + std::to_string(v) + " is out of range");
        r.gen.prompt_ids.push_back(static_cast<int32_t>(v));
      }
    } else {
      bad_param("prompt", "'prompt' must be a string or a list of token ids (one prompt)");
    }
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    bad_param("prompt", e.what());
  }
  finish_prompt(r, j, ctx);
  return r;
}

}  // namespace dsv4::server
