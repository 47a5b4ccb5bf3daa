#pragma once
// Exact bit-level codecs for every storage dtype in DeepSeek-V4 checkpoints (MODEL.md Appendix B).
// decode_* is exact; encode_* rounds to nearest, ties to even (RNE), saturating where the format has no infinity.
#include <cstdint>

namespace dsv4::num {

float decode_bf16(uint16_t b);
uint16_t encode_bf16(float x);  // RNE; NaN stays NaN (quiet)
float decode_f16(uint16_t h);
uint16_t encode_f16(float x);   // RNE; overflow -> inf

// OCP FP8 E4M3 "fn": bias 7, no inf, S.1111.111 = NaN, max finite 448.
float decode_e4m3(uint8_t b);
uint8_t encode_e4m3(float x);   // RNE; |x| > 448 saturates to ±448 (as the reference clamps before casting); NaN -> 0x7F
// OCP FP8 E5M2: bias 15, has inf/NaN, max finite 57344.
float decode_e5m2(uint8_t b);
uint8_t encode_e5m2(float x);   // RNE; overflow -> ±inf (IEEE-like)
// E8M0 (UE8M0) scale byte: 2^(b-127); 255 = NaN.
float decode_e8m0(uint8_t b);
uint8_t encode_e8m0_ceil(float x);  // smallest power of two >= x (x > 0, finite); the scale rule of MODEL.md §4.1
// FP4 E2M1 nibble: {0,0.5,1,1.5,2,3,4,6}, bit 3 = sign.
float decode_e2m1(uint8_t nibble);
uint8_t encode_e2m1(float x);   // RNE on the E2M1 grid; |x| > 6 saturates to ±6
// Packed FP4 along K: element k is the low nibble of byte k/2 when k is even, the high nibble when odd.
inline uint8_t fp4_nibble(const uint8_t* row, int64_t k) {
  uint8_t b = row[k >> 1];
  return (k & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
}

// The UE8M0 power-of-two scale rule (MODEL.md §4.1): s = 2^ceil(log2(amax/qmax)), computed from the fp32 bit pattern
// of amax/qmax (its exponent, +1 when the mantissa is non-zero). amax must already be floored by the caller.
float ue8m0_scale(float amax, float qmax);

}  // namespace dsv4::num
