#include "numeric/codecs.h"

#include <bit>
#include <cmath>
#include <limits>

namespace dsv4::num {

float decode_bf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t encode_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

float decode_f16(uint16_t h) {
  uint32_t s = (h >> 15) & 1, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float v;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else v = std::ldexp(static_cast<float>(m | 0x400), static_cast<int>(e) - 25);
  return s ? -v : v;
}

// Generic RNE encoder for small float formats with `mbits` mantissa bits, exponent bias `bias`, minimum normal
// exponent 1. Returns the magnitude code (without sign) for a finite |x| that is within range; caller saturates.
static uint32_t encode_small_magnitude(float ax, int mbits, int bias) {
  // Smallest normal = 2^(1-bias). Quantum in subnormal range = 2^(1-bias-mbits).
  int e;
  std::frexp(ax, &e);   // ax = f * 2^e, f in [0.5,1) -> unbiased exponent of leading bit = e-1
  int exp_unb = e - 1;
  int min_exp = 1 - bias;
  if (exp_unb < min_exp) exp_unb = min_exp;  // subnormal: same quantum as the smallest normal binade
  double quantum = std::ldexp(1.0, exp_unb - mbits);
  double q = static_cast<double>(ax) / quantum;  // exact (power-of-two division)
  double r = std::nearbyint(q);                  // default rounding mode = to nearest even
  // r in [0, 2^(mbits+1)]; r == 2^(mbits+1) means rounding carried into the next binade.
  uint64_t ri = static_cast<uint64_t>(r);
  uint32_t code;
  if (ri >= (1ull << mbits)) {                   // normal
    int be = exp_unb + bias;
    if (ri == (1ull << (mbits + 1))) { ri >>= 1; be += 1; }
    code = (static_cast<uint32_t>(be) << mbits) | static_cast<uint32_t>(ri & ((1ull << mbits) - 1));
  } else {                                       // subnormal (only when exp_unb == min_exp)
    code = static_cast<uint32_t>(ri);
  }
  return code;
}

uint16_t encode_f16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(x)) return static_cast<uint16_t>(sign | 0x7E00);  // quiet NaN
  float ax = std::fabs(x);
  // Max finite 65504; the next step would be 65536, so RNE sends [65520, inf] to inf (65520 is a tie with an odd
  // mantissa below it).
  if (ax >= 65520.0f) return static_cast<uint16_t>(sign | 0x7C00);
  return static_cast<uint16_t>(sign | encode_small_magnitude(ax, 10, 15));
}

float decode_e4m3(uint8_t b) {
  uint32_t s = b >> 7, e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 | m), static_cast<int>(e) - 10);
  return s ? -v : v;
}

uint8_t encode_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float ax = std::fabs(x);
  if (ax >= 448.0f) return sign | 0x7E;
  uint32_t code = encode_small_magnitude(ax, 3, 7);
  if (code > 0x7E) code = 0x7E;  // rounding up past 448 (only from values in (448, 464)) saturates
  return static_cast<uint8_t>(sign | code);
}

float decode_e5m2(uint8_t b) {
  uint32_t s = b >> 7, e = (b >> 2) & 0x1F, m = b & 3;
  float v;
  if (e == 31) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (e == 0) v = std::ldexp(static_cast<float>(m), -16);
  else v = std::ldexp(static_cast<float>(4 | m), static_cast<int>(e) - 17);
  return s ? -v : v;
}

uint8_t encode_e5m2(float x) {
  if (std::isnan(x)) return 0x7F;
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float ax = std::fabs(x);
  if (std::isinf(ax)) return sign | 0x7C;
  // Values >= 61440 (halfway between max 57344 and the next step 65536) round to inf under IEEE RNE.
  if (ax >= 61440.0f) return sign | 0x7C;
  uint32_t code = encode_small_magnitude(ax, 2, 15);
  return static_cast<uint8_t>(sign | code);
}

float decode_e8m0(uint8_t b) {
  if (b == 255) return std::numeric_limits<float>::quiet_NaN();
  if (b == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127 is a float subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 23);
}

uint8_t encode_e8m0_ceil(float x) {
  if (!(x > 0.0f) || std::isinf(x) || std::isnan(x)) return 255;
  uint32_t u = std::bit_cast<uint32_t>(x);
  int e = static_cast<int>((u >> 23) & 0xFF);
  uint32_t mant = u & 0x7FFFFF;
  if (e == 0) {  // subnormal input: value = mant * 2^-149; ceil to power of two
    int msb = 31 - std::countl_zero(mant);  // value in [2^(msb-149), 2^(msb-148))
    int p = msb - 149 + ((mant & (mant - 1)) ? 1 : 0);
    int b = p + 127;
    return static_cast<uint8_t>(b < 0 ? 0 : b);
  }
  int b = e + (mant ? 1 : 0);
  return static_cast<uint8_t>(b > 254 ? 254 : b);
}

float decode_e2m1(uint8_t n) {
  static constexpr float kLut[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                     -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  return kLut[n & 0xF];
}

uint8_t encode_e2m1(float x) {
  uint8_t sign = std::signbit(x) ? 8 : 0;
  if (std::isnan(x)) return 0;  // no NaN in E2M1; callers must not feed NaN
  float ax = std::fabs(x);
  if (ax >= 6.0f) return sign | 7;
  uint32_t code = encode_small_magnitude(ax, 1, 1);
  if (code > 7) code = 7;
  return static_cast<uint8_t>(sign | code);
}

float ue8m0_scale(float amax, float qmax) {
  float r = amax / qmax;
  return decode_e8m0(encode_e8m0_ceil(r));
}

}  // namespace dsv4::num
