#pragma once
// Test helpers: scratch directories, hand-built safetensors files (raw header text + data bytes, so that broken
// files can be written), and an assertion that a call throws dsv4::Error whose message contains given fragments.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"

namespace dsv4::ckpt::testing {

// A fresh directory under the build tree, removed when the object goes out of scope.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::path(DSV4_BINARY_DIR) / "ckpt_test_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// 8-byte little-endian length + header text + data, exactly as given (no padding, no checks).
inline std::vector<uint8_t> raw_safetensors(const std::string& header, const std::vector<uint8_t>& data,
                                            uint64_t declared_len) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data.size());  // reserving first also avoids a GCC 12 -Warray-bounds false positive
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(declared_len >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}
inline std::vector<uint8_t> raw_safetensors(const std::string& header, const std::vector<uint8_t>& data) {
  return raw_safetensors(header, data, header.size());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

// Passes only if fn throws dsv4::Error and its message contains every fragment.
inline ::testing::AssertionResult ThrowsErrorWith(const std::function<void()>& fn,
                                                  std::initializer_list<std::string> fragments) {
  try {
    fn();
  } catch (const dsv4::Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments)
      if (msg.find(f) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << f << "\"";
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-dsv4 exception: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something that is not a std::exception";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace dsv4::ckpt::testing
