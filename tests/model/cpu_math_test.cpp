// The CPU backend's matmul (register-tiled over several weight and input rows) computes every output exactly as
// dot() does for that pair of rows: batched decode relies on it for per-row bit identity (batch_test.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_math.h"

namespace dsv4 {
namespace {

TEST(CpuMath, MatmulRowsAreBitIdenticalToDot) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t in : {1, 3, 7, 8, 9, 12, 15, 16, 29, 64, 67, 128, 260})
    for (int64_t out : {1, 3, 4, 5, 8, 13, 130, 2053})  // 2053 * n * in crosses the OpenMP threshold
      for (int64_t n : {1, 2, 3, 5, 16}) {
        std::vector<float> x(static_cast<size_t>(n * in)), W(static_cast<size_t>(out * in));
        for (float& v : x) v = nd(rng);
        for (float& v : W) v = nd(rng);
        std::vector<float> y(static_cast<size_t>(n * out), -1.0f);
        cpu::matmul_nt(x.data(), n, in, W.data(), out, y.data());
        for (int64_t t = 0; t < n; ++t) {
          // One row alone through matmul_nt, and each element through dot(): all three bit-identical.
          std::vector<float> y1(static_cast<size_t>(out));
          cpu::matmul_nt(x.data() + t * in, 1, in, W.data(), out, y1.data());
          for (int64_t o = 0; o < out; ++o) {
            const float d = cpu::dot(x.data() + t * in, W.data() + o * in, in);
            const float b = y[static_cast<size_t>(t * out + o)], s = y1[static_cast<size_t>(o)];
            ASSERT_EQ(std::memcmp(&b, &d, 4), 0) << "in " << in << " out " << out << " n " << n << " row " << t << " col " << o;
            ASSERT_EQ(std::memcmp(&s, &d, 4), 0) << "in " << in << " out " << out << " single row " << t << " col " << o;
          }
        }
      }
}

}  // namespace
}  // namespace dsv4
