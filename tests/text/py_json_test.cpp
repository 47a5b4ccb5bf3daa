// json.loads / json.dumps(ensure_ascii=False) emulation (CHAT_FORMAT.md §2.6.1). Expected strings are what
// CPython 3.11 prints for the same input.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "text/py_json.h"

namespace dsv4::text {
namespace {

std::string roundtrip(const std::string& s) { return py_json_dumps(py_json_loads(s)); }

TEST(PyJson, SeparatorsAndKeyOrder) {
  EXPECT_EQ(roundtrip(R"({"b":1,"a":[1,2,{}],"c":{"z":[],"y":null}})"),
            R"({"b": 1, "a": [1, 2, {}], "c": {"z": [], "y": null}})");
  EXPECT_EQ(roundtrip("[]"), "[]");
  EXPECT_EQ(roundtrip("{}"), "{}");
  EXPECT_EQ(roundtrip(" [true ,false , null] "), "[true, false, null]");
}

TEST(PyJson, DuplicateKeysKeepFirstPositionLastValue) {
  EXPECT_EQ(roundtrip(R"({"a":1,"b":2,"a":3})"), R"({"a": 3, "b": 2})");
}

TEST(PyJson, FloatsPrintLikePythonRepr) {
  const std::pair<const char*, const char*> cases[] = {
      {"1.0", "1.0"},         {"1e2", "100.0"},     {"0.00001", "1e-05"},   {"0.0001", "0.0001"},
      {"1e16", "1e+16"},      {"1e15", "1000000000000000.0"},                 {"1.5e20", "1.5e+20"},
      {"-0.0", "-0.0"},       {"0.1", "0.1"},       {"3.14159", "3.14159"}, {"1e400", "Infinity"},
      {"-1e400", "-Infinity"}, {"123456789.125", "123456789.125"},          {"2.5E-7", "2.5e-07"},
      {"1.7976931348623157e308", "1.7976931348623157e+308"},                {"5e-324", "5e-324"},
      {"NaN", "NaN"},         {"Infinity", "Infinity"}, {"-Infinity", "-Infinity"}};
  for (const auto& [in, out] : cases) EXPECT_EQ(roundtrip(in), out) << in;
  EXPECT_EQ(py_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(py_float_repr(1e22), "1e+22");
  EXPECT_EQ(py_float_repr(123.0), "123.0");
}

TEST(PyJson, IntegersKeepArbitraryPrecision) {
  EXPECT_EQ(roundtrip("123456789012345678901234567890"), "123456789012345678901234567890");
  EXPECT_EQ(roundtrip("-0"), "0");
  EXPECT_EQ(roundtrip("-17"), "-17");
}

TEST(PyJson, StringsEscapeOnlyWhatPythonEscapes) {
  // Non-ASCII, U+007F, U+2028 and "/" stay raw; controls become \u00xx in lower-case hex.
  EXPECT_EQ(roundtrip(R"("caf\u00e9 \u4e2d \ud83d\ude00 \u007f \u2028 / \" \\ \n\r\t\b\f \u0001\u001f")"),
            "\"caf\u00e9 \u4e2d \U0001F600 \x7f \u2028 / \\\" \\\\ \\n\\r\\t\\b\\f \\u0001\\u001f\"");
}

TEST(PyJson, MalformedInputFailsCleanly) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "\"\\x\"", "\"a\nb\"", "tru", "[1] x", "\"\\ud800\"",
                          "{'a': 1}", "\"\xC3\""})
    EXPECT_THROW(py_json_loads(bad), Error) << bad;
  EXPECT_THROW(py_json_loads(std::string(100000, '[')), Error);  // deep nesting
}

TEST(PyJson, Truthiness) {
  for (const char* f : {"null", "false", "0", "0.0", "\"\"", "[]", "{}"}) EXPECT_FALSE(py_json_loads(f).truthy()) << f;
  for (const char* t : {"true", "1", "0.5", "\"x\"", "[0]", "{\"a\":0}"}) EXPECT_TRUE(py_json_loads(t).truthy()) << t;
}

}  // namespace
}  // namespace dsv4::text
