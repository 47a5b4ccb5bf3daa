#pragma once
// The committed golden fixtures (tests/fixtures/NAME) as the runtime tests use them: the directory and its token ids.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace dsv4::test {

inline std::string fixture(const char* name) { return std::string(DSV4_SOURCE_DIR) + "/tests/fixtures/" + name; }

inline std::vector<int32_t> fixture_ids(const char* name) {
  std::ifstream f(fixture(name) + "/ids.bin", std::ios::binary | std::ios::ate);
  std::vector<int32_t> ids(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  return ids;
}

}  // namespace dsv4::test
