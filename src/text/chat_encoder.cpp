// The official encoder's pipeline (CHAT_FORMAT.md §2.2-§2.10): merge tool messages, sort tool results, drop old
// reasoning, then render each message followed by its transition. Messages stay JSON objects throughout, exactly
// as the reference manipulates dicts, so that "absent", null and falsy keep their distinct meanings.
#include <algorithm>
#include <map>

#include "core/error.h"
#include "text/chat_encoder.h"
#include "text/chat_tokens.h"

namespace dsv4::text {
namespace {

using Msgs = std::vector<PyJson>;

std::string role_of(const PyJson& m) {
  const PyJson* r = m.get("role");
  return r && r->is_string() ? r->as_string() : std::string();
}

bool has_task(const PyJson& m) {
  const PyJson* t = m.get("task");
  return t && !t->is_null();
}

// A JSON value compared the way Python compares dict keys of the same type: by its serialized form.
std::string id_key(const PyJson* v) { return v ? py_json_dumps(*v) : py_json_dumps(PyJson::string("")); }

// §2.8: role "tool" disappears into user messages holding content blocks.
Msgs merge_tool_messages(const PyJson& messages) {
  Msgs merged;
  for (const PyJson& msg : messages.items()) {
    if (!msg.is_object()) fail("each message must be a JSON object");
    const std::string role = role_of(msg);
    if (role == "tool") {
      const PyJson* id = msg.get("tool_call_id");
      const PyJson* content = msg.get("content");
      PyJson block = PyJson::object({{"type", PyJson::string("tool_result")},
                                     {"tool_use_id", id ? *id : PyJson::string("")},
                                     {"content", content ? *content : PyJson::string("")}});
      if (!merged.empty() && role_of(merged.back()) == "user" && merged.back().get("content_blocks")) {
        PyJson blocks = *merged.back().get("content_blocks");
        blocks.items().push_back(std::move(block));
        merged.back().set("content_blocks", std::move(blocks));
      } else {
        merged.push_back(PyJson::object({{"role", PyJson::string("user")},
                                         {"content_blocks", PyJson::array({std::move(block)})}}));
      }
    } else if (role == "user") {
      const PyJson* content = msg.get("content");
      const PyJson text = content ? *content : PyJson::string("");
      PyJson block = PyJson::object({{"type", PyJson::string("text")}, {"text", text}});
      if (!merged.empty() && role_of(merged.back()) == "user" && merged.back().get("content_blocks") &&
          !has_task(merged.back())) {
        PyJson blocks = *merged.back().get("content_blocks");
        blocks.items().push_back(std::move(block));
        merged.back().set("content_blocks", std::move(blocks));
      } else {
        PyJson m = PyJson::object({{"role", PyJson::string("user")},
                                   {"content", text},
                                   {"content_blocks", PyJson::array({std::move(block)})}});
        for (const char* key : {"task", "wo_eos", "mask"})
          if (const PyJson* v = msg.get(key)) m.set(key, *v);
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

// §2.8: tool results of one user turn are put back into the order of the calls of the latest assistant turn.
void sort_tool_results_by_call_order(Msgs& msgs) {
  std::map<std::string, long> order;
  for (PyJson& msg : msgs) {
    const std::string role = role_of(msg);
    const PyJson* calls = msg.get("tool_calls");
    if (role == "assistant" && calls && calls->truthy()) {
      order.clear();
      if (!calls->is_array()) fail("tool_calls must be a list");
      long idx = 0;
      for (const PyJson& tc : calls->items()) {
        const PyJson* id = tc.get("id");
        if (!(id && id->truthy())) {
          const PyJson* fn = tc.get("function");
          id = fn ? fn->get("id") : nullptr;
        }
        if (id && id->truthy()) order[id_key(id)] = idx;  // duplicate ids: the last call wins
        ++idx;
      }
    } else if (role == "user" && msg.get("content_blocks") && msg.get("content_blocks")->truthy()) {
      PyJson blocks = *msg.get("content_blocks");
      std::vector<PyJson> results;
      for (const PyJson& b : blocks.items()) {
        const PyJson* t = b.get("type");
        if (t && t->is_string() && t->as_string() == "tool_result") results.push_back(b);
      }
      if (results.size() <= 1 || order.empty()) continue;
      auto rank = [&](const PyJson& b) {
        auto it = order.find(id_key(b.get("tool_use_id")));
        return it == order.end() ? 0L : it->second;  // unknown ids sort as 0 (Python's dict.get(id, 0))
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const PyJson& a, const PyJson& b) { return rank(a) < rank(b); });
      std::size_t next = 0;
      for (PyJson& b : blocks.items()) {
        const PyJson* t = b.get("type");
        if (t && t->is_string() && t->as_string() == "tool_result") b = results[next++];
      }
      msg.set("content_blocks", std::move(blocks));
    }
  }
}

long last_user_index(const Msgs& msgs) {
  for (long i = static_cast<long>(msgs.size()) - 1; i >= 0; --i) {
    const std::string r = role_of(msgs[i]);
    if (r == "user" || r == "developer") return i;
  }
  return -1;
}

// §2.5: reasoning of turns before the last user message is removed; developer (and unknown) messages there vanish.
Msgs drop_thinking_messages(const Msgs& msgs) {
  const long last_user = last_user_index(msgs);
  Msgs out;
  for (long i = 0; i < static_cast<long>(msgs.size()); ++i) {
    const std::string r = role_of(msgs[i]);
    if (r == "user" || r == "system" || r == "tool" || r == "latest_reminder" || r == "direct_search_results" ||
        i >= last_user) {
      out.push_back(msgs[i]);
    } else if (r == "assistant") {
      PyJson m = msgs[i];
      m.erase("reasoning_content");
      out.push_back(std::move(m));
    }
  }
  return out;
}

// `value or ""` followed by str.format.
std::string text_or_empty(const PyJson* v, std::string_view what) {
  return v && v->truthy() ? py_format_scalar(*v, what) : std::string();
}

std::string flatten_tool_content(const PyJson* content) {
  if (!content) return "";
  if (!content->is_array()) return py_format_scalar(*content, "tool message content");
  std::string out;
  bool first = true;
  for (const PyJson& b : content->items()) {
    if (!first) out += "\n\n";
    first = false;
    const PyJson* type = b.get("type");
    if (type && type->is_string() && type->as_string() == "text") {
      const PyJson* t = b.get("text");
      out += t ? py_format_scalar(*t, "tool content text") : "";
    } else {
      out += "[Unsupported " + (type ? py_format_scalar(*type, "content block type") : std::string("None")) + "]";
    }
  }
  return out;
}

std::string render_user_blocks(const PyJson& blocks) {
  std::string out;
  bool first = true;
  for (const PyJson& b : blocks.items()) {
    if (!first) out += "\n\n";
    first = false;
    const PyJson* type = b.get("type");
    const std::string t = type && type->is_string() ? type->as_string() : "";
    if (t == "text") {
      const PyJson* text = b.get("text");
      // A null user content renders as "" (§2.14 quirk 8).
      if (text && !text->is_null()) out += py_format_scalar(*text, "user content");
    } else if (t == "tool_result") {
      out += "<tool_result>" + flatten_tool_content(b.get("content")) + "</tool_result>";
    } else {
      out += "[Unsupported " + (type ? py_format_scalar(*type, "content block type") : std::string("None")) + "]";
    }
  }
  return out;
}

std::string render_dsml_block(const PyJson& calls) {
  std::string invokes;
  bool first = true;
  for (const PyJson& tc : calls.items()) {
    const PyJson* fn = tc.get("function");
    if (!fn || !fn->is_object()) fail("each tool call needs a \"function\" object");
    const PyJson* name = fn->get("name");
    const PyJson* args = fn->get("arguments");
    if (!name) fail("tool call function needs a \"name\"");
    if (!args) fail("tool call function needs \"arguments\"");
    if (!first) invokes += '\n';
    first = false;
    invokes += "<\uFF5CDSML\uFF5Cinvoke name=\"" + py_format_scalar(*name, "tool call name") + "\">\n" +
               render_dsml_parameters(*args) + "\n</\uFF5CDSML\uFF5Cinvoke>";
  }
  return "\n\n" + std::string(chat::kToolCallsOpen) + "\n" + invokes + "\n" + std::string(chat::kToolCallsClose);
}

std::string response_format_block(const PyJson& rf) {
  return "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
         py_json_dumps(rf);
}

std::string render_message(long index, const Msgs& msgs, const ChatOptions& opt, bool drop) {
  const bool thinking = opt.mode == ThinkingMode::kThinking;
  const PyJson& msg = msgs[index];
  const long last_user = last_user_index(msgs);
  const std::string role = role_of(msg);
  const PyJson* tools = msg.get("tools");
  const PyJson* rf = msg.get("response_format");
  std::string prompt;
  const std::string effort = reasoning_effort_prefix(opt.reasoning_effort, opt.effort_table);
  if (index == 0 && thinking) prompt += effort;

  if (role == "system") {
    prompt += text_or_empty(msg.get("content"), "system content");
    if (tools && tools->truthy()) prompt += "\n\n" + render_tools_block(*tools);
    if (rf && rf->truthy()) prompt += response_format_block(*rf);
  } else if (role == "developer") {
    const PyJson* content = msg.get("content");
    if (!content || !content->truthy()) fail("developer message needs non-empty content");
    prompt += std::string(chat::kUser) + py_format_scalar(*content, "developer content");
    if (tools && tools->truthy()) prompt += "\n\n" + render_tools_block(*tools);
    if (rf && rf->truthy()) prompt += response_format_block(*rf);
  } else if (role == "user") {
    prompt += chat::kUser;
    const PyJson* blocks = msg.get("content_blocks");
    if (blocks && blocks->truthy())
      prompt += render_user_blocks(*blocks);
    else
      prompt += text_or_empty(msg.get("content"), "user content");
  } else if (role == "latest_reminder") {
    const PyJson* content = msg.get("content");
    prompt += std::string(chat::kLatestReminder) + (content ? py_format_scalar(*content, "latest_reminder content")
                                                            : std::string("None"));
  } else if (role == "assistant") {
    std::string thinking_part;
    const bool prev_has_task = index > 0 && has_task(msgs[index - 1]);
    if (thinking && !prev_has_task && (!drop || index > last_user))
      thinking_part = text_or_empty(msg.get("reasoning_content"), "reasoning_content") + std::string(chat::kThinkEnd);
    const PyJson* calls = msg.get("tool_calls");
    std::string tc;
    if (calls && calls->truthy()) {
      if (!calls->is_array()) fail("tool_calls must be a list");
      tc = render_dsml_block(*calls);
    }
    prompt += thinking_part + text_or_empty(msg.get("content"), "assistant content") + tc;
    const PyJson* wo_eos = msg.get("wo_eos");
    if (!(wo_eos && wo_eos->truthy())) prompt += chat::kEos;
  } else if (role == "tool") {
    fail("internal: tool message survived merging");
  } else {
    fail("unknown message role '", role, "'");
  }

  // §2.4: the transition; nothing when the next message is not an assistant / latest_reminder.
  if (index + 1 < static_cast<long>(msgs.size())) {
    const std::string next = role_of(msgs[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return prompt;
  }
  if (has_task(msg)) {
    const PyJson& task = *msg.get("task");
    static const std::map<std::string, std::string> kTaskTokens = {
        {"action", "<\uFF5Caction\uFF5C>"}, {"query", "<\uFF5Cquery\uFF5C>"},
        {"authority", "<\uFF5Cauthority\uFF5C>"}, {"domain", "<\uFF5Cdomain\uFF5C>"},
        {"title", "<\uFF5Ctitle\uFF5C>"}, {"read_url", "<\uFF5Cread_url\uFF5C>"}};
    const auto it = task.is_string() ? kTaskTokens.find(task.as_string()) : kTaskTokens.end();
    if (it == kTaskTokens.end()) fail("invalid task ", py_json_dumps(task));
    if (it->first != "action") {
      prompt += it->second;
    } else {
      prompt += chat::kAssistant;
      prompt += thinking ? chat::kThinkStart : chat::kThinkEnd;
      prompt += it->second;
    }
  } else if (role == "user" || role == "developer") {
    prompt += chat::kAssistant;
    if (thinking && (!drop || index >= last_user))
      prompt += chat::kThinkStart;
    else
      prompt += chat::kThinkEnd;
  }
  return prompt;
}

}  // namespace

std::string encode_chat(const PyJson& messages, const ChatOptions& opt) {
  if (!messages.is_array()) fail("messages must be a list");
  reasoning_effort_prefix(opt.reasoning_effort, opt.effort_table);  // validates the effort in every mode
  Msgs msgs = merge_tool_messages(messages);
  sort_tool_results_by_call_order(msgs);
  bool drop = opt.drop_thinking;
  for (const PyJson& m : msgs) {
    const PyJson* tools = m.get("tools");
    if (tools && tools->truthy()) drop = false;  // tools anywhere keep every turn's reasoning (§2.5)
  }
  if (opt.mode == ThinkingMode::kThinking && drop) msgs = drop_thinking_messages(msgs);
  std::string prompt = opt.add_bos ? std::string(chat::kBos) : std::string();
  for (long i = 0; i < static_cast<long>(msgs.size()); ++i) prompt += render_message(i, msgs, opt, drop);
  return prompt;
}

}  // namespace dsv4::text
