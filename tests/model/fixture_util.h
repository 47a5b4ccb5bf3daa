#pragma once
// Golden fixtures (tests/fixtures/<case>/: config.json, safetensors, ids.bin, logits.bin) written by
// tools/oracle/make_fixtures.py from Hugging Face transformers.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/model.h"

namespace dsv4::test {

inline std::string fixtures_dir() { return std::string(DSV4_SOURCE_DIR) + "/tests/fixtures"; }

inline std::vector<std::string> fixture_cases() {
  std::vector<std::string> v;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(fixtures_dir(), ec))
    if (e.is_directory() && std::filesystem::exists(e.path() / "logits.bin")) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

template <typename T>
std::vector<T> read_bin(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("cannot open " + path);
  auto n = static_cast<size_t>(f.tellg());
  std::vector<T> v(n / sizeof(T));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n));
  return v;
}

// Logits for all of `ids`, fed as chunks of `chunk` tokens (0 = one chunk), optionally with explicit split points.
inline std::vector<float> run_logits(Model& m, const std::vector<int32_t>& ids, int chunk,
                                     const std::vector<int>& splits = {}) {
  const int T = static_cast<int>(ids.size());
  std::vector<int> bounds{0};
  if (!splits.empty()) {
    for (int s : splits)
      if (s > 0 && s < T) bounds.push_back(s);
  } else {
    int step = chunk > 0 ? chunk : T;
    for (int p = step; p < T; p += step) bounds.push_back(p);
  }
  bounds.push_back(T);
  int max_chunk = 1;
  for (size_t i = 1; i < bounds.size(); ++i) max_chunk = std::max(max_chunk, bounds[i] - bounds[i - 1]);
  Forward fwd(m, max_chunk);
  auto st = m.backend().new_sequence(T);
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  std::vector<float> out(static_cast<size_t>(T) * V);
  for (size_t i = 1; i < bounds.size(); ++i)
    fwd.forward(*st, ids.data() + bounds[i - 1], bounds[i] - bounds[i - 1], bounds[i - 1],
                out.data() + static_cast<size_t>(bounds[i - 1]) * V);
  return out;
}

inline float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Relative L2 distance ||got - ref|| / ||ref|| (double accumulation), for logits comparisons.
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace dsv4::test
