#include "text/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "text/utf8.h"

namespace dsv4::text {

// --- value ----------------------------------------------------------------------------------------------------------

PyJson PyJson::boolean(bool b) {
  PyJson j;
  j.type_ = Type::Bool;
  j.bool_ = b;
  return j;
}
PyJson PyJson::integer(std::string decimal) {
  PyJson j;
  j.type_ = Type::Int;
  j.text_ = std::move(decimal);
  return j;
}
PyJson PyJson::floating(double d) {
  PyJson j;
  j.type_ = Type::Float;
  j.float_ = d;
  return j;
}
PyJson PyJson::string(std::string s) {
  PyJson j;
  j.type_ = Type::String;
  j.text_ = std::move(s);
  return j;
}
PyJson PyJson::array(std::vector<PyJson> items) {
  PyJson j;
  j.type_ = Type::Array;
  j.array_ = std::move(items);
  return j;
}
PyJson PyJson::object(std::vector<std::pair<std::string, PyJson>> members) {
  PyJson j;
  j.type_ = Type::Object;
  for (auto& [k, v] : members) j.set(std::move(k), std::move(v));
  return j;
}

const std::string& PyJson::as_string() const {
  if (type_ != Type::String && type_ != Type::Int) fail("JSON value is not a string");
  return text_;
}
const std::vector<PyJson>& PyJson::items() const {
  if (type_ != Type::Array) fail("JSON value is not an array");
  return array_;
}
std::vector<PyJson>& PyJson::items() {
  if (type_ != Type::Array) fail("JSON value is not an array");
  return array_;
}
const std::vector<std::pair<std::string, PyJson>>& PyJson::members() const {
  if (type_ != Type::Object) fail("JSON value is not an object");
  return object_;
}

const PyJson* PyJson::get(std::string_view key) const {
  if (type_ != Type::Object) return nullptr;
  for (const auto& [k, v] : object_)
    if (k == key) return &v;
  return nullptr;
}

void PyJson::set(std::string key, PyJson value) {
  if (type_ != Type::Object) fail("JSON value is not an object");
  for (auto& [k, v] : object_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  object_.emplace_back(std::move(key), std::move(value));
}

void PyJson::erase(std::string_view key) {
  if (type_ != Type::Object) return;
  for (auto it = object_.begin(); it != object_.end(); ++it)
    if (it->first == key) {
      object_.erase(it);
      return;
    }
}

bool PyJson::truthy() const {
  switch (type_) {
    case Type::Null: return false;
    case Type::Bool: return bool_;
    case Type::Int: return text_ != "0";
    case Type::Float: return float_ != 0.0;  // NaN is truthy in Python too
    case Type::String: return !text_.empty();
    case Type::Array: return !array_.empty();
    case Type::Object: return !object_.empty();
  }
  return false;
}

// --- parser (json.loads) ----------------------------------------------------------------------------------------

namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  PyJson parse_document() {
    skip_ws();
    PyJson v = value(0);
    skip_ws();
    if (i_ != s_.size()) error("extra data");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 512;  // deep nesting must fail cleanly, not overflow the stack

  [[noreturn]] void error(const char* what) const { fail("invalid JSON: ", what, " at byte ", i_); }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool consume(std::string_view lit) {
    if (s_.substr(i_, lit.size()) == lit) {
      i_ += lit.size();
      return true;
    }
    return false;
  }

  PyJson value(int depth) {
    if (depth > kMaxDepth) error("nesting too deep");
    if (i_ >= s_.size()) error("unexpected end of input");
    const char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return PyJson::string(string());
    if (consume("null")) return PyJson::null();
    if (consume("true")) return PyJson::boolean(true);
    if (consume("false")) return PyJson::boolean(false);
    if (consume("NaN")) return PyJson::floating(std::numeric_limits<double>::quiet_NaN());
    if (consume("Infinity")) return PyJson::floating(std::numeric_limits<double>::infinity());
    if (consume("-Infinity")) return PyJson::floating(-std::numeric_limits<double>::infinity());
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    error("expecting value");
  }

  PyJson object(int depth) {
    ++i_;
    PyJson obj = PyJson::object();
    skip_ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return obj;
    }
    while (true) {
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != '"') error("expecting property name in double quotes");
      std::string key = string();
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != ':') error("expecting ':' delimiter");
      ++i_;
      skip_ws();
      obj.set(std::move(key), value(depth + 1));
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return obj;
      }
      error("expecting ',' delimiter");
    }
  }

  PyJson array(int depth) {
    ++i_;
    PyJson arr = PyJson::array();
    skip_ws();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return arr;
    }
    while (true) {
      skip_ws();
      arr.items().push_back(value(depth + 1));
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return arr;
      }
      error("expecting ',' delimiter");
    }
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) error("invalid \\uXXXX escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_ + k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else error("invalid \\uXXXX escape");
    }
    i_ += 4;
    return v;
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) error("unterminated string");
      const auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) error("invalid control character in string");  // json.loads is strict by default
      if (c == '\\') {
        if (++i_ >= s_.size()) error("unterminated string");
        const char e = s_[i_++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            unsigned cp = hex4();
            if (cp >= 0xD800 && cp <= 0xDBFF && s_.substr(i_, 2) == "\\u") {
              const std::size_t save = i_;
              i_ += 2;
              const unsigned lo = hex4();
              if (lo >= 0xDC00 && lo <= 0xDFFF)
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              else
                i_ = save;
            }
            // Python would keep a lone surrogate in the str, but it has no UTF-8 form: the prompt could not be
            // written, so refuse it here with a clear message.
            if (cp >= 0xD800 && cp <= 0xDFFF) error("lone surrogate in \\u escape");
            append_utf8(out, cp);
            break;
          }
          default: error("invalid escape");
        }
        continue;
      }
      if (c < 0x80) {
        out += static_cast<char>(c);
        ++i_;
        continue;
      }
      char32_t cp;
      const std::size_t n = decode_utf8(s_, i_, cp);
      if (n == 0) error("invalid UTF-8 in string");
      out.append(s_.substr(i_, n));
      i_ += n;
    }
  }

  PyJson number() {
    const std::size_t start = i_;
    if (s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !(s_[i_] >= '0' && s_[i_] <= '9')) error("expecting value");
    if (s_[i_] == '0') {
      ++i_;
    } else {
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    bool is_float = false;
    if (i_ + 1 < s_.size() && s_[i_] == '.' && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9') {
      is_float = true;
      ++i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      std::size_t j = i_ + 1;
      if (j < s_.size() && (s_[j] == '+' || s_[j] == '-')) ++j;
      if (j < s_.size() && s_[j] >= '0' && s_[j] <= '9') {
        is_float = true;
        while (j < s_.size() && s_[j] >= '0' && s_[j] <= '9') ++j;
        i_ = j;
      }
    }
    const std::string lit(s_.substr(start, i_ - start));
    if (!is_float) {
      // Python int: "-0" is 0; JSON forbids leading zeros, so the text is otherwise canonical.
      return PyJson::integer(lit == "-0" ? "0" : lit);
    }
    // strtod rounds correctly and overflows to +-inf exactly like Python's float().
    return PyJson::floating(std::strtod(lit.c_str(), nullptr));
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          static const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void dump(const PyJson& v, std::string& out) {
  switch (v.type()) {
    case PyJson::Type::Null: out += "null"; return;
    case PyJson::Type::Bool: out += v.as_bool() ? "true" : "false"; return;
    case PyJson::Type::Int: out += v.as_string(); return;
    case PyJson::Type::Float: out += py_float_repr(v.as_float()); return;
    case PyJson::Type::String: dump_string(v.as_string(), out); return;
    case PyJson::Type::Array: {
      out += '[';
      bool first = true;
      for (const auto& x : v.items()) {
        if (!first) out += ", ";
        first = false;
        dump(x, out);
      }
      out += ']';
      return;
    }
    case PyJson::Type::Object: {
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.members()) {
        if (!first) out += ", ";
        first = false;
        dump_string(k, out);
        out += ": ";
        dump(x, out);
      }
      out += '}';
      return;
    }
  }
}

}  // namespace

PyJson py_json_loads(std::string_view text) { return Parser(text).parse_document(); }

std::string py_json_dumps(const PyJson& value) {
  std::string out;
  dump(value, out);
  return out;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "NaN";  // json.dumps spelling (repr would say nan)
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits, like Python's repr: to_chars in scientific form gives "d.ddde+XX".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  if (sci[0] == '-') {
    out += '-';
    sci.erase(0, 1);
  }
  const std::size_t epos = sci.find('e');
  std::string digits;
  for (std::size_t k = 0; k < epos; ++k)
    if (sci[k] != '.') digits += sci[k];
  const int exp10 = std::atoi(sci.c_str() + epos + 1);
  const int decpt = exp10 + 1;  // digits d1 d2 ... with the decimal point after `decpt` of them
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out.append("0.").append(static_cast<std::size_t>(-decpt), '0').append(digits);
    } else if (decpt >= n) {
      out.append(digits).append(static_cast<std::size_t>(decpt - n), '0').append(".0");
    } else {
      out.append(digits, 0, decpt).append(".").append(digits, decpt);
    }
    return out;
  }
  out += digits[0];
  if (n > 1) out.append(".").append(digits, 1);
  const int e = decpt - 1;
  out += e < 0 ? "e-" : "e+";
  const std::string ed = std::to_string(e < 0 ? -e : e);
  if (ed.size() < 2) out += '0';
  out += ed;
  return out;
}

std::string py_format_scalar(const PyJson& v, std::string_view what) {
  switch (v.type()) {
    case PyJson::Type::Null: return "None";
    case PyJson::Type::Bool: return v.as_bool() ? "True" : "False";
    case PyJson::Type::Int: return v.as_string();
    case PyJson::Type::Float: {
      if (std::isnan(v.as_float())) return "nan";
      if (std::isinf(v.as_float())) return v.as_float() > 0 ? "inf" : "-inf";
      return py_float_repr(v.as_float());
    }
    case PyJson::Type::String: return v.as_string();
    default: fail(what, " must be a string, not a JSON ", v.is_array() ? "array" : "object");
  }
}

}  // namespace dsv4::text
