// Operands of the tensor-core prefill GEMM (prefill_gemm.cu) as sums of BF16 terms (included INSIDE kernels.cu's
// anonymous namespace; uses its WRow/load8/init_lut helpers).
//
// Limits (unreachable with real activations and weights; a reviewer checked all 2^32 fp32 values on the host):
// |v| >= 0x7F7F8000 (about 3.39e38, the top 2^-9 of the fp32 range) rounds to a BF16 infinity and the terms become
// inf/NaN; below 2^-110, bits under BF16's smallest subnormal are lost (absolute error < 2^-134).
// Why terms: the GEMM must give the CPU reference's fp32 result, not a BF16 approximation of it. A value v is split
// as v = b1 + b2 + b3 with b1 = bf16(v), b2 = bf16(v - b1), b3 = bf16(v - b1 - b2): each subtraction is exact in
// fp32 and three terms carry all 24 significand bits, so sum_k x_k w_k = sum_{i,j} sum_k xi_k wj_k exactly, every
// product of two BF16 values is exact in fp32, and the tensor cores accumulate in fp32. Values that are already BF16
// (QA8 activations, FP8 x power-of-two scales, MXFP4, BF16 weights) need one term. The (i, j) term pairs are laid
// out along K — X' = [x_j for each i], W' = [w_i repeated for each j] — so one GEMM with K' = tw * tx * K sums them.

__device__ __forceinline__ void split3(float v, __nv_bfloat16 (&b)[3], int terms) {
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    if (i < terms) {
      b[i] = __float2bfloat16_rn(v);
      v -= __bfloat162float(b[i]);
    }
  }
}

// out[r][(i * tx + j) * K + k] = term i of W[r0 + r][k], for r < rows, i < tw, j < tx. One thread per 8 weights.
template <int F>
__global__ void dequant_bf16_kernel(WRow W, int64_t r0, int64_t rows, int tw, int tx, __nv_bfloat16* out) {
  pdl_wait();
  __shared__ float lut[16];
  init_lut(lut);
  const int64_t K = W.in, per_row = K / 8, kp = K * tw * tx;
  const int64_t total = rows * per_row;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row, c = idx % per_row;
    float v[8];
    load8<F>(W, r0 + r, 8 * c, v, lut);
    __nv_bfloat16 t[8][3];
#pragma unroll
    for (int e = 0; e < 8; ++e) split3(v[e], t[e], tw);
    // i unrolled (a compile-time index into t): with a runtime bound t went to local memory (ncu, 8K prefill: 524,288
    // local-load sectors per 4 layers in the FP8 instance).
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      if (i >= tw) break;
      alignas(16) __nv_bfloat16 pack[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) pack[e] = t[e][i];
      const uint4 p = *reinterpret_cast<const uint4*>(pack);
      for (int j = 0; j < tx; ++j) *reinterpret_cast<uint4*>(out + r * kp + (i * tx + j) * K + 8 * c) = p;
    }
  }
}

// out[t][(i * tx + j) * K + k] = term j of x[t * ldx + k], for t < n, i < tw, j < tx. One thread per element.
__global__ void split_bf16_kernel(const float* x, int64_t ldx, int n, int64_t K, int tw, int tx, __nv_bfloat16* out) {
  pdl_wait();
  const int64_t kp = K * tw * tx, total = static_cast<int64_t>(n) * K;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / K, k = idx % K;
    __nv_bfloat16 b[3];
    split3(x[t * ldx + k], b, tx);
    for (int i = 0; i < tw; ++i)
      for (int j = 0; j < tx; ++j) out[t * kp + (i * tx + j) * K + k] = b[j];
  }
}

// split_bf16_kernel's function, 8 consecutive elements of a row per thread (K % 8 == 0, x and out 16-byte aligned,
// ldx % 4 == 0): two float4 loads, one 16-byte store per (i, j) term slot; the terms' register array indexed only at
// compile time (TX). Rows by blockIdx.y (grid-stride), no 64-bit division per element. The per-element version ran at
// ~0.9 TB/s (ncu, one H200, 8K-token prefill: 145 us per 8192 x 4096 split, 10.5 ms per 4 Flash layers) with its term
// array in local memory. The same bits: split3 per element.
template <int TX>
__global__ void __launch_bounds__(256) split_bf16_v8_kernel(const float* x, int64_t ldx, int n, int64_t K, int tw,
                                                            __nv_bfloat16* out) {
  pdl_wait();
  const int64_t per_row = K / 8, kp = K * tw * TX;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    const float* xr = x + static_cast<int64_t>(t) * ldx;
    __nv_bfloat16* orow = out + static_cast<int64_t>(t) * kp;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < per_row;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const float4 a = *reinterpret_cast<const float4*>(xr + 8 * c), b = *reinterpret_cast<const float4*>(xr + 8 * c + 4);
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      alignas(16) __nv_bfloat16 pack[TX][8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        __nv_bfloat16 tb[3];
        split3(v[e], tb, TX);
#pragma unroll
        for (int j = 0; j < TX; ++j) pack[j][e] = tb[j];
      }
      for (int i = 0; i < tw; ++i)
#pragma unroll
        for (int j = 0; j < TX; ++j)
          *reinterpret_cast<uint4*>(orow + (i * TX + j) * K + 8 * c) = *reinterpret_cast<const uint4*>(pack[j]);
    }
  }
}

// y[t * ldy + c] = bf16r(y[...]) for t < n, c < cols (the official BF16 output rounding of a strided output).
// Vector version (cols % 4 == 0, ldy % 4 == 0, y 16-byte aligned): a float4 per thread, rows by blockIdx.y; the
// per-element one ran at ~1.3 TB/s (ncu: 172 us per 8192 x 8192 call at 8K).
__global__ void __launch_bounds__(256) round_rows_v4_kernel(float* y, int n, int64_t cols, int64_t ldy) {
  pdl_wait();
  const int64_t per_row = cols / 4;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    float4* row = reinterpret_cast<float4*>(y + static_cast<int64_t>(t) * ldy);
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < per_row;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float4 v = row[c];
      v.x = bf16r(v.x), v.y = bf16r(v.y), v.z = bf16r(v.z), v.w = bf16r(v.w);
      row[c] = v;
    }
  }
}
__global__ void round_rows_kernel(float* y, int n, int64_t cols, int64_t ldy) {
  pdl_wait();
  const int64_t total = static_cast<int64_t>(n) * cols;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float* p = y + (idx / cols) * ldy + idx % cols;
    *p = bf16r(*p);
  }
}
