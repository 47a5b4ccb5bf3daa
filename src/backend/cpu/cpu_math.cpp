#include "backend/cpu/cpu_math.h"

#include <algorithm>
#include <cmath>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DSV4_CPU_FMA8 1
#endif

namespace dsv4::cpu {

// The dot product's arithmetic is spelled out (not left to the compiler's vectoriser and FP contraction), so that
// matmul_nt's register-tiled kernel below computes every output with exactly the same operations as dot():
//   acc[j] (j = 0..7) accumulates a[k+j]*b[k+j] over the full blocks of 8, in k order;
//   s = ((acc0+acc1) + (acc2+acc3)) + ((acc4+acc5) + (acc6+acc7));
//   the remaining n % 8 products are added to s in k order.
// With FMA (Release builds, -march=x86-64-v3) every multiply-add is fused; without it (no FMA hardware) none is.
// Results are deterministic for a given n, independent of thread count and of how many rows a matmul processes.
namespace {

#ifdef DSV4_CPU_FMA8
inline float tail(const float* a, const float* b, int64_t k, int64_t n, float s) {
  for (; k < n; ++k) s = std::fma(a[k], b[k], s);
  return s;
}
// ((v0+v1) + (v2+v3)) + ((v4+v5) + (v6+v7)) of each of four vectors, as one [4] vector (dot()'s reduction tree:
// hadd adds adjacent lanes, the last add joins the two 128-bit halves).
[[gnu::always_inline]] inline __m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
inline float reduce1(__m256 a) {
  alignas(32) float v[8];
  _mm256_store_ps(v, a);
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// y[t, o..o+4) for the RT input rows t..t+RT: four weight rows per pass over the inputs, so each weight row is
// read once for RT input rows (and once per call when the inputs stay in cache).
template <int RT>
[[gnu::always_inline]] inline void tile4(const float* x, int64_t t, int64_t in, const float* W, int64_t o, int64_t out, float* y) {
  __m256 acc[RT][4];
  for (int r = 0; r < RT; ++r)
    for (int w = 0; w < 4; ++w) acc[r][w] = _mm256_setzero_ps();
  const float* w0 = W + o * in;
  const int64_t full = in / 8 * 8;
  for (int64_t k = 0; k < full; k += 8) {
    __m256 xv[RT];
    for (int r = 0; r < RT; ++r) xv[r] = _mm256_loadu_ps(x + (t + r) * in + k);
    for (int w = 0; w < 4; ++w) {
      const __m256 wv = _mm256_loadu_ps(w0 + w * in + k);
      for (int r = 0; r < RT; ++r) acc[r][w] = _mm256_fmadd_ps(xv[r], wv, acc[r][w]);
    }
  }
  for (int r = 0; r < RT; ++r) {
    float* yr = y + (t + r) * out + o;
    _mm_storeu_ps(yr, reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    if (full < in)
      for (int w = 0; w < 4; ++w) yr[w] = tail(x + (t + r) * in, w0 + w * in, full, in, yr[w]);
  }
}
#endif

}  // namespace

float dot(const float* a, const float* b, int64_t n) {
#ifdef DSV4_CPU_FMA8
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  return tail(a, b, k, n, reduce1(acc));
#else
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
#endif
}

void matmul_nt(const float* x, int64_t n, int64_t in, const float* W, int64_t out, float* y) {
#ifdef DSV4_CPU_FMA8
  // Blocks of four weight rows (OpenMP over them), each against the inputs three rows at a time: every y element is
  // dot(x row, W row), bit for bit. Dynamic chunks of about 64k multiply-adds: a thread that loses its core to
  // another process (a loaded CI machine, the server's HTTP threads) does not hold the others up at the barrier.
  const int64_t blocks = out / 4;
  const int chunk = static_cast<int>(std::max<int64_t>(1, 65536 / std::max<int64_t>(1, 4 * n * in)));
#pragma omp parallel for schedule(dynamic, chunk) if (out * n * in > 65536)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t o = b * 4;
    int64_t t = 0;
    for (; t + 3 <= n; t += 3) tile4<3>(x, t, in, W, o, out, y);
    for (; t < n; ++t) tile4<1>(x, t, in, W, o, out, y);
  }
  for (int64_t o = blocks * 4; o < out; ++o)
    for (int64_t t = 0; t < n; ++t) y[t * out + o] = dot(x + t * in, W + o * in, in);
#else
#pragma omp parallel for schedule(static) if (out * n * in > 65536)
  for (int64_t o = 0; o < out; ++o)
    for (int64_t t = 0; t < n; ++t) y[t * out + o] = dot(x + t * in, W + o * in, in);
#endif
}

void rms_norm(const float* x, int64_t n, const float* w, double eps, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = w ? x[i] * r * w[i] : x[i] * r;
}

}  // namespace dsv4::cpu
