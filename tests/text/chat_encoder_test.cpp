// The chat encoder against the official encoder: the four golden fixtures byte for byte, the worked examples of
// CHAT_FORMAT.md §2.13 (A-W), one test per quirk of §2.14, and the argument/tool-result rules of §2.7-§2.8.
#include <gtest/gtest.h>

#include "core/error.h"
#include "shared_tokenizer.h"
#include "text/chat_encoder.h"
#include "text/chat_request.h"

namespace dsv4::text {
namespace {

const std::string BOS = "<｜begin▁of▁sentence｜>", EOS = "<｜end▁of▁sentence｜>", U = "<｜User｜>",
                  A = "<｜Assistant｜>";

std::string render(const std::string& messages, ThinkingMode mode, bool drop = true,
                   std::optional<std::string> effort = std::nullopt, EffortTable table = EffortTable::kOriginalV4) {
  ChatOptions o;
  o.mode = mode;
  o.drop_thinking = drop;
  o.reasoning_effort = std::move(effort);
  o.effort_table = table;
  return encode_chat(py_json_loads(messages), o);
}
constexpr auto kChat = ThinkingMode::kChat;
constexpr auto kThink = ThinkingMode::kThinking;

std::string read(const std::string& rel) { return testing::read_source_file(rel); }

// --- golden fixtures -------------------------------------------------------------------------------------------

std::string render_fixture(int n, ThinkingMode mode) {
  PyJson input = py_json_loads(read("tests/data/chat/test_input_" + std::to_string(n) + ".json"));
  PyJson messages;
  if (input.is_object()) {  // test 1: the official driver attaches "tools" to messages[0]
    messages = *input.get("messages");
    messages.items()[0].set("tools", *input.get("tools"));
  } else {
    messages = input;
  }
  ChatOptions o;
  o.mode = mode;
  return encode_chat(messages, o);
}

TEST(ChatFixtures, OfficialGoldenPromptsByteExact) {
  const ThinkingMode modes[] = {kThink, kThink, kThink, kChat};
  for (int n = 1; n <= 4; ++n)
    EXPECT_EQ(render_fixture(n, modes[n - 1]), read("tests/data/chat/test_output_" + std::to_string(n) + ".txt"))
        << "fixture " << n;
}

TEST(ChatFixtures, Fixture1ViaRequestLevelTools) {
  // The CLI request form: request-level tools attach to the first system message (same as the official driver).
  PyJson input = py_json_loads(read("tests/data/chat/test_input_1.json"));
  input.set("thinking_mode", PyJson::string("thinking"));
  const ChatRequest req = chat_request_from_json(input);
  EXPECT_EQ(encode_chat(req.messages, req.options), read("tests/data/chat/test_output_1.txt"));
}

TEST(ChatFixtures, Fixture2DropsEarlierReasoning) {
  const std::string out = render_fixture(2, kThink);
  EXPECT_EQ(out.find("The user said hello"), std::string::npos);
}

// --- §2.13 worked examples ------------------------------------------------------------------------------------

TEST(ChatExamples, A_B_SystemUserChatAndThinking) {
  const std::string m = R"([{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hi"}])";
  const std::string a = render(m, kChat);
  EXPECT_EQ(a, BOS + "You are a helpful assistant." + U + "Hi" + A + "</think>");
  EXPECT_EQ(testing::v4_tokenizer().encode(a),
            (std::vector<TokenId>{0, 3476, 477, 260, 11502, 22896, 16, 128803, 23166, 128804, 128822}));
  const std::string b = render(m, kThink);
  EXPECT_EQ(b, BOS + "You are a helpful assistant." + U + "Hi" + A + "<think>");
  EXPECT_EQ(testing::v4_tokenizer().encode(b),
            (std::vector<TokenId>{0, 3476, 477, 260, 11502, 22896, 16, 128803, 23166, 128804, 128821}));
}

TEST(ChatExamples, C_NoSystem) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Hi"}])", kThink), BOS + U + "Hi" + A + "<think>");
}

const std::string kMultiTurn =
    R"([{"role":"user","content":"Q1"},{"role":"assistant","reasoning_content":"R1","content":"A1"},)"
    R"({"role":"user","content":"Q2"}])";

TEST(ChatExamples, D_E_F_MultiTurnDropKeepChat) {
  const std::string d = render(kMultiTurn, kThink);
  EXPECT_EQ(d, BOS + U + "Q1" + A + "</think>A1" + EOS + U + "Q2" + A + "<think>");
  EXPECT_EQ(testing::v4_tokenizer().encode(d),
            (std::vector<TokenId>{0, 128803, 51, 19, 128804, 128822, 35, 19, 1, 128803, 51, 20, 128804, 128821}));
  EXPECT_EQ(render(kMultiTurn, kThink, false), BOS + U + "Q1" + A + "<think>R1</think>A1" + EOS + U + "Q2" + A + "<think>");
  EXPECT_EQ(render(kMultiTurn, kChat), BOS + U + "Q1" + A + "</think>A1" + EOS + U + "Q2" + A + "</think>");
}

const std::string kTimeTool =
    R"({"type":"function","function":{"name":"get_time","description":"Get time","parameters":{"type":"object",)"
    R"("properties":{"tz":{"type":"string"}},"required":["tz"]}}})";

TEST(ChatExamples, G_ParallelCallsResultsSortedBackToCallOrder) {
  const std::string m =
      R"([{"role":"system","content":"S","tools":[)" + kTimeTool +
      R"(]},{"role":"user","content":"Time in Paris and Tokyo?"},)"
      R"({"role":"assistant","reasoning_content":"Need two calls.","content":"","tool_calls":[)"
      R"({"id":"c1","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"Europe/Paris\"}"}},)"
      R"({"id":"c2","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"Asia/Tokyo\", \"n\": 2, \"x\": [1, \"é\"]}"}}]},)"
      R"({"role":"tool","tool_call_id":"c2","content":"09:00"},{"role":"tool","tool_call_id":"c1","content":"02:00"}])";
  const std::string calls =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_time\">\n"
      "<｜DSML｜parameter name=\"tz\" string=\"true\">Europe/Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_time\">\n"
      "<｜DSML｜parameter name=\"tz\" string=\"true\">Asia/Tokyo</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">2</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"x\" string=\"false\">[1, \"é\"]</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const std::string tools = render_tools_block(py_json_loads("[" + kTimeTool + "]"));
  EXPECT_NE(tools.find("{\"name\": \"get_time\", \"description\": \"Get time\", \"parameters\": {\"type\": \"object\", "
                       "\"properties\": {\"tz\": {\"type\": \"string\"}}, \"required\": [\"tz\"]}}\n\nYou MUST"),
            std::string::npos);
  EXPECT_EQ(render(m, kThink), BOS + "S\n\n" + tools + U + "Time in Paris and Tokyo?" + A + "<think>Need two calls.</think>" +
                                   calls + EOS + U + "<tool_result>02:00</tool_result>\n\n<tool_result>09:00</tool_result>" +
                                   A + "<think>");
  EXPECT_EQ(render(m, kChat), BOS + "S\n\n" + tools + U + "Time in Paris and Tokyo?" + A + "</think>" + calls + EOS + U +
                                  "<tool_result>02:00</tool_result>\n\n<tool_result>09:00</tool_result>" + A + "</think>");
}

const std::string kExampleH =
    R"([{"role":"user","content":"U1"},{"role":"assistant","content":"","tool_calls":[{"type":"function",)"
    R"("function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"R"},{"role":"user","content":"U2"}])";

TEST(ChatExamples, H_ToolResultThenUserShareOneTurn_EmptyInvokeHasEmptyLine) {
  EXPECT_EQ(render(kExampleH, kChat),
            BOS + U + "U1" + A + "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n"
                                 "</｜DSML｜tool_calls>" + EOS + U + "<tool_result>R</tool_result>\n\nU2" + A + "</think>");
}

TEST(ChatExamples, I_ResponseFormat) {
  EXPECT_EQ(render(R"([{"role":"system","content":"S","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}},{"role":"user","content":"Q"}])", kChat),
            BOS + "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                  "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": \"object\"}}}" +
                U + "Q" + A + "</think>");
}

TEST(ChatExamples, J_ReasoningEffortMax) {
  const std::string m = R"([{"role":"system","content":"S"},{"role":"user","content":"Q"}])";
  const std::string prefix = reasoning_effort_prefix(std::string("max"), EffortTable::kOriginalV4);
  EXPECT_EQ(prefix.substr(0, 63), "Reasoning Effort: Absolute maximum with no shortcuts permitted.");
  EXPECT_EQ(prefix.substr(prefix.size() - 12), "unchecked.\n\n");
  EXPECT_EQ(render(m, kThink, true, "max"), BOS + prefix + "S" + U + "Q" + A + "<think>");
  EXPECT_EQ(render(m, kChat, true, "max"), BOS + "S" + U + "Q" + A + "</think>");  // chat mode: no prefix
  EXPECT_EQ(render(m, kThink, true, "high"), BOS + "S" + U + "Q" + A + "<think>");
  // Without a system message the prefix sits right before <｜User｜>.
  EXPECT_EQ(render(R"([{"role":"user","content":"Q"}])", kThink, true, "max"), BOS + prefix + U + "Q" + A + "<think>");
  EXPECT_THROW(render(m, kThink, true, "low"), Error);
}

TEST(ChatExamples, J_Effort0731Table) {
  const std::string m = R"([{"role":"user","content":"Q"}])";
  const std::string high = reasoning_effort_prefix(std::string("high"), EffortTable::kFlash0731);
  const std::string max = reasoning_effort_prefix(std::string("max"), EffortTable::kFlash0731);
  EXPECT_EQ(high, reasoning_effort_prefix(std::string("max"), EffortTable::kOriginalV4));
  EXPECT_EQ(max.substr(0, 44), "Reasoning Effort: Beyond maximum \u2014 exhaust");
  EXPECT_EQ(render(m, kThink, true, "low", EffortTable::kFlash0731), BOS + U + "Q" + A + "<think>");
  EXPECT_EQ(render(m, kThink, true, "max", EffortTable::kFlash0731), BOS + max + U + "Q" + A + "<think>");
}

TEST(ChatExamples, K_AssistantPrefillWithoutEos) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Q"},{"role":"assistant","reasoning_content":"partial","content":"Ans","wo_eos":true}])", kThink),
            BOS + U + "Q" + A + "<think>partial</think>Ans");
}

TEST(ChatExamples, L_SystemMessagesConcatenateWithoutSeparator) {  // §2.14 quirk 1
  EXPECT_EQ(render(R"([{"role":"system","content":"A"},{"role":"system","content":"B"},{"role":"user","content":"Q"},)"
                   R"({"role":"assistant","content":"X"},{"role":"system","content":"C"},{"role":"user","content":"Q2"}])", kChat),
            BOS + "AB" + U + "Q" + A + "</think>X" + EOS + "C" + U + "Q2" + A + "</think>");
}

TEST(ChatExamples, M_DeveloperAfterEarlierTurn) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Q1"},{"role":"assistant","content":"a"},{"role":"developer","content":"Dev instr"}])", kThink),
            BOS + U + "Q1" + A + "</think>a" + EOS + U + "Dev instr" + A + "<think>");
}

TEST(ChatExamples, N_EmptyUser) {
  EXPECT_EQ(render(R"([{"role":"user","content":""}])", kChat), BOS + U + A + "</think>");
}

TEST(ChatExamples, O_EndsWithAssistant) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Q"},{"role":"assistant","reasoning_content":"R","content":"A"}])", kThink),
            BOS + U + "Q" + A + "<think>R</think>A" + EOS);
}

TEST(ChatExamples, P_EmptySystemWithToolsEndsWithToolResult) {
  const std::string m =
      R"([{"role":"system","content":"","tools":[)" + kTimeTool +
      R"(]},{"role":"user","content":"Time in Paris?"},{"role":"assistant","reasoning_content":"Call it.","content":"",)"
      R"("tool_calls":[{"id":"c1","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"Europe/Paris\"}"}}]},)"
      R"({"role":"tool","tool_call_id":"c1","content":"12:00"}])";
  const std::string p = render(m, kThink);
  EXPECT_EQ(p.substr(0, BOS.size() + 10), BOS + "\n\n## Tools");
  const std::string tail = "</｜DSML｜tool_calls>" + EOS + U + "<tool_result>12:00</tool_result>" + A + "<think>";
  EXPECT_EQ(p.substr(p.size() - tail.size()), tail);
  const auto ids = testing::v4_tokenizer().encode(p);
  const std::vector<TokenId> head{0, 271, 372, 27193, 271, 3476};
  const std::vector<TokenId> last{1718, 128825, 72461, 4941, 12548, 32, 1, 128803, 30, 72461, 46148, 32,
                                  736,  28,     504,   1718, 72461, 46148, 32, 128804, 128821};
  ASSERT_GT(ids.size(), head.size() + last.size());
  EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.begin() + head.size()), head);
  EXPECT_EQ(std::vector<TokenId>(ids.end() - last.size(), ids.end()), last);
}

TEST(ChatExamples, Q_ToolContentBlocks) {
  const std::string out =
      render(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]},)"
             R"({"role":"tool","tool_call_id":"x","content":[{"type":"text","text":"p1"},{"type":"image"},{"type":"text","text":"p2"}]}])", kChat);
  EXPECT_NE(out.find(EOS + U + "<tool_result>p1\n\n[Unsupported image]\n\np2</tool_result>" + A + "</think>"), std::string::npos);
}

TEST(ChatExamples, S_T_U_Tasks) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Q","task":"query"}])", kThink), BOS + U + "Q<｜query｜>");
  EXPECT_EQ(render(R"([{"role":"user","content":"Q","task":"action"}])", kThink), BOS + U + "Q" + A + "<think><｜action｜>");
  EXPECT_EQ(render(R"([{"role":"user","content":"Q","task":"action"}])", kChat), BOS + U + "Q" + A + "</think><｜action｜>");
  EXPECT_EQ(render(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"A","task":"title"}])", kChat),
            BOS + U + "Q" + A + "</think>A" + EOS + "<｜title｜>");
  // The assistant answer after a task message has no thinking part, even in thinking mode.
  EXPECT_EQ(render(R"([{"role":"user","content":"Q","task":"action"},{"role":"assistant","reasoning_content":"r","content":"Search"}])", kThink),
            BOS + U + "Q" + A + "<think><｜action｜>Search" + EOS);
  EXPECT_THROW(render(R"([{"role":"user","content":"Q","task":"nope"}])", kThink), Error);
}

TEST(ChatExamples, V_ArgumentsNotJson) {
  EXPECT_EQ(render_dsml_parameters(PyJson::string("not json")),
            "<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>");
}

TEST(ChatExamples, W_TypedValuesWithContentBeforeTheCall) {
  const std::string m =
      R"([{"role":"user","content":"Q"},{"role":"assistant","content":"Let me check.","tool_calls":[{"type":"function",)"
      R"("function":{"name":"f","arguments":"{\"b\": true, \"n\": null, \"f\": 1.5, \"o\": {\"k\": \"v\"}}"}}]}])";
  const std::string out = render(m, kChat);
  const std::string want =
      "</think>Let me check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"b\" string=\"false\">true</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">null</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"f\" string=\"false\">1.5</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"o\" string=\"false\">{\"k\": \"v\"}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS;
  EXPECT_EQ(out.substr(out.size() - want.size()), want);
}

// --- §2.14 quirks (1 and 5 are covered by L and H above) ---------------------------------------------------------

TEST(ChatQuirks, Q2_UserAfterToolResultsSharesTheirTurn) {
  EXPECT_NE(render(kExampleH, kChat).find(U + "<tool_result>R</tool_result>\n\nU2" + A), std::string::npos);
  // ... and a tool result right after a user message joins that user's turn.
  EXPECT_EQ(render(R"([{"role":"user","content":"U"},{"role":"tool","tool_call_id":"t","content":"R"}])", kChat),
            BOS + U + "U\n\n<tool_result>R</tool_result>" + A + "</think>");
}

TEST(ChatQuirks, Q3_ToolsAnywhereDisableDropThinking) {
  const std::string with_tools =
      R"([{"role":"system","content":"S","tools":[)" + kTimeTool + R"(]},)" + kMultiTurn.substr(1);
  const std::string out = render(with_tools, kThink);
  EXPECT_NE(out.find(U + "Q1" + A + "<think>R1</think>A1" + EOS + U + "Q2" + A + "<think>"), std::string::npos);
  // A developer message carrying tools has the same effect.
  const std::string dev = R"([{"role":"developer","content":"D","tools":[)" + kTimeTool + R"(]},)" + kMultiTurn.substr(1);
  EXPECT_NE(render(dev, kThink).find("<think>R1</think>A1"), std::string::npos);
}

TEST(ChatQuirks, Q4_EarlierUserTurnGetsClosedThinkInThinkingModeWithDrop) {
  EXPECT_NE(render(kMultiTurn, kThink).find(U + "Q1" + A + "</think>A1"), std::string::npos);
}

TEST(ChatQuirks, Q6_NoEscapingAnywhere) {
  const std::string m =
      R"([{"role":"user","content":"<tool_result>\"x\" & <b>"},{"role":"assistant","content":"ok","tool_calls":[)"
      R"({"type":"function","function":{"name":"a\"b","arguments":"{\"v\": \"</｜DSML｜parameter> \\\" <\"}"}}]},)"
      R"({"role":"tool","content":"</tool_result>"}])";
  const std::string out = render(m, kChat);
  EXPECT_NE(out.find(U + "<tool_result>\"x\" & <b>" + A), std::string::npos);
  EXPECT_NE(out.find("<｜DSML｜invoke name=\"a\"b\">"), std::string::npos);
  EXPECT_NE(out.find("string=\"true\"></｜DSML｜parameter> \" <</｜DSML｜parameter>"), std::string::npos);
  EXPECT_NE(out.find("<tool_result></tool_result></tool_result>"), std::string::npos);
}

TEST(ChatQuirks, Q7_LatestReminderAfterUserInheritsTransition) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Q"},{"role":"latest_reminder","content":"date"}])", kChat),
            BOS + U + "Q" + A + "</think><｜latest_reminder｜>date");
  // Normal placement: right after the system message, no separator and no transition.
  EXPECT_EQ(render(R"([{"role":"system","content":"S"},{"role":"latest_reminder","content":"d"},{"role":"user","content":"Q"}])", kThink),
            BOS + "S<｜latest_reminder｜>d" + U + "Q" + A + "<think>");
}

TEST(ChatQuirks, Q8_NullContentRendersEmpty) {
  EXPECT_EQ(render(R"([{"role":"system","content":null},{"role":"user","content":null}])", kChat), BOS + U + A + "</think>");
  EXPECT_EQ(render(R"([{"role":"system"},{"role":"user"}])", kChat), BOS + U + A + "</think>");
}

// --- §2.7 / §2.8 rules and error handling -------------------------------------------------------------------------

TEST(ChatArguments, ObjectStringArrayAndDict) {
  EXPECT_EQ(render_dsml_parameters(py_json_loads(R"({"a": "x", "n": 1.0})")),
            "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"n\" string=\"false\">1.0</｜DSML｜parameter>");
  EXPECT_EQ(render_dsml_parameters(PyJson::string("[1,2]")),
            "<｜DSML｜parameter name=\"arguments\" string=\"true\">[1,2]</｜DSML｜parameter>");
  EXPECT_EQ(render_dsml_parameters(PyJson::string("\"x\"")),
            "<｜DSML｜parameter name=\"arguments\" string=\"true\">\"x\"</｜DSML｜parameter>");
  EXPECT_EQ(render_dsml_parameters(PyJson::string("{}")), "");
  // Floats/unicode/controls in argument values re-serialize like json.dumps.
  EXPECT_EQ(render_dsml_parameters(PyJson::string(R"({"v": [1e-5, 1E16, "é\u0001", {}]})")),
            "<｜DSML｜parameter name=\"v\" string=\"false\">[1e-05, 1e+16, \"é\\u0001\", {}]</｜DSML｜parameter>");
}

TEST(ChatToolResults, SortRules) {
  auto conv = [](const std::string& calls, const std::string& results) {
    return R"([{"role":"user","content":"Q"},{"role":"assistant","content":"","tool_calls":[)" + calls + "]}," + results + "]";
  };
  auto call = [](const std::string& id) {
    return R"({"id":")" + id + R"(","type":"function","function":{"name":"f","arguments":"{}"}})";
  };
  auto result = [](const std::string& id, const std::string& c) {
    return R"({"role":"tool","tool_call_id":")" + id + R"(","content":")" + c + R"("})";
  };
  auto results_of = [&](const std::string& m) {
    const std::string out = render(m, kChat);
    return out.substr(out.rfind(U) + U.size());
  };
  const std::string calls = call("a") + "," + call("b") + "," + call("c");
  EXPECT_EQ(results_of(conv(calls, result("c", "3") + "," + result("a", "1") + "," + result("b", "2"))),
            "<tool_result>1</tool_result>\n\n<tool_result>2</tool_result>\n\n<tool_result>3</tool_result>" + A + "</think>");
  // Unknown ids sort as index 0 (stable): before b and c, after nothing that also ranks 0 ahead of it.
  EXPECT_EQ(results_of(conv(calls, result("c", "3") + "," + result("zz", "?") + "," + result("b", "2"))),
            "<tool_result>?</tool_result>\n\n<tool_result>2</tool_result>\n\n<tool_result>3</tool_result>" + A + "</think>");
  // Duplicate call ids: the last index wins (a -> 2), so a's result sorts after b's.
  const std::string dup = call("a") + "," + call("b") + "," + call("a");
  EXPECT_EQ(results_of(conv(dup, result("a", "A") + "," + result("b", "B"))),
            "<tool_result>B</tool_result>\n\n<tool_result>A</tool_result>" + A + "</think>");
}

TEST(ChatErrors, BadInputThrowsErrorNeverCrashes) {
  EXPECT_THROW(render(R"([{"role":"wizard","content":"x"}])", kChat), Error);
  EXPECT_THROW(render(R"([{"role":"developer","content":""}])", kChat), Error);
  EXPECT_THROW(render(R"({"role":"user"})", kChat), Error);
  EXPECT_THROW(render(R"([42])", kChat), Error);
  EXPECT_THROW(render(R"([{"role":"system","content":"S","tools":[{"name":"no function key"}]}])", kChat), Error);
  EXPECT_THROW(render(R"([{"role":"assistant","tool_calls":[{"id":"x"}]}])", kChat), Error);
  EXPECT_THROW(render(R"([{"role":"user","content":{"a":1}}])", kChat), Error);
}

TEST(ChatRequest, ToolsAttachToFirstSystemOrNewSystemAtIndexZero) {
  const std::string tools = "[" + kTimeTool + "]";
  const std::string tb = render_tools_block(py_json_loads(tools));
  auto run = [](const std::string& req) {
    const ChatRequest r = parse_chat_request(req);
    return encode_chat(r.messages, r.options);
  };
  EXPECT_EQ(run(R"({"messages":[{"role":"user","content":"Q"}],"tools":)" + tools + R"(,"thinking_mode":"chat"})"),
            BOS + "\n\n" + tb + U + "Q" + A + "</think>");
  EXPECT_EQ(run(R"({"messages":[{"role":"user","content":"Q"},{"role":"system","content":"S"}],"tools":)" + tools +
                R"(,"thinking_mode":"chat"})"),
            BOS + U + "Q" + "S\n\n" + tb);
  EXPECT_THROW(run(R"({"messages":[],"thinking_mode":"fast"})"), Error);
  EXPECT_THROW(run(R"({"messages":[],"drop_thinking":"yes"})"), Error);
  EXPECT_THROW(run(R"({"messages":[{"role":"system","content":"S","tools":)" + tools + R"(}],"tools":)" + tools + "}"), Error);
  // vLLM's "reasoning" key is read when "reasoning_content" is absent.
  EXPECT_EQ(run(R"({"messages":[{"role":"user","content":"Q"},{"role":"assistant","reasoning":"R","content":"A"}],"thinking_mode":"thinking"})"),
            BOS + U + "Q" + A + "<think>R</think>A" + EOS);
}

}  // namespace
}  // namespace dsv4::text
