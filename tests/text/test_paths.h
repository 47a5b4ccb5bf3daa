#pragma once
// Locations of the repository's test data and of the real DeepSeek-V4 tokenizer.json (models/default/, fetched by
// tools/text/fetch_tokenizer.sh and committed so that tests work on a fresh clone without network access).
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace dsv4::text::testing {

inline std::string source_path(const std::string& rel) { return std::string(DSV4_SOURCE_DIR) + "/" + rel; }
inline std::string read_source_file(const std::string& rel) {
  std::ifstream f(source_path(rel), std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + rel);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
inline std::string tokenizer_path() { return source_path("models/default/tokenizer.json"); }

}  // namespace dsv4::text::testing
