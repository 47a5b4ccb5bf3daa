#include "cli/text_cli_util.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dsv4::cli {

std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '", path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read '", path, "'");
  return ss.str();
}

std::vector<text::TokenId> parse_id_list(const std::string& s) {
  std::string t;
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') t.push_back(c);
  if (!t.empty() && t.front() == '[') {
    if (t.back() != ']') fail("--ids: unbalanced '['");
    t = t.substr(1, t.size() - 2);
  }
  std::vector<text::TokenId> ids;
  if (t.empty()) return ids;
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = t.find(',', pos);
    const std::string item = t.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    text::TokenId v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size()) fail("--ids: '", item, "' is not an id");
    ids.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

void write_stdout(const std::string& bytes) {
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size())
    fail("write to stdout failed");
  if (std::fflush(stdout) != 0) fail("write to stdout failed");
}

std::string ids_to_json(const std::vector<text::TokenId>& ids) {
  std::string out = "[";
  for (std::size_t k = 0; k < ids.size(); ++k) {
    if (k) out += ',';
    out += std::to_string(ids[k]);
  }
  out += ']';
  return out;
}

}  // namespace dsv4::cli
