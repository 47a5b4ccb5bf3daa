// Decode GEMV on the tensor cores: FP8 linears of one token (and, gemv_tc_fp8_n_kernel below, of 2-8) in official
// numerics (QA8 activations).
//
// Why: the ring GEMV (gemv_ring.cuh) dequantizes every weight to fp32 and multiplies it on the FMA pipe, ~3
// instructions per weight; ncu found it issue-bound (warps eligible but not selected, math-pipe throttle) at ~45 % of
// the bandwidth. Here the FP8 weights become f16 with one cvt per pair and the products run as mma.sync m16n8k16
// (f16 inputs, fp32 accumulation): ~0.9 instructions per weight. Exactness: E4M3 weights and the QA8 activation's
// E4M3 values q (x = q * s, s a power of two per 128-block) are exact in f16, their products exact in fp32; each
// 128-block's MMA sum is scaled by (weight block scale * s) into an fp32 accumulator. So the result is the same
// function as the FMA kernels up to fp32 summation order (the tests bound the difference).
//
// Shape of the work: a warp-tile is 16 rows x a K-slice; the block's 16 warps take `wpt` K-slices of 16 / wpt row
// tiles per block step and their partials are added in slice order (deterministic). Weights stream through a per-lane
// cp.async ring (each lane reads back only what it copied): per 128-column step a lane copies row g and row g + 8's
// 16-byte chunks t and t + 4 (g = lane / 4, t = lane % 4), 64 bytes. MMA m (0..7) of the step takes, for the quad's
// thread t, the 4 weights at byte 4 (m % 4) of chunk t (m < 4) or chunk t + 4 (m >= 4): a permutation of the step's
// 128 columns, applied identically to the activation fragment (lanes 0..3 hold column n = 0; the others are zero).
// Included INSIDE kernels.cu's anonymous namespace, after gemv_ring.cuh (cp_async16, cp_async_commit/wait).
#pragma once

constexpr int kTcgThreads = 512;
constexpr int kTcgWarps = kTcgThreads / 32;
constexpr int kTcgS = 6;  // ring stages: 5 steps (5 x 64 B per lane, 160 KB per SM) in flight while one is used
// Ring bytes of S stages (S = kTcgS: 192 KB); the multi-token kernel takes 3 where n tokens' staged rows leave no room.
constexpr size_t tcg_ring_bytes(int S) { return static_cast<size_t>(S) * 4 * 16 * kTcgThreads; }
constexpr size_t kTcgRingBytes = tcg_ring_bytes(kTcgS);
// Tokens per launch of the multi-token kernel: the MMA's 8 columns (one token each; the single-token kernel uses
// column 0 only, so up to 8 tokens cost the same MMAs and weight bytes).
constexpr int kTcgMaxN = 8;
// The multi-token kernel's staged rows are K + kTcgRowPad halves apart: with a plain 2K-byte stride (a multiple of 128)
// the lanes of consecutive tokens read the same banks.
constexpr int kTcgRowPad = 8;

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// QA8 of x[0, K) (K % 128 == 0) as in stage_x: the E4M3 values q as f16 in xq and each 128-block's power-of-two
// scale s in xsc, so that q * s is exactly the QA8 value the other kernels use (natural column order).
// qa8_f16_block: one warp's 128-block b of that.
__device__ __forceinline__ void qa8_f16_block(const float* __restrict__ x, int64_t b, __half* xq, float* xsc) {
  const int lane = threadIdx.x & 31;
  {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x) + b * 32 + lane);
    const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    const float s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f), inv = 1.0f / s;
    auto q2 = [inv](float p, float r) {
      const __nv_fp8x2_storage_t e = __nv_cvt_float2_to_fp8x2(make_float2(fminf(fmaxf(p * inv, -448.0f), 448.0f),
                                                                            fminf(fmaxf(r * inv, -448.0f), 448.0f)),
                                                                __NV_SATFINITE, __NV_E4M3);
      return e4m3x2_to_f16x2(e);
    };
    const uint32_t lo = q2(v.x, v.y), hi = q2(v.z, v.w);
    *reinterpret_cast<uint2*>(xq + b * 128 + lane * 4) = make_uint2(lo, hi);
    if (lane == 0) xsc[b] = s;
  }
}
__device__ __forceinline__ void stage_x_qa8_f16(const float* __restrict__ x, int64_t K, __half* xq, float* xsc) {
  const int nw = blockDim.x >> 5;
  for (int64_t b = threadIdx.x >> 5; b < K / 128; b += nw) qa8_f16_block(x, b, xq, xsc);
}
// The same for nt rows of x at stride ldx: row j's codes at xq + j xs (xs >= K), its scales at xsc + j K / 128.
__device__ __forceinline__ void stage_x_qa8_f16_rows(const float* __restrict__ x, int64_t ldx, int nt, int64_t K, int64_t xs,
                                                     __half* xq, float* xsc) {
  const int nw = blockDim.x >> 5;
  const int64_t KB = K / 128;
  for (int64_t i = threadIdx.x >> 5; i < nt * KB; i += nw) {
    const int64_t j = i / KB, b = i - j * KB;
    qa8_f16_block(x + j * ldx, b, xq + j * xs, xsc + j * KB);
  }
}

// GX (grouped wo_a of batched decode): x is used as it is, not quantized -- official numerics has it in BF16 -- so each
// 128-block is staged as f16 after a power-of-two scale s that puts its largest magnitude in [2^14, 2^15): a BF16
// value (8 significant bits) is then exact in f16 down to 2^-31 of the block's largest, and a smaller one is off by
// at most 2^-40 of it (f16 subnormal rounding), far below fp32's own rounding of the sums. q * s = x otherwise.
__device__ __forceinline__ void exact_f16_block(const float* __restrict__ x, int64_t b, __half* xq, float* xsc) {
  const int lane = threadIdx.x & 31;
  const float4 v = __ldg(reinterpret_cast<const float4*>(x) + b * 32 + lane);
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  const float s = amax > 0.0f ? pow2_ceil(amax / 32768.0f) : 1.0f, inv = 1.0f / s;
  const __half2 lo = __floats2half2_rn(v.x * inv, v.y * inv), hi = __floats2half2_rn(v.z * inv, v.w * inv);
  *reinterpret_cast<uint2*>(xq + b * 128 + lane * 4) =
      make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  if (lane == 0) xsc[b] = s;
}
__device__ __forceinline__ void stage_x_exact_f16_rows(const float* __restrict__ x, int64_t ldx, int nt, int64_t K, int64_t xs,
                                                       __half* xq, float* xsc) {
  const int nw = blockDim.x >> 5;
  const int64_t KB = K / 128;
  for (int64_t i = threadIdx.x >> 5; i < nt * KB; i += nw) {
    const int64_t j = i / KB, b = i - j * KB;
    exact_f16_block(x + j * ldx, b, xq + j * xs, xsc + j * KB);
  }
}

// The decode kernel's pieces. tc_issue_step: one lane's copies of a 16-row tile's 128-column step (rg:
// row g's bytes at the step, row g + 8 at rg + 8 K), chunks t and t + 4 of both rows, into ring slot lslot.
__device__ __forceinline__ void tc_issue_step(uint4* ring, int lslot, int tid, const uint8_t* rg, int64_t K) {
  const uint8_t* rg8 = rg + 8 * K;
  uint4* dst = ring + static_cast<int64_t>(lslot) * 4 * kTcgThreads + tid;
  cp_async16(dst, rg);
  cp_async16(dst + kTcgThreads, rg + 64);
  cp_async16(dst + 2 * kTcgThreads, rg8);
  cp_async16(dst + 3 * kTcgThreads, rg8 + 64);
}
// A warp's walk: its tiles are tile_of(0), tile_of(1), ... (block step `it` of the `nblk` blocks that
// share the tiles, this block `blk`), each over its K slice [kb0, kb0 + nkb) of 128-column blocks; issue() copies the
// next step (load cursor it / k / slot), prologue() the first kS - 1 steps.
template <int S = kTcgS>
struct TcWalk {
  const uint8_t* wbase;  // row 0 of the walked rows
  int64_t K, ntiles, steps;
  int kb0, nkb, tpb, ts, nblk, blk;
  int64_t lit = 0;
  int lk = 0, lslot = 0;
  __device__ __forceinline__ int64_t tile_of(int64_t it) const { return (it * nblk + blk) * tpb + ts; }
  __device__ __forceinline__ void issue(uint4* ring, int tid, int g, int t) {
    const int64_t tile = tile_of(lit);
    if (tile < ntiles) tc_issue_step(ring, lslot, tid, wbase + (tile * 16 + g) * K + static_cast<int64_t>(kb0 + lk) * 128 + 16 * t, K);
    lslot = lslot + 1 == S ? 0 : lslot + 1;
    if (++lk == nkb) lk = 0, ++lit;
  }
  __device__ __forceinline__ void prologue(uint4* ring, int tid, int g, int t) {
#pragma unroll
    for (int p = 0; p < S - 1; ++p) {
      if (p < steps) issue(ring, tid, g, t);
      cp_async_commit();
    }
  }
};
// Step st of a walk of `steps`: the copies S - 1 steps ahead issued, then this step's copies waited for.
template <int S>
__device__ __forceinline__ void tc_ring_advance(TcWalk<S>& w, uint4* ring, int64_t st, int tid, int g, int t) {
  if (st + S - 1 < w.steps) w.issue(ring, tid, g, t);
  cp_async_commit();
  cp_async_wait<S - 1>();
}
// The lane's 4 words of ring slot `slot` (rows g and g + 8, chunks t and t + 4, see tc_issue_step).
__device__ __forceinline__ void tc_slot_words(const uint4* ring, int slot, int tid, uint4& q0, uint4& q1, uint4& q2, uint4& q3) {
  const uint4* src = ring + static_cast<int64_t>(slot) * 4 * kTcgThreads + tid;
  q0 = src[0], q1 = src[kTcgThreads], q2 = src[2 * kTcgThreads], q3 = src[3 * kTcgThreads];
}
// The walk of warp `warp` with wpt K slices per tile (16 / wpt tiles per block step).
template <int S = kTcgS>
__device__ __forceinline__ TcWalk<S> tc_walk(const uint8_t* wbase, int64_t K, int64_t ntiles, int wpt, int warp, int nblk, int blk) {
  TcWalk<S> w;
  const int64_t KB = K / 128;
  const int ksl = warp % wpt;
  w.wbase = wbase, w.K = K, w.ntiles = ntiles;
  w.tpb = kTcgWarps / wpt, w.ts = warp / wpt, w.nblk = nblk, w.blk = blk;
  w.kb0 = static_cast<int>(ksl * KB / wpt), w.nkb = static_cast<int>((ksl + 1) * KB / wpt) - w.kb0;
  const int64_t per_step = static_cast<int64_t>(nblk) * w.tpb;
  // Ring steps: tile steps x this slice's 128-column blocks (slices may differ by one block); the tile steps, and so
  // the flushes (block barriers), are the same for every warp of the block.
  w.steps = (ntiles + per_step - 1) / per_step * w.nkb;
  return w;
}
// The step's 8 MMAs over the lane's ring words q0..q3 and the f16 activation of 128-block kb (xq, natural order):
// c[0] / c[2] of lanes t == 0 = rows g / g + 8 (column 0).
// MULTI (the multi-token kernel): column n = g of B is token g's activation (xq + g xs) for g < nt, zero above: c[0] /
// c[1] of lane (g, t) = row g, tokens 2t / 2t + 1, c[2] / c[3] the same for row g + 8. Single token (!MULTI): lanes
// g == 0 hold the token in column 0, the other columns are zero.
template <bool MULTI = false>
__device__ __forceinline__ void tc_step_mma(const uint4& q0, const uint4& q1, const uint4& q2, const uint4& q3,
                                            const __half* xq, int kb, int g, int t, float (&c)[4], int64_t xs = 0, int nt = 1) {
  const uint32_t wg[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
  const uint32_t wg8[8] = {q2.x, q2.y, q2.z, q2.w, q3.x, q3.y, q3.z, q3.w};
  // Activation fragments: lane t < 4 holds x at columns 16 t .. 16 t + 15 and 64 + 16 t .. of this step.
  uint4 xa = make_uint4(0u, 0u, 0u, 0u), xb = xa, xc = xa, xd = xa;
  if (MULTI ? g < nt : g == 0) {
    if constexpr (MULTI) xq += g * xs;
    const uint4* xp = reinterpret_cast<const uint4*>(xq + static_cast<int64_t>(kb) * 128 + 16 * t);
    xa = xp[0], xb = xp[1];
    const uint4* xp2 = reinterpret_cast<const uint4*>(xq + static_cast<int64_t>(kb) * 128 + 64 + 16 * t);
    xc = xp2[0], xd = xp2[1];
  }
  const uint32_t xb2[16] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w, xc.x, xc.y, xc.z, xc.w, xd.x, xd.y, xd.z, xd.w};
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    const uint32_t a4[4] = {e4m3x2_to_f16x2(wg[m]), e4m3x2_to_f16x2(wg8[m]), e4m3x2_to_f16x2(wg[m] >> 16),
                            e4m3x2_to_f16x2(wg8[m] >> 16)};
    mma_f16_16816(c, a4, xb2[2 * m], xb2[2 * m + 1]);
  }
}
// End of a block step: the warps' K-slice partials (acc0 / acc8, then zeroed) summed in slice order into
// y[tile * 16 + r] for the block's tpb tiles first_tile.. (< ntiles), [round] BF16. Every thread of the block calls.
__device__ __forceinline__ void tc_flush_step(float* red, float& acc0, float& acc8, int wpt, int tpb, int64_t first_tile,
                                              int64_t ntiles, float* y, bool round) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  if (t == 0) red[warp * 16 + g] = acc0, red[warp * 16 + g + 8] = acc8;
  acc0 = acc8 = 0.0f;
  __syncthreads();
  if (tid < tpb * 16) {
    const int ts2 = tid / 16, r = tid % 16;
    const int64_t tile2 = first_tile + ts2;
    if (tile2 < ntiles) {
      float v = 0.0f;
      for (int k = 0; k < wpt; ++k) v += red[(ts2 * wpt + k) * 16 + r];
      y[tile2 * 16 + r] = round ? bf16r(v) : v;
    }
  }
  __syncthreads();
}

// y[r] = sum_k W[r, k] * QA8(x)[k] for r < out (out % 16 == 0, K % 128 == 0), [round_bf16] BF16 output.
// grid: blocks taking block steps of (16 / wpt) row tiles; wpt K-slices per tile.
__global__ void __launch_bounds__(kTcgThreads, 1) gemv_tc_fp8_kernel(WRow W, int64_t out, LinearArgs a, int wpt) {
  // pdl_wait() comes after the weight prologue (as in ring_walk): the first steps' copies overlap the previous kernel.
  extern __shared__ float4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  const int64_t K = W.in, KB = K / 128, ntiles = out / 16;
  uint4* ring = reinterpret_cast<uint4*>(smem);  // [S][4][threads]
  __half* xq = reinterpret_cast<__half*>(smem + kTcgRingBytes);
  float* xsc = reinterpret_cast<float*>(xq + K);
  float* red = xsc + KB;  // [warps][16]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // (DSV4_PHASE_STAMPS builds) 0 entry, 1 prologue issued, 2 past the wait, 3 x staged, 4 done; tag: the rows
  PHASE_DECL;
  BLOCK_STAMPS_DECL;
  PHASE_MARK(0);
  TcWalk w = tc_walk(static_cast<const uint8_t*>(W.w), K, ntiles, wpt, warp, gridDim.x, blockIdx.x);
  w.prologue(ring, tid, g, t);
  PHASE_MARK(1);
  pdl_wait();
  PHASE_MARK(2);
  BLOCK_STAMPS_WAITED;
  stage_x_qa8_f16(a.x, K, xq, xsc);
  __syncthreads();
  PHASE_MARK(3);
  int64_t cit = 0;
  int ck = 0, cslot = 0;
  float acc0 = 0.0f, acc8 = 0.0f;  // rows g and g + 8 (column 0: lanes with t == 0)
  for (int64_t s = 0; s < w.steps; ++s) {
    tc_ring_advance(w, ring, s, tid, g, t);
    const int64_t tile = w.tile_of(cit);
    if (tile < ntiles) {
      const int kb = w.kb0 + ck;
      uint4 q0, q1, q2, q3;
      tc_slot_words(ring, cslot, tid, q0, q1, q2, q3);
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tc_step_mma(q0, q1, q2, q3, xq, kb, g, t, c);
      const float sc = fp8_scale(W.sc, (tile * 16 >> 7) * W.sb + kb) * xsc[kb];
      acc0 = fmaf(c[0], sc, acc0);
      acc8 = fmaf(c[2], sc, acc8);
    }
    cslot = cslot + 1 == kTcgS ? 0 : cslot + 1;
    if (++ck == w.nkb) {
      // End of this block step: K-slice partials to shared memory, then summed in slice order.
      tc_flush_step(red, acc0, acc8, wpt, w.tpb, w.tile_of(cit) - w.ts, ntiles, a.y, a.round_bf16);
      ck = 0;
      ++cit;
    }
  }
  cp_async_wait<0>();
  PHASE_MARK(4);
  PHASE_RECORD("gemv_tc", out);
  BLOCK_STAMPS_END("gemv_tc");
}

// The multi-token version (batched decode: 2 <= a.n <= kTcgMaxN tokens, rows of x at a.ldx, of y at a.ldy): the same
// walk, weight copies and MMAs with token j in column j of B, so the weights stream once for all n tokens. Column j's
// arithmetic is the single-token kernel's for token j alone -- the same weight fragments against token j's activation
// (the single-token kernel has it in column 0; the tensor core's columns are independent dot products), the same scale
// product (weight scale x token j's QA8 scale) and FMA order, the K-slice partials summed in the same order -- so each
// token's outputs are the single-token kernel's bits (the op test compares them, unrounded). S: ring stages (6 down to
// 3, the most that fit beside n staged rows).
// GX: the grouped form (a.group_rows output rows per group, group g reading x at + g a.group_x_off; W.in columns)
// with x staged exactly (exact_f16_block) instead of QA8: batched decode's wo_a, whose BF16 input official numerics
// multiplies unquantized. A block step's tiles lie in one group (the launcher checks); the block restages x where
// the next block step enters another group.
template <int S, bool GX = false>
__global__ void __launch_bounds__(kTcgThreads, 1) gemv_tc_fp8_n_kernel(WRow W, int64_t out, LinearArgs a, int wpt) {
  extern __shared__ float4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  const int64_t K = W.in, KB = K / 128, ntiles = out / 16;
  const int nt = a.n;
  uint4* ring = reinterpret_cast<uint4*>(smem);  // [S][4][threads]
  const int64_t xs = K + kTcgRowPad;                                 // staged row stride (halves)
  __half* xq = reinterpret_cast<__half*>(smem + tcg_ring_bytes(S));  // [nt][xs]
  float* xsc = reinterpret_cast<float*>(xq + nt * xs);               // [nt][KB]
  float* red = xsc + nt * KB;                                        // [warps][16 rows][kTcgMaxN tokens]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  TcWalk<S> w = tc_walk<S>(static_cast<const uint8_t*>(W.w), K, ntiles, wpt, warp, gridDim.x, blockIdx.x);
  w.prologue(ring, tid, g, t);
  pdl_wait();
  int64_t staged = -1;  // GX: the group whose x slice is staged
  auto stage_group = [&](int64_t first_tile) {
    const int64_t grp = first_tile * 16 / a.group_rows;
    if (grp == staged) return false;
    stage_x_exact_f16_rows(a.x + grp * a.group_x_off, a.ldx, nt, K, xs, xq, xsc);
    staged = grp;
    return true;
  };
  if constexpr (GX) stage_group(min(w.tile_of(0) - w.ts, ntiles - 1));
  else stage_x_qa8_f16_rows(a.x, a.ldx, nt, K, xs, xq, xsc);
  __syncthreads();
  int64_t cit = 0;
  int ck = 0, cslot = 0;
  const int j0 = 2 * t, j1 = 2 * t + 1;  // this lane's tokens (columns of D)
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // row g: tokens j0, j1; row g + 8: tokens j0, j1
  for (int64_t st = 0; st < w.steps; ++st) {
    tc_ring_advance(w, ring, st, tid, g, t);
    const int64_t tile = w.tile_of(cit);
    if (tile < ntiles) {
      const int kb = w.kb0 + ck;
      uint4 q0, q1, q2, q3;
      tc_slot_words(ring, cslot, tid, q0, q1, q2, q3);
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tc_step_mma<true>(q0, q1, q2, q3, xq, kb, g, t, c, xs, nt);
      const float ws = fp8_scale(W.sc, (tile * 16 >> 7) * W.sb + kb);
      const float s0 = j0 < nt ? ws * xsc[j0 * KB + kb] : 0.0f, s1 = j1 < nt ? ws * xsc[j1 * KB + kb] : 0.0f;
      acc[0] = fmaf(c[0], s0, acc[0]);
      acc[1] = fmaf(c[1], s1, acc[1]);
      acc[2] = fmaf(c[2], s0, acc[2]);
      acc[3] = fmaf(c[3], s1, acc[3]);
    }
    cslot = cslot + 1 == S ? 0 : cslot + 1;
    if (++ck == w.nkb) {
      // End of this block step: every lane's 4 partials to shared memory, then each (tile, row, token) output summed
      // over the K slices in slice order, as tc_flush_step does for one token.
      float* mine = red + (warp * 16 + g) * kTcgMaxN;
      mine[j0] = acc[0], mine[j1] = acc[1], mine[8 * kTcgMaxN + j0] = acc[2], mine[8 * kTcgMaxN + j1] = acc[3];
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
      __syncthreads();
      const int64_t first_tile = w.tile_of(cit) - w.ts;
      for (int i = tid; i < w.tpb * 16 * nt; i += kTcgThreads) {
        const int ts2 = i / (16 * nt), r = (i / nt) % 16, j = i % nt;
        const int64_t tile2 = first_tile + ts2;
        if (tile2 < ntiles) {
          float v = 0.0f;
          for (int k = 0; k < wpt; ++k) v += red[((ts2 * wpt + k) * 16 + r) * kTcgMaxN + j];
          a.y[j * a.ldy + tile2 * 16 + r] = a.round_bf16 ? bf16r(v) : v;
        }
      }
      __syncthreads();
      ck = 0;
      ++cit;
      if constexpr (GX) {  // the same decision in every warp (block-level values): the barrier is collective
        const int64_t next = w.tile_of(cit) - w.ts;
        if (next < ntiles && stage_group(next)) __syncthreads();
      }
    }
  }
  cp_async_wait<0>();
}
