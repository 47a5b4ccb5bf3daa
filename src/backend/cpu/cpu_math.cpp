#include "backend/cpu/cpu_math.h"

#include <cmath>

namespace dsv4::cpu {

float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: lets the compiler vectorise without -ffast-math and keeps the order fixed
  // (results are deterministic for a given n, independent of thread count).
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

void matmul_nt(const float* x, int64_t n, int64_t in, const float* W, int64_t out, float* y) {
#pragma omp parallel for schedule(static) if (out * n * in > 65536)
  for (int64_t o = 0; o < out; ++o)
    for (int64_t t = 0; t < n; ++t) y[t * out + o] = dot(x + t * in, W + o * in, in);
}

void rms_norm(const float* x, int64_t n, const float* w, double eps, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = w ? x[i] * r * w[i] : x[i] * r;
}

}  // namespace dsv4::cpu
