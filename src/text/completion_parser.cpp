#include "text/completion_parser.h"

#include <algorithm>
#include <array>
#include <optional>

#include "core/error.h"
#include "text/chat_tokens.h"
#include "text/py_json.h"
#include "text/utf8.h"

namespace dsv4::text {
namespace {

using chat::kEos;
using chat::kThinkEnd;
constexpr std::string_view kBlockStart = "<\uFF5CDSML\uFF5Ctool_calls";  // as in the official parser: no '>'
constexpr std::string_view kBlockStartNl = "\n<\uFF5CDSML\uFF5Ctool_calls";
constexpr std::string_view kBlockStartNlNl = "\n\n<\uFF5CDSML\uFF5Ctool_calls";
constexpr std::string_view kBlockEnd = "</\uFF5CDSML\uFF5Ctool_calls>";
constexpr std::string_view kInvoke = "<\uFF5CDSML\uFF5Cinvoke";
constexpr std::string_view kInvokeEnd = "</\uFF5CDSML\uFF5Cinvoke>";
constexpr std::string_view kParam = "<\uFF5CDSML\uFF5Cparameter";
constexpr std::string_view kParamEnd = "</\uFF5CDSML\uFF5Cparameter>";

struct Hit {
  std::size_t pos;
  std::string_view marker;
};

// Leftmost complete occurrence of any marker at or after `from`; the longest one when several start together.
std::optional<Hit> find_marker(std::string_view buf, std::size_t from, std::initializer_list<std::string_view> markers) {
  std::optional<Hit> best;
  for (std::string_view m : markers) {
    const std::size_t p = buf.find(m, from);
    if (p == std::string_view::npos) continue;
    if (!best || p < best->pos || (p == best->pos && m.size() > best->marker.size())) best = Hit{p, m};
  }
  return best;
}

// Start of the longest suffix of `buf` that is a proper prefix of some marker (buf.size() if none).
std::size_t partial_marker_start(std::string_view buf, std::initializer_list<std::string_view> markers) {
  std::size_t start = buf.size();
  for (std::string_view m : markers) {
    for (std::size_t len = std::min(m.size() - 1, buf.size()); len > 0; --len) {
      if (buf.size() - len >= start) break;  // cannot beat what we already hold back
      if (buf.substr(buf.size() - len) == m.substr(0, len)) {
        start = buf.size() - len;
        break;
      }
    }
  }
  return start;
}

std::size_t max_len(std::initializer_list<std::string_view> markers) {
  std::size_t n = 0;
  for (auto m : markers) n = std::max(n, m.size());
  return n;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool all_ws(std::string_view s) { return std::all_of(s.begin(), s.end(), is_ws); }
std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

CompletionParser::CompletionParser(ThinkingMode mode)
    : state_(mode == ThinkingMode::kThinking ? State::kReasoning : State::kContent) {}

void CompletionParser::emit_text(std::string_view text, CompletionDelta& d) {
  if (text.empty()) return;
  if (state_ == State::kReasoning) {
    out_.reasoning_content += text;
    d.reasoning += text;
  } else {
    out_.content += text;
    d.content += text;
  }
}

void CompletionParser::consume(std::size_t n, bool into_unit) {
  if (into_unit) unit_raw_.append(buf_, 0, n);
  buf_.erase(0, n);
  searched_ = 0;
}

// The DSML part since the last complete invoke is not a valid call: its raw text, up to `upto` bytes of buf_, is
// returned as content and parsing continues as content from there.
void CompletionParser::malformed(std::size_t upto, CompletionDelta& d, const char* why) {
  out_.warnings.push_back(std::string("malformed DSML (") + why + "): returned as content");
  consume(upto, true);
  state_ = State::kContent;
  emit_text(unit_raw_, d);
  unit_raw_.clear();
  params_.clear();
}

// ` name="K" string="true|false">VALUE` (the text between "<｜DSML｜parameter" and "</｜DSML｜parameter>").
bool CompletionParser::finish_param(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  if (s.substr(0, 6) != "name=\"") return false;
  s.remove_prefix(6);
  const std::size_t q = s.find("\" string=\"");
  if (q == std::string_view::npos) return false;
  const std::string key(s.substr(0, q));
  s.remove_prefix(q + 10);
  bool is_string;
  if (s.substr(0, 6) == "true\">") {
    is_string = true;
    s.remove_prefix(6);
  } else if (s.substr(0, 7) == "false\">") {
    is_string = false;
    s.remove_prefix(7);
  } else {
    return false;
  }
  std::string value;
  if (is_string) {
    value = py_json_dumps(PyJson::string(std::string(s)));
  } else {
    // The official parser pastes the raw text unvalidated; invalid JSON would make the arguments unparseable,
    // so it is passed as a string instead.
    bool valid = true;
    try {
      py_json_loads(s);
    } catch (const Error&) {
      valid = false;
    }
    if (valid) {
      value = std::string(s);
    } else {
      value = py_json_dumps(PyJson::string(std::string(s)));
      out_.warnings.push_back("string=\"false\" parameter '" + key + "' is not JSON: passed as a string");
    }
  }
  for (auto& [k, v] : params_)
    if (k == key) {  // a repeated name: Python dict semantics (first position, last value)
      v = std::move(value);
      out_.warnings.push_back("duplicate parameter '" + key + "'");
      return true;
    }
  params_.emplace_back(key, std::move(value));
  return true;
}

void CompletionParser::end_invoke(CompletionDelta& d) {
  std::string args = "{";
  for (std::size_t k = 0; k < params_.size(); ++k) {
    if (k) args += ", ";
    args += py_json_dumps(PyJson::string(params_[k].first));
    args += ": ";
    args += params_[k].second;
  }
  args += "}";
  call_.arguments = std::move(args);
  out_.tool_calls.push_back(call_);
  d.tool_calls.push_back(call_);
  call_ = {};
  params_.clear();
  unit_raw_.clear();
}

bool CompletionParser::step(CompletionDelta& d) {
  switch (state_) {
    case State::kReasoning:
    case State::kContent: {
      const bool reasoning = state_ == State::kReasoning;
      const auto markers = {kThinkEnd, kEos, kBlockStart, kBlockStartNl, kBlockStartNlNl};
      const auto hit = find_marker(buf_, 0, markers);
      if (!hit) {
        std::size_t keep = eof_ ? buf_.size() : partial_marker_start(buf_, markers);
        if (!eof_) keep = utf8_stable_prefix_len(std::string_view(buf_).substr(0, keep));
        emit_text(std::string_view(buf_).substr(0, keep), d);
        consume(keep, false);
        return false;
      }
      emit_text(std::string_view(buf_).substr(0, hit->pos), d);
      consume(hit->pos, false);
      if (hit->marker == kEos) {
        consume(kEos.size(), false);
        out_.saw_eos = true;
        state_ = State::kDone;
      } else if (hit->marker == kThinkEnd) {
        consume(kThinkEnd.size(), false);
        if (reasoning) {
          saw_think_end_ = true;
          state_ = State::kContent;
        } else {
          out_.warnings.push_back("stray </think> in content skipped");
        }
      } else {  // a DSML block starts
        if (reasoning) out_.warnings.push_back("tool calls inside reasoning (no </think>)");
        if (hit->marker != kBlockStartNlNl) out_.warnings.push_back("tool calls not preceded by \\n\\n");
        consume(hit->marker.size(), true);
        state_ = State::kBlockOpen;
      }
      return true;
    }

    case State::kAfterBlock: {
      std::size_t w = 0;
      while (w < buf_.size() && is_ws(buf_[w])) ++w;
      const auto markers = {kEos, kBlockStart, kThinkEnd};
      const std::string_view rest = std::string_view(buf_).substr(w);
      for (std::string_view m : markers) {
        if (rest.substr(0, m.size()) == m) {  // only whitespace before a marker: drop it, let content handle it
          consume(w, false);
          state_ = State::kContent;
          return true;
        }
      }
      if (rest.empty()) {
        if (eof_) consume(w, false);
        return false;
      }
      if (!eof_ && partial_marker_start(rest, markers) == 0) return false;  // might still become a marker
      out_.warnings.push_back("text after the tool calls block returned as content");
      state_ = State::kContent;
      return true;
    }

    case State::kBlockOpen:
    case State::kBlock:
    case State::kInvokeHead:
    case State::kInvokeBody:
    case State::kParamValue: {
      const bool in_value = state_ == State::kParamValue;
      const auto block_markers = {kInvoke, kBlockEnd, kEos, kParam, kInvokeEnd};
      const auto value_markers = {kParamEnd, kEos};
      const auto markers = in_value ? value_markers : block_markers;
      const auto hit = find_marker(buf_, searched_, markers);
      if (!hit) {
        if (eof_) {
          malformed(buf_.size(), d, "unterminated");
          return true;
        }
        const std::size_t m = max_len(markers);
        searched_ = buf_.size() >= m ? buf_.size() - m + 1 : 0;
        return false;
      }
      const std::string_view gap = std::string_view(buf_).substr(0, hit->pos);
      const std::string_view mk = hit->marker;
      if (mk == kEos) {
        malformed(hit->pos, d, "EOS inside the tool calls block");
        return true;
      }
      switch (state_) {
        case State::kParamValue:
          if (!finish_param(gap)) {
            malformed(hit->pos, d, "bad parameter tag");
            return true;
          }
          consume(hit->pos + mk.size(), true);
          state_ = State::kInvokeBody;
          return true;
        case State::kBlockOpen:
        case State::kBlock: {
          // Official: exactly ">\n" after "<｜DSML｜tool_calls" and after each "</｜DSML｜invoke"; any whitespace is
          // accepted here.
          const std::string_view g = state_ == State::kBlockOpen && !gap.empty() && gap.front() == '>' ? gap.substr(1) : gap;
          if ((state_ == State::kBlockOpen && (gap.empty() || gap.front() != '>')) || !all_ws(g) ||
              (mk != kInvoke && mk != kBlockEnd)) {
            malformed(hit->pos, d, "unexpected text between invokes");
            return true;
          }
          consume(hit->pos + mk.size(), true);
          if (mk == kBlockEnd) {
            unit_raw_.clear();
            state_ = State::kAfterBlock;
          } else {
            state_ = State::kInvokeHead;
          }
          return true;
        }
        case State::kInvokeHead: {
          // `name="NAME">` then a newline; NAME runs to the last `">` (the official regex is anchored at the end).
          const std::string_view h = trim(gap);
          if (h.substr(0, 6) != "name=\"" || h.size() < 8 || h.substr(h.size() - 2) != "\">" ||
              (mk != kParam && mk != kInvokeEnd)) {
            malformed(hit->pos, d, "bad invoke tag");
            return true;
          }
          call_.name = std::string(h.substr(6, h.size() - 8));
          consume(hit->pos + mk.size(), true);
          if (mk == kParam) {
            state_ = State::kParamValue;
          } else {
            end_invoke(d);
            state_ = State::kBlock;
          }
          return true;
        }
        case State::kInvokeBody: {
          if (!all_ws(gap) || (mk != kParam && mk != kInvokeEnd)) {
            malformed(hit->pos, d, "unexpected text inside invoke");
            return true;
          }
          consume(hit->pos + mk.size(), true);
          if (mk == kParam) {
            state_ = State::kParamValue;
          } else {
            end_invoke(d);
            state_ = State::kBlock;
          }
          return true;
        }
        default:
          break;
      }
      return false;
    }

    case State::kDone:
      if (!buf_.empty()) {
        if (!all_ws(buf_)) out_.warnings.push_back("text after EOS ignored");
        consume(buf_.size(), false);
      }
      return false;
  }
  return false;
}

CompletionDelta CompletionParser::feed(std::string_view chunk) {
  if (eof_) fail("CompletionParser: feed() after finish()");
  CompletionDelta d;
  buf_.append(chunk);
  while (step(d)) {
  }
  return d;
}

CompletionDelta CompletionParser::finish() {
  CompletionDelta d;
  if (eof_) return d;
  eof_ = true;
  while (step(d)) {
  }
  if (!saw_think_end_ && out_.tool_calls.empty() && out_.saw_eos && out_.content.empty() &&
      !out_.reasoning_content.empty()) {
    // Thinking mode, EOS without </think> and without tool calls: the model answered without closing its
    // reasoning (vLLM issue #48645). The text is the answer, so it becomes content.
    out_.content = std::move(out_.reasoning_content);
    out_.reasoning_content.clear();
    out_.reasoning_moved_to_content = true;
    out_.warnings.push_back("EOS inside reasoning: reasoning returned as content");
  }
  return d;
}

ParsedCompletion parse_completion(std::string_view text, ThinkingMode mode) {
  CompletionParser p(mode);
  p.feed(text);
  p.finish();
  return p.result();
}

}  // namespace dsv4::text
