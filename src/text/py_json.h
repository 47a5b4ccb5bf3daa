#pragma once
// A small JSON DOM with Python's json module semantics, because prompts embed JSON that must be byte-identical to
// what the official encoder's json.dumps(value, ensure_ascii=False) prints (CHAT_FORMAT.md §2.6.1):
//   * objects keep insertion order; a repeated key keeps its first position and its last value (Python dict);
//   * integers keep arbitrary precision (stored as canonical decimal text), floats print like Python's repr
//     (`1.0`, `1e-05`, `1e+16`), NaN/Infinity are accepted and printed as Python does;
//   * strings are printed raw except `"`, `\` and U+0000..U+001F (ensure_ascii=False).
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv4::text {

class PyJson {
 public:
  enum class Type { Null, Bool, Int, Float, String, Array, Object };

  PyJson() = default;
  static PyJson null() { return PyJson(); }
  static PyJson boolean(bool b);
  static PyJson integer(std::string decimal);  // canonical decimal text, e.g. "-12"
  static PyJson floating(double d);
  static PyJson string(std::string s);
  static PyJson array(std::vector<PyJson> items = {});
  static PyJson object(std::vector<std::pair<std::string, PyJson>> members = {});

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }

  bool as_bool() const { return bool_; }
  double as_float() const { return float_; }
  const std::string& as_string() const;  // String (or Int: its decimal text); throws otherwise
  const std::vector<PyJson>& items() const;
  std::vector<PyJson>& items();
  const std::vector<std::pair<std::string, PyJson>>& members() const;

  // Object lookup: nullptr when absent (Python's dict.get(key) -> None).
  const PyJson* get(std::string_view key) const;
  // Sets a member (first position kept if present, appended otherwise). Object only.
  void set(std::string key, PyJson value);
  void erase(std::string_view key);

  // Python truthiness: None, False, 0, 0.0, "", [] and {} are false.
  bool truthy() const;

 private:
  Type type_ = Type::Null;
  bool bool_ = false;
  double float_ = 0;
  std::string text_;  // String value or Int decimal text
  std::vector<PyJson> array_;
  std::vector<std::pair<std::string, PyJson>> object_;
};

// json.loads: throws dsv4::Error with the byte offset on malformed input.
PyJson py_json_loads(std::string_view text);
// json.dumps(value, ensure_ascii=False).
std::string py_json_dumps(const PyJson& value);
// Python's repr(float).
std::string py_float_repr(double d);
// str(value) as str.format would print it, for the scalar values the encoder interpolates (None -> "None",
// True -> "True", strings raw, numbers as Python prints them). Lists/dicts throw dsv4::Error: their Python repr is
// not something a prompt should contain.
std::string py_format_scalar(const PyJson& value, std::string_view what);

}  // namespace dsv4::text
