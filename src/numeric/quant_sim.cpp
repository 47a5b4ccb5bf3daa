#include "numeric/quant_sim.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "numeric/codecs.h"

namespace dsv4::num {

void round_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = decode_bf16(encode_bf16(x[i]));
}

void fp8_sim(float* x, int64_t n, int block) {
  DSV4_CHECK(block > 0 && n % block == 0, "fp8_sim: n=", n, " not a multiple of block ", block);
  for (int64_t b = 0; b < n; b += block) {
    float amax = 0.0f;
    for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    float s = ue8m0_scale(std::max(amax, 1e-4f), 448.0f);
    for (int i = 0; i < block; ++i) {
      float v = std::clamp(x[b + i] / s, -448.0f, 448.0f);
      x[b + i] = decode_e4m3(encode_e4m3(v)) * s;
    }
  }
}

void fp4_sim(float* x, int64_t n) {
  DSV4_CHECK(n % 32 == 0, "fp4_sim: n=", n, " not a multiple of 32");
  const float floor_amax = 6.0f * std::ldexp(1.0f, -126);
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    float s = ue8m0_scale(std::max(amax, floor_amax), 6.0f);
    for (int i = 0; i < 32; ++i) {
      float v = std::clamp(x[b + i] / s, -6.0f, 6.0f);
      x[b + i] = decode_e2m1(encode_e2m1(v)) * s;
    }
  }
}

void hadamard(float* x, int n) {
  DSV4_CHECK(n > 0 && (n & (n - 1)) == 0, "hadamard: n=", n, " is not a power of two");
  for (int h = 1; h < n; h <<= 1)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float s = 1.0f / std::sqrt(static_cast<float>(n));
  for (int i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace dsv4::num
