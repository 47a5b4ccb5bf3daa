// Routed experts for prefill-sized batches, grouped by expert (included INSIDE kernels.cu's anonymous namespace; uses
// its WRow/load8/init_lut/swiglu1 helpers).
//
// Why: the per-slot expert kernels read the selected expert's weights once per (token, expert) pair, so a 2048-token
// prefill chunk streamed ~12,000 expert matrices per layer (~150 GB). Here the (token, slot) pairs are first grouped
// by expert on the device (counting sort: no host synchronisation), then one block per (row tile, expert) keeps its
// weight tile in shared memory and applies it to all of that expert's tokens: each expert weight is read about once
// per chunk. The arithmetic is fp32 like the per-slot kernels (dequantized weight x activation, summed per row), with
// the same epilogues (BF16 points, SwiGLU clamp, routing weight).

constexpr int kGrpRows = 32;   // weight rows per block (of w1 and of w3 for gate/up)
constexpr int kGrpSlots = 32;  // (token, slot) pairs per tile
constexpr int kGrpK = 64;      // K per shared-memory tile
constexpr int kGrpPad = 4;     // row padding of the tiles (floats)

// One block: counts per expert, exclusive offsets [E + 1], then perm[offsets[e] ..] = the slots routed to e.
__global__ void moe_group_kernel(const int32_t* sel, int nk, int E, int32_t* offsets, int32_t* perm) {
  pdl_wait();
  extern __shared__ int32_t cnt[];  // [E] counts, then [E] cursors
  int32_t* cur = cnt + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < nk; i += blockDim.x) {
    const int e = sel[i];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = run;
      cur[e] = run;
      run += cnt[e];
    }
    offsets[E] = run;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nk; i += blockDim.x) {
    const int e = sel[i];
    if (e >= 0 && e < E) perm[atomicAdd(&cur[e], 1)] = i;
  }
}

// acc[r][s] (+)= W_tile[rows of this thread] . X_tile[slots of this thread] over one K tile. 128 threads: ty = t / 8
// owns rows 2ty, 2ty+1 of the tile, tx = t % 8 owns slots tx, tx + 8, tx + 16, tx + 24.
template <int NM>
__device__ __forceinline__ void grp_fma(const float (*Ws)[kGrpRows][kGrpK + kGrpPad], const float (*Xs)[kGrpK + kGrpPad],
                                        float (&acc)[NM][2][4]) {
  const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
#pragma unroll 4
  for (int k = 0; k < kGrpK; k += 4) {
    float4 xv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) xv[j] = *reinterpret_cast<const float4*>(&Xs[tx + 8 * j][k]);
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float4 w = *reinterpret_cast<const float4*>(&Ws[m][2 * ty + i][k]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float a = acc[m][i][j];
          a = fmaf(w.x, xv[j].x, a);
          a = fmaf(w.y, xv[j].y, a);
          a = fmaf(w.z, xv[j].z, a);
          a = fmaf(w.w, xv[j].w, a);
          acc[m][i][j] = a;
        }
      }
  }
}

// Stages NM weight tiles (rows r0.., k0..k0+kGrpK) dequantized, and the activation rows of slots perm[s0..s0+32).
template <int F, int NM>
__device__ __forceinline__ void grp_stage(const WRow* W, int64_t rows, int64_t r0, int64_t k0, int64_t K, const float* lut,
                                          float (*Ws)[kGrpRows][kGrpK + kGrpPad], const float* xbase, int64_t ldx,
                                          int x_div, const int32_t* slots, int ns, float (*Xs)[kGrpK + kGrpPad]) {
  constexpr int per_row = kGrpK / 8;
  for (int i = threadIdx.x; i < NM * kGrpRows * per_row; i += blockDim.x) {
    const int m = i / (kGrpRows * per_row), rr = (i / per_row) % kGrpRows, c = i % per_row;
    float v[8];
    const int64_t r = r0 + rr;
    if (r < rows && k0 + 8 * c < K) load8<F>(W[m], r, k0 + 8 * c, v, lut);
    else
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) Ws[m][rr][8 * c + e] = v[e];
  }
  for (int i = threadIdx.x; i < kGrpSlots * (kGrpK / 4); i += blockDim.x) {
    const int s = i / (kGrpK / 4), c = i % (kGrpK / 4);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (s < ns && k0 + 4 * c < K) v = *reinterpret_cast<const float4*>(xbase + static_cast<int64_t>(slots[s] / x_div) * ldx + k0 + 4 * c);
    *reinterpret_cast<float4*>(&Xs[s][4 * c]) = v;
  }
}

// GATE_UP: grid (ceil(I / 32), E); act[slot, r] = SwiGLU(w1 x, w3 x) * wts[slot] for every slot routed to the expert.
// down: grid (ceil(d / 32), E); y[slot, r] = w2[r, :] . act_q[slot, :].
template <int F, bool GATE_UP>
__global__ void __launch_bounds__(128) expert_grouped(ExpertArgs a, int blk) {
  constexpr int NM = GATE_UP ? 2 : 1;  // weight matrices per row tile: w1 and w3, or w2
  pdl_wait();
  __shared__ float lut[16];
  __shared__ __align__(16) float Ws[NM][kGrpRows][kGrpK + kGrpPad];
  __shared__ __align__(16) float Xs[kGrpSlots][kGrpK + kGrpPad];
  init_lut(lut);
  const int e = blockIdx.y;
  const int32_t beg = a.offsets[e], end = a.offsets[e + 1];
  if (beg == end) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGrpRows;
  const DevExpert E = a.table[e];
  const int64_t K = GATE_UP ? a.d : a.I, R = GATE_UP ? a.I : a.d;
  WRow W[NM];
  if constexpr (GATE_UP) W[0] = WRow{E.w1, E.s1, E.g1, a.d, a.sb1, blk}, W[1] = WRow{E.w3, E.s3, E.g3, a.d, a.sb1, blk};
  else W[0] = WRow{E.w2, E.s2, E.g2, a.I, a.sb2, blk};
  const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
  for (int32_t s0 = beg; s0 < end; s0 += kGrpSlots) {
    const int ns = min(kGrpSlots, end - s0);
    float acc[NM][2][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += kGrpK) {
      // gate/up reads the token's row (slot / k), down the slot's act_q row
      grp_stage<F, NM>(W, R, r0, k0, K, lut, Ws, GATE_UP ? a.x : a.act_q, K, GATE_UP ? a.k : 1, a.perm + s0, ns, Xs);
      __syncthreads();
      grp_fma<NM>(Ws, Xs, acc);
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t r = r0 + 2 * ty + i;
        const int s = tx + 8 * j;
        if (r >= R || s >= ns) continue;
        const int slot = a.perm[s0 + s];
        if constexpr (GATE_UP) {
          float g = acc[0][i][j], u = acc[NM - 1][i][j];
          if (a.official) g = bf16r(g), u = bf16r(u);
          a.act[static_cast<int64_t>(slot) * a.I + r] = swiglu1(g, u, a.limit, a.wts ? a.wts[slot] : 1.0f, a.official);
        } else {
          const float y = acc[0][i][j];
          a.y[static_cast<int64_t>(slot) * a.d + r] = a.official ? bf16r(y) : y;
        }
      }
  }
}

// ---- Tensor-core version (official numerics): the same grouping, BF16 mma.sync with fp32 accumulation ----------
// Exact like the fp32 kernels above when every operand is a BF16 value: QA8 activations (x, act_q) and MXFP4 / FP8
// with power-of-two scales / BF16 weights (ExpertArgs::x_bf16_exact + expert_tc_ok). Products of two BF16 values are
// exact in fp32 and the accumulation is fp32, so the result differs from the fp32 kernels only in summation order.
//
// Block: 128 threads = 4 warps as 2 (row halves) x 2 (slot halves); tile 64 weight rows x 64 slots x 64 K, staged in
// shared memory as BF16 pairs. Gate/up stages 32 rows of w1 and the same 32 rows of w3, and each warp's two 16-row
// m-tiles are w1 and w3 of the same intermediate rows, so g and u of one output meet in one thread's registers.
constexpr int kTcRows = 64;
constexpr int kTcSlots = 64;
constexpr int kTcK = 64;
constexpr int kTcLd = kTcK / 2 + 4;  // row stride in 32-bit words: fragment loads hit 32 different banks

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Epilogue of the grouped tensor-core kernels (expert_tc_grouped, expert_tc2): the warp's accumulators acc[mt][j]
// (two 16-row MMA tiles x four 8-slot tiles; c[2h + q] = row g + 8h, column 2t + q) stored for the slots col0 + 8j +
// 2t + q < ns of tile s0. row_of(mt, h) is the absolute weight row of tile mt's row g + 8h; gate/up: tile 0 holds w1
// (g) and tile 1 w3 (u) of the same rows.
template <bool GATE_UP, typename RowOf>
__device__ __forceinline__ void tc_grouped_store(const ExpertArgs& a, const float (&acc)[2][4][4], int32_t s0, int ns,
                                                 int col0, int t, int64_t R, RowOf row_of) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int sl = col0 + j * 8 + 2 * t + q;
        if (sl >= ns) continue;
        const int slot = a.perm[s0 + sl];
        if (GATE_UP) {
          const int64_t r = row_of(0, h);
          if (r >= R) continue;
          float g = acc[0][j][2 * h + q], u = acc[1][j][2 * h + q];
          if (a.official) g = bf16r(g), u = bf16r(u);
          a.act[static_cast<int64_t>(slot) * a.I + r] = swiglu1(g, u, a.limit, a.wts ? a.wts[slot] : 1.0f, a.official);
        } else {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const int64_t r = row_of(m, h);
            if (r >= R) continue;
            const float y = acc[m][j][2 * h + q];
            a.y[static_cast<int64_t>(slot) * a.d + r] = a.official ? bf16r(y) : y;
          }
        }
      }
}

// GATE_UP: grid (ceil(I / 32), E), act[slot, r] = SwiGLU(w1 x, w3 x) * wts[slot];
// down: grid (ceil(d / 64), E), y[slot, r] = w2[r, :] . act_q[slot, :].
template <int F, bool GATE_UP>
__global__ void __launch_bounds__(128) expert_tc_grouped(ExpertArgs a, int blk) {
  pdl_wait();
  __shared__ float lut[16];
  __shared__ __align__(16) uint32_t Ws[kTcRows][kTcLd];
  __shared__ __align__(16) uint32_t Xs[kTcSlots][kTcLd];
  init_lut(lut);
  const int e = blockIdx.y;
  const int32_t beg = a.offsets[e], end = a.offsets[e + 1];
  if (beg == end) return;
  const DevExpert E = a.table[e];
  const int64_t K = GATE_UP ? a.d : a.I, R = GATE_UP ? a.I : a.d;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (GATE_UP ? kTcRows / 2 : kTcRows);
  const WRow W0 = GATE_UP ? WRow{E.w1, E.s1, E.g1, a.d, a.sb1, blk} : WRow{E.w2, E.s2, E.g2, a.I, a.sb2, blk};
  const WRow W1 = GATE_UP ? WRow{E.w3, E.s3, E.g3, a.d, a.sb1, blk} : W0;
  const float* xb = GATE_UP ? a.x : a.act_q;
  const int x_div = GATE_UP ? a.k : 1;  // gate/up reads the token's row (slot / k), down the slot's act row
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int wr = warp >> 1, wc = warp & 1;
  const int m0 = GATE_UP ? wr * 16 : wr * 32, m1 = GATE_UP ? kTcRows / 2 + wr * 16 : wr * 32 + 16;
  for (int32_t s0 = beg; s0 < end; s0 += kTcSlots) {
    const int ns = min(kTcSlots, end - s0);
    float acc[2][4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += kTcK) {
      for (int i = threadIdx.x; i < kTcRows * (kTcK / 8); i += blockDim.x) {
        const int rr = i / (kTcK / 8), c = i % (kTcK / 8);
        const bool second = GATE_UP && rr >= kTcRows / 2;
        const int64_t r = r0 + (GATE_UP ? rr % (kTcRows / 2) : rr);
        float v[8];
        if (r < R && k0 + 8 * c < K) load8<F>(second ? W1 : W0, r, k0 + 8 * c, v, lut);
        else
#pragma unroll
          for (int q = 0; q < 8; ++q) v[q] = 0.0f;
        *reinterpret_cast<uint4*>(&Ws[rr][4 * c]) =
            make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
      }
      for (int i = threadIdx.x; i < kTcSlots * (kTcK / 4); i += blockDim.x) {
        const int sl = i / (kTcK / 4), c = i % (kTcK / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (sl < ns && k0 + 4 * c < K)
          v = *reinterpret_cast<const float4*>(xb + static_cast<int64_t>(a.perm[s0 + sl] / x_div) * K + k0 + 4 * c);
        *reinterpret_cast<uint2*>(&Xs[sl][2 * c]) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTcK / 2; kk += 8) {  // 16 K per step = 8 words
        uint32_t af[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const int b = m ? m1 : m0;
          af[m][0] = Ws[b + gid][kk + tig];
          af[m][1] = Ws[b + gid + 8][kk + tig];
          af[m][2] = Ws[b + gid][kk + 4 + tig];
          af[m][3] = Ws[b + gid + 8][kk + 4 + tig];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int n0 = wc * 32 + j * 8 + gid;
          const uint32_t b0 = Xs[n0][kk + tig], b1 = Xs[n0][kk + 4 + tig];
          mma_bf16_16816(acc[0][j], af[0], b0, b1);
          mma_bf16_16816(acc[1][j], af[1], b0, b1);
        }
      }
      __syncthreads();
    }
    tc_grouped_store<GATE_UP>(a, acc, s0, ns, wc * 32, tig, R, [&](int m, int h) {
      return GATE_UP ? r0 + wr * 16 + gid + 8 * h : r0 + (m ? m1 : m0) + gid + 8 * h;
    });
  }
}
