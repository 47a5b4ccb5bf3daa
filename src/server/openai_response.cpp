#include "server/openai_response.h"

#include "server/sse.h"

namespace dsv4::server {

using nlohmann::json;

ResponseBuilder::ResponseBuilder(const ApiRequest& req, const text::Tokenizer& tok, std::string id, int64_t created)
    : req_(req), tok_(tok), id_(std::move(id)), created_(created) {
  req_.gen.prompt_ids.clear();  // not needed here; keep the copy small
  req_.gen.forced.clear();
}

std::string ResponseBuilder::finish_reason(const GenerationResult& r) {
  if (!r.parsed.tool_calls.empty() && r.finish_reason == "stop") return "tool_calls";
  return r.finish_reason == "cancelled" ? "stop" : r.finish_reason;
}

json ResponseBuilder::usage(const GenerationResult& r) const {
  const auto& t = r.timings;
  return {{"prompt_tokens", t.prompt_tokens},
          {"completion_tokens", t.generated_tokens},
          {"total_tokens", t.prompt_tokens + t.generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", t.prompt_tokens - t.prompt_computed}}}};
}

std::string ResponseBuilder::token_text(int32_t id) const {
  std::vector<int32_t> one{id};
  return tok_.decode(one);  // lossy: a partial UTF-8 token shows as U+FFFD; `bytes` carries the exact bytes
}

std::string ResponseBuilder::call_id(size_t index) const {
  // Unique per response: the response id's random part plus the call's index.
  return "call_" + id_.substr(id_.find('-') + 1) + "_" + std::to_string(index);
}

json ResponseBuilder::logprob_entry(const SampledToken& t) const {
  auto one = [&](int32_t id, float lp) {
    std::string_view raw = tok_.token_bytes(id);
    json bytes = json::array();
    for (unsigned char c : raw) bytes.push_back(static_cast<int>(c));
    return json{{"token", token_text(id)}, {"logprob", lp}, {"bytes", bytes}};
  };
  json e = one(t.token, t.logprob);
  json top = json::array();
  for (size_t i = 0; i < t.top.size() && static_cast<int>(i) < req_.top_logprobs; ++i)
    top.push_back(one(t.top[i].token, t.top[i].logprob));
  e["top_logprobs"] = top;
  return e;
}

json ResponseBuilder::completion_logprobs(const std::vector<SampledToken>& ts, size_t text_offset) const {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t off = text_offset;
  for (const auto& t : ts) {
    std::string s = token_text(t.token);
    tokens.push_back(s);
    lps.push_back(t.logprob);
    json top = json::object();
    for (size_t i = 0; i < t.top.size() && static_cast<int>(i) < req_.top_logprobs; ++i)
      top[token_text(t.top[i].token)] = t.top[i].logprob;
    tops.push_back(top);
    offs.push_back(off);
    off += s.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json ResponseBuilder::take_logprobs() {
  if (!req_.logprobs) return nullptr;
  json out;
  if (req_.chat) {
    json content = json::array();
    for (const auto& t : pending_) content.push_back(logprob_entry(t));
    out = {{"content", content}};
  } else {
    out = completion_logprobs(pending_, text_offset_);
    for (const auto& t : pending_) text_offset_ += token_text(t.token).size();
  }
  pending_.clear();
  return out;
}

json ResponseBuilder::chunk(json choice) const {
  return {{"id", id_},
          {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", req_.model},
          {"choices", json::array({std::move(choice)})}};
}

std::string ResponseBuilder::stream_begin() {
  if (!req_.chat) return "";
  return sse::event(chunk({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                           {"finish_reason", nullptr}}));
}

std::string ResponseBuilder::stream_event(const RequestEvent& e) {
  std::string out;
  if (e.kind == RequestEvent::Kind::Token) {
    if (req_.logprobs && e.sampled.token != 1) pending_.push_back(e.sampled);  // EOS carries no text
    const auto& d = e.delta;
    if (req_.chat) {
      if (!d.reasoning.empty() || !d.content.empty()) {
        json delta = json::object();
        if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
        if (!d.content.empty()) delta["content"] = d.content;
        out += sse::event(chunk({{"index", 0}, {"delta", delta}, {"logprobs", take_logprobs()}, {"finish_reason", nullptr}}));
      }
      for (const auto& tc : d.tool_calls) {
        const size_t k = tool_calls_sent_++;
        json head = {{"index", k}, {"id", call_id(k)}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", ""}}}};
        out += sse::event(chunk({{"index", 0}, {"delta", {{"tool_calls", json::array({head})}}}, {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}));
        json args = {{"index", k}, {"function", {{"arguments", tc.arguments}}}};
        out += sse::event(chunk({{"index", 0}, {"delta", {{"tool_calls", json::array({args})}}}, {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}));
      }
    } else if (!d.content.empty()) {
      out += sse::event(chunk({{"index", 0}, {"text", d.content}, {"logprobs", take_logprobs()}, {"finish_reason", nullptr}}));
    }
    return out;
  }
  if (e.kind == RequestEvent::Kind::Error) {
    out += sse::event({{"error", {{"message", e.error}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}});
    return out + sse::done();
  }
  const GenerationResult& r = e.result;
  json fin = {{"index", 0}, {"logprobs", req_.logprobs && !pending_.empty() ? take_logprobs() : json(nullptr)},
              {"finish_reason", finish_reason(r)}};
  if (req_.chat)
    fin["delta"] = json::object();
  else
    fin["text"] = "";
  out += sse::event(chunk(fin));
  if (req_.include_usage) {
    json u = chunk(nullptr);
    u["choices"] = json::array();
    u["usage"] = usage(r);
    out += sse::event(u);
  }
  return out + sse::done();
}

json ResponseBuilder::complete(const GenerationResult& r) const {
  json logprobs = nullptr;
  std::vector<SampledToken> toks;
  for (size_t i = 0; i < r.sampled.size(); ++i)
    if (r.completion_ids[i] != 1) toks.push_back(r.sampled[i]);
  json choice = {{"index", 0}, {"finish_reason", finish_reason(r)}};
  if (req_.chat) {
    if (req_.logprobs) {
      json content = json::array();
      for (const auto& t : toks) content.push_back(logprob_entry(t));
      logprobs = {{"content", content}};
    }
    json msg = {{"role", "assistant"}};
    const auto& p = r.parsed;
    msg["content"] = p.content.empty() && !p.tool_calls.empty() ? json(nullptr) : json(p.content);
    if (req_.gen.mode == text::ThinkingMode::kThinking || !p.reasoning_content.empty())
      msg["reasoning_content"] = p.reasoning_content;
    if (!p.tool_calls.empty()) {
      json calls = json::array();
      for (size_t k = 0; k < p.tool_calls.size(); ++k)
        calls.push_back({{"id", call_id(k)}, {"type", "function"},
                         {"function", {{"name", p.tool_calls[k].name}, {"arguments", p.tool_calls[k].arguments}}}});
      msg["tool_calls"] = calls;
    }
    choice["message"] = msg;
  } else {
    if (req_.logprobs) logprobs = completion_logprobs(toks, 0);
    choice["text"] = r.parsed.content;
  }
  choice["logprobs"] = logprobs;
  return {{"id", id_},
          {"object", req_.chat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", req_.model},
          {"choices", json::array({choice})},
          {"usage", usage(r)}};
}

}  // namespace dsv4::server
