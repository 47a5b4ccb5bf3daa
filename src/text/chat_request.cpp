#include "text/chat_request.h"

#include "core/error.h"

namespace dsv4::text {

ChatRequest chat_request_from_json(const PyJson& req) {
  if (!req.is_object()) fail("request must be a JSON object");
  ChatRequest out;
  const PyJson* messages = req.get("messages");
  if (!messages || !messages->is_array()) fail("request needs a \"messages\" list");
  std::vector<PyJson> msgs = messages->items();
  for (PyJson& m : msgs) {
    if (!m.is_object()) fail("each message must be a JSON object");
    if (!m.get("reasoning_content"))
      if (const PyJson* r = m.get("reasoning")) m.set("reasoning_content", *r);
  }

  if (const PyJson* tools = req.get("tools"); tools && !tools->is_null()) {
    if (!tools->is_array()) fail("\"tools\" must be a list");
    PyJson* target = nullptr;
    for (PyJson& m : msgs) {
      const PyJson* role = m.get("role");
      if (role && role->is_string() && role->as_string() == "system") {
        target = &m;
        break;
      }
    }
    if (!target) {
      msgs.insert(msgs.begin(), PyJson::object({{"role", PyJson::string("system")}, {"content", PyJson::string("")}}));
      target = &msgs.front();
    }
    const PyJson* own = target->get("tools");
    if (own && own->truthy() && tools->truthy())
      fail("tools given both on the request and on its first system message");
    if (tools->truthy() || !own) target->set("tools", *tools);
  }
  out.messages = PyJson::array(std::move(msgs));

  if (const PyJson* mode = req.get("thinking_mode"); mode && !mode->is_null()) {
    if (!mode->is_string()) fail("\"thinking_mode\" must be \"thinking\" or \"chat\"");
    if (mode->as_string() == "thinking")
      out.options.mode = ThinkingMode::kThinking;
    else if (mode->as_string() == "chat")
      out.options.mode = ThinkingMode::kChat;
    else
      fail("\"thinking_mode\" must be \"thinking\" or \"chat\", not '", mode->as_string(), "'");
  }
  if (const PyJson* e = req.get("reasoning_effort"); e && !e->is_null()) {
    if (!e->is_string()) fail("\"reasoning_effort\" must be null or a string");
    out.options.reasoning_effort = e->as_string();
  }
  if (const PyJson* t = req.get("reasoning_effort_table"); t && !t->is_null()) {
    if (t->is_string() && t->as_string() == "v4")
      out.options.effort_table = EffortTable::kOriginalV4;
    else if (t->is_string() && t->as_string() == "0731")
      out.options.effort_table = EffortTable::kFlash0731;
    else
      fail("\"reasoning_effort_table\" must be \"v4\" or \"0731\"");
  }
  auto flag = [&](const char* key, bool& dst) {
    if (const PyJson* v = req.get(key); v && !v->is_null()) {
      if (v->type() != PyJson::Type::Bool) fail("\"", key, "\" must be true or false");
      dst = v->as_bool();
    }
  };
  flag("drop_thinking", out.options.drop_thinking);
  flag("add_bos", out.options.add_bos);
  return out;
}

ChatRequest parse_chat_request(std::string_view request_json) {
  return chat_request_from_json(py_json_loads(request_json));
}

}  // namespace dsv4::text
