#pragma once
// Device twins of numeric/codecs.cpp and numeric/quant_sim.cpp. Each must give the same bits as the CPU version for
// the same fp32 input (the official numerics' rounding points are where CPU and GPU could otherwise diverge by a
// whole quantization step): BF16 RNE, E4M3/E2M1 RNE with saturation, the UE8M0 ceil-power-of-two scale rule.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dsv4::cuda::dev {

__device__ __forceinline__ float bf16r(float x) {
  uint32_t u = __float_as_uint(x);
  if (isnan(x)) return __uint_as_float(((u >> 16) | 0x40u) << 16);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xFFFF0000u);
}

// bf16r with a select instead of its NaN branch, for unrolled register loops (the branch made ptxas move a
// 32-element register array of norm_rope_warp_kernel to local memory). The same bits as bf16r for every input (a NaN
// keeps bf16r's quiet NaN: the plain rounding add would carry 0x7FFFFFFF into the sign bit, i.e. -0).
__device__ __forceinline__ float bf16r_sel(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  const uint32_t q = (u | 0x00400000u) & 0xFFFF0000u;
  return __uint_as_float((u & 0x7FFFFFFFu) > 0x7F800000u ? q : r);
}

// decode_e8m0(encode_e8m0_ceil(x)) for finite x > 0: the smallest power of two >= x (saturating like the CPU).
__device__ __forceinline__ float pow2_ceil(float x) {
  uint32_t u = __float_as_uint(x);
  int e = (u >> 23) & 0xFF;
  uint32_t mant = u & 0x7FFFFFu;
  int b;
  if (e == 0) {
    int msb = 31 - __clz(mant);
    int p = msb - 149 + ((mant & (mant - 1)) ? 1 : 0);
    b = p + 127;
    if (b < 0) b = 0;
  } else {
    b = e + (mant ? 1 : 0);
    if (b > 254) b = 254;
  }
  if (b == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(static_cast<uint32_t>(b) << 23);
}

// Round |x| (finite) to the grid of a small float format (mbits mantissa bits, minimum normal exponent min_exp),
// ties to even, then saturate to maxv: decode(encode(x)) of codecs.cpp for E4M3 (3, -6, 448) and E2M1 (1, 0, 6).
// The grid's exponent eu = max(floor(log2 |x|), min_exp) comes from the fp32 exponent field (zero and fp32 subnormals
// clamp to min_exp, as frexpf's would), and the power-of-two scalings are multiplications by exact powers of two:
// the same values as frexpf / ldexpf / a division, without their instruction sequences (the prefill QA8 kernel was
// issue-bound on them).
__device__ __forceinline__ float round_small(float x, int mbits, int min_exp, float maxv) {
  float ax = fabsf(x);
  float r;
  if (ax >= maxv) {
    r = maxv;
  } else {
    int eu = static_cast<int>(__float_as_uint(ax) >> 23) - 127;  // ax < maxv: finite, sign bit clear (or NaN)
    if (eu < min_exp) eu = min_exp;
    const float inv = __uint_as_float(static_cast<uint32_t>(127 + mbits - eu) << 23);      // 2^(mbits - eu)
    const float quantum = __uint_as_float(static_cast<uint32_t>(127 - mbits + eu) << 23);  // 2^(eu - mbits)
    r = rintf(ax * inv) * quantum;  // exact scalings; rintf = RNE
    if (r > maxv) r = maxv;
  }
  return copysignf(r, x);
}
__device__ __forceinline__ float e4m3_rt(float x) { return round_small(x, 3, -6, 448.0f); }
__device__ __forceinline__ float e2m1_rt(float x) { return round_small(x, 1, 0, 6.0f); }

__device__ __forceinline__ float e2m1_value(uint32_t c) {
  const uint32_t e = (c >> 1) & 3u, m = c & 1u;
  float mag = e == 0 ? 0.5f * static_cast<float>(m) : ldexpf(1.0f + 0.5f * static_cast<float>(m), static_cast<int>(e) - 1);
  return (c & 8u) ? -mag : mag;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions (all threads must call; blockDim a multiple of 32, <= 1024). `red` is 32 doubles of smem.
__device__ __forceinline__ double block_sum_d(double v, double* red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  double r = 0.0;
  for (int i = 0; i < nw; ++i) r += red[i];
  return r;
}
__device__ __forceinline__ float block_max(float v, double* red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int i = 0; i < nw; ++i) r = fmaxf(r, static_cast<float>(red[i]));
  return r;
}

// Fake quantization of `len` (<= 128) elements by ONE warp: kind 8 = SIM8/QA8 (E4M3, qmax 448, amax floor 1e-4),
// kind 4 = SIM4 (E2M1, qmax 6, amax floor 6*2^-126). In place on p (shared or global).
__device__ __forceinline__ void warp_fake_quant(float* p, int len, int kind) {
  const int lane = threadIdx.x & 31;
  float amax = 0.0f;
  for (int i = lane; i < len; i += 32) amax = fmaxf(amax, fabsf(p[i]));
  amax = warp_max(amax);
  const float qmax = kind == 8 ? 448.0f : 6.0f;
  const float floor_a = kind == 8 ? 1e-4f : 6.0f * 1.1754943508222875e-38f;
  const float s = pow2_ceil(fmaxf(amax, floor_a) / qmax);
  for (int i = lane; i < len; i += 32) {
    float v = fminf(fmaxf(p[i] / s, -qmax), qmax);
    p[i] = (kind == 8 ? e4m3_rt(v) : e2m1_rt(v)) * s;
  }
  __syncwarp();
}

// warp_fake_quant of one block of <= 128 elements held in registers: lane l holds elements 4l .. 4l + 3 in v, the
// first `valid` of them real (<= 0: none, >= 4: all) (the rest neither enter the block maximum nor are changed). The same bits as
// warp_fake_quant (the maximum is exact in any order; the per-element formula is the same): one global read and
// one write per element instead of a copy, a re-read and a write (qa8_v4_kernel).
__device__ __forceinline__ void warp_fake_quant4(float (&v)[4], int valid, int kind) {
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (e < valid) amax = fmaxf(amax, fabsf(v[e]));
  amax = warp_max(amax);
  const float qmax = kind == 8 ? 448.0f : 6.0f;
  const float floor_a = kind == 8 ? 1e-4f : 6.0f * 1.1754943508222875e-38f;
  const float s = pow2_ceil(fmaxf(amax, floor_a) / qmax);
  const float inv = 1.0f / s;  // exact: s is a power of two in [2^-126, 2^127]; v * inv == v / s
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (e < valid) {
      const float q = fminf(fmaxf(v[e] * inv, -qmax), qmax);
      v[e] = (kind == 8 ? e4m3_rt(q) : e2m1_rt(q)) * s;
    }
  }
}

// Block-wide fake quantization of x[0..n) in blocks of `block` elements (n % block == 0 or a short last block).
__device__ __forceinline__ void block_fake_quant(float* x, int n, int block, int kind) {
  const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int b = w; b * block < n; b += nw) {
    int len = n - b * block < block ? n - b * block : block;
    warp_fake_quant(x + b * block, len, kind);
  }
  __syncthreads();
}

// Normalised Walsh-Hadamard transform of x[0..n) in shared memory (n a power of two), same butterflies as the CPU.
__device__ __forceinline__ void block_hadamard(float* x, int n) {
  for (int h = 1; h < n; h <<= 1) {
    for (int j = threadIdx.x; j < n / 2; j += blockDim.x) {
      int i = (j / h) * 2 * h + (j % h);
      float a = x[i], b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
    __syncthreads();
  }
  const float s = 1.0f / sqrtf(static_cast<float>(n));
  for (int j = threadIdx.x; j < n; j += blockDim.x) x[j] *= s;
  __syncthreads();
}

// RoPE on interleaved pairs of x[0..2*pairs) at position pos (fp32 angle pos * inv_freq, like rope.cpp).
// One RoPE pair (a, b) of pair index i at position fp: explicit roundings, so that every kernel that rotates a pair
// (norm_rope's block_rope, the attention merge's fused inverse RoPE) computes the same bits.
// rope_angle + rope_apply = rope_pair, split for callers that rotate several pairs by one angle.
__device__ __forceinline__ void rope_angle(float fp, float inv_freq_i, bool inverse, float& c, float& s) {
  const float ang = __fmul_rn(fp, inv_freq_i);
  c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
}
__device__ __forceinline__ void rope_apply(float& a, float& b, float c, float s) {
  const float a0 = a, b0 = b;
  a = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b0, s));
  b = __fadd_rn(__fmul_rn(a0, s), __fmul_rn(b0, c));
}
__device__ __forceinline__ void rope_pair(float& a, float& b, float fp, float inv_freq_i, bool inverse) {
  float c, s;
  rope_angle(fp, inv_freq_i, inverse, c, s);
  rope_apply(a, b, c, s);
}
__device__ __forceinline__ void block_rope(float* x, const float* inv_freq, int pairs, int64_t pos, bool inverse) {
  const float fp = static_cast<float>(pos);
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) rope_pair(x[2 * i], x[2 * i + 1], fp, inv_freq[i], inverse);
  __syncthreads();
}

// x = x * r * w over n elements in shared memory, r = 1/sqrt(mean(x^2) + eps) with a double sum (as cpu_math.cpp).
__device__ __forceinline__ void block_rms(float* x, int n, const float* w, double eps, double* red) {
  double ss = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += static_cast<double>(x[i]) * x[i];
  ss = block_sum_d(ss, red);
  const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = w ? x[i] * r * w[i] : x[i] * r;
  __syncthreads();
}

__device__ __forceinline__ void block_round_bf16(float* x, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = bf16r(x[i]);
  __syncthreads();
}

}  // namespace dsv4::cuda::dev
