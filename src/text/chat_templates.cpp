// Fixed texts of the prompt format: the tools block, the response-format block, the reasoning-effort prefixes and
// the DSML rendering of tool-call arguments.
#include "core/error.h"
#include "text/chat_encoder.h"
#include "text/chat_tokens.h"

namespace dsv4::text {

std::string render_tools_block(const PyJson& tools) {
  if (!tools.is_array()) fail("tools must be a list");
  std::string schemas;
  for (const auto& t : tools.items()) {
    const PyJson* fn = t.get("function");
    if (!fn) fail("each tool needs a \"function\" object (OpenAI format)");
    if (!schemas.empty()) schemas += '\n';
    schemas += py_json_dumps(*fn);
  }
  std::string s;
  s += "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
       "writing a \"<\uFF5CDSML\uFF5Ctool_calls>\" block like the following:\n\n"
       "<\uFF5CDSML\uFF5Ctool_calls>\n"
       "<\uFF5CDSML\uFF5Cinvoke name=\"$TOOL_NAME\">\n"
       "<\uFF5CDSML\uFF5Cparameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
       "</\uFF5CDSML\uFF5Cparameter>\n"
       "...\n"
       "</\uFF5CDSML\uFF5Cinvoke>\n"
       "<\uFF5CDSML\uFF5Cinvoke name=\"$TOOL_NAME2\">\n"
       "...\n"
       "</\uFF5CDSML\uFF5Cinvoke>\n"
       "</\uFF5CDSML\uFF5Ctool_calls>\n\n"
       "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
       "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
       "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
       "<think>...</think> BEFORE any tool calls or final response.\n\n"
       "Otherwise, output directly after </think> with tool calls or final response.\n\n"
       "### Available Tool Schemas\n\n";
  s += schemas;
  s += "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
  return s;
}

namespace {

std::string parameter_line(const std::string& key, const PyJson& v) {
  const bool is_str = v.is_string();
  std::string s = "<\uFF5CDSML\uFF5Cparameter name=\"";
  s += key;
  s += is_str ? "\" string=\"true\">" : "\" string=\"false\">";
  s += is_str ? v.as_string() : py_json_dumps(v);  // string values raw: the format has no escaping (§2.7)
  s += "</\uFF5CDSML\uFF5Cparameter>";
  return s;
}

}  // namespace

std::string render_dsml_parameters(const PyJson& arguments) {
  // Arguments normally arrive as a JSON string. Decoding rules (§2.7):
  //  * a string holding a JSON object -> its members;
  //  * a string that is not JSON, or JSON but not an object -> one string parameter "arguments" with the raw
  //    text (the official encoder falls back this way for non-JSON; for non-object JSON it would crash, and
  //    deepseek-recipe / vLLM render it like this);
  //  * an already-parsed object -> its members (what vLLM does; the official code would wrap the dict);
  //  * any other already-parsed value -> one non-string parameter "arguments", as the official fallback does.
  PyJson obj;
  if (arguments.is_string()) {
    try {
      obj = py_json_loads(arguments.as_string());
    } catch (const Error&) {
      obj = PyJson();
    }
    if (!obj.is_object()) obj = PyJson::object({{"arguments", arguments}});
  } else if (arguments.is_object()) {
    obj = arguments;
  } else {
    obj = PyJson::object({{"arguments", arguments}});
  }
  std::string out;
  bool first = true;
  for (const auto& [k, v] : obj.members()) {
    if (!first) out += '\n';
    first = false;
    out += parameter_line(k, v);
  }
  return out;
}

std::string reasoning_effort_prefix(const std::optional<std::string>& effort, EffortTable table) {
  static const char* kAbsoluteMax =
      "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
      "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
      "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
      "scenarios.\n"
      "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
      "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";
  static const char* kBeyondMax =
      "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
      "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose "
      "the problem into its most fundamental components, trace every causal chain to its root, and resolve the "
      "underlying cause rather than any surface symptom.\n"
      "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
      "certain that no assumption remains unchecked and no error remains undiscovered.\n\n";
  if (table == EffortTable::kOriginalV4) {
    if (!effort || *effort == "high") return "";
    if (*effort == "max") return kAbsoluteMax;
    fail("invalid reasoning_effort '", *effort, "' (original V4: null, \"high\" or \"max\")");
  }
  if (!effort || *effort == "low") return "";
  if (*effort == "high") return kAbsoluteMax;
  if (*effort == "max") return kBeyondMax;
  fail("invalid reasoning_effort '", *effort, "' (V4-Flash-0731: \"low\", \"high\" or \"max\")");
}

}  // namespace dsv4::text
