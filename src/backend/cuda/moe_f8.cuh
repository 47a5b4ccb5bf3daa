// Prefill routed MXFP4 experts on FP8 tensor-core MMAs (W4A8): the grouped prefill kernel of official numerics where
// K is whole 128-column blocks, in place of expert_tc2 (moe_tc2.cuh); DSV4_MOE_F8=0 / set_moe_f8(false): expert_tc2.
//
// Why: expert_tc2 turns every FP4 byte into a BF16 pair through a 256-entry shared-memory table (random-index loads:
// bank conflicts) plus a BF16 multiply by the block scale, and feeds m16n8k16 BF16 MMAs: the 8K prefill's MoE ran at
// ~80 TFLOP/s, 47 % of a 20-layer prefill (docs/BENCHMARKS.md). The decode MMA walk (expert_mma.cuh) showed the
// cheaper route: an E2M1 nibble becomes an E4M3 byte (value x 2^-6) with two shifts and masks per 4 weights, the QA8
// activation codes are E4M3 already, and one m16n8k32 E4M3 MMA takes twice the K of a BF16 MMA. (On sm_90a ptxas
// lowers that MMA to F2FP unpacks + two f16 HMMAs -- FP8 is native in wgmma only -- so this kernel issues ~25
// instructions per MMA (ncu: 51 % issue slots busy, 2.07 IPC): measured 3.51 ms for a 2048-token Flash gate/up,
// ~150 TFLOP/s with the 64-slot tile padding; expert_tc2 4.6 ms. A wgmma kernel is the next step.)
//
// Arithmetic (the decode MMA walk's, per slot): each MMA covers exactly one 32-column block (one E8M0 weight scale per
// row) inside one 128-column QA8 block (one power-of-two activation scale per slot); its 32 products are exact, its
// fp32 result d is scaled by the row's weight scale into a per-128-block partial (fp32 FMA, K order), and that partial
// times the slot's activation scale x 2^6 is added to the accumulator at the end of each 128-column block. The same
// fp32 function as expert_tc2 up to summation order (the op test bounds the difference).
//
// Operands as staged:
// - x codes: moe_gather_e4m3_kernel writes each grouped slot's row of QA8 codes (E4M3 bytes) and its per-128 scales
//   into the xg scratch: codes [slots][K] then scales [slots][K / 128] (fp32); inside every 32-column block the even
//   columns first, then the odd ones (byte p < 16: column 2p; byte 16 + p: column 2p + 1), so that word t of the first
//   (second) 16 bytes is the B fragment b0 (b1) of lane (g, t): the activations of the weights 8t, 8t+2, 8t+4, 8t+6
//   (8t+1, ...) whose E2M1 nibbles the lo (hi) conversion of FP4 word t takes.
// - weights: raw FP4 rows, 64 bytes (128 columns) per row and stage, and each row's four E8M0 bytes of the stage.
// Block: 256 threads = 8 warps = 4 (rows) x 2 (slots), tile 128 weight rows x 64 slots (expert_tc2's geometry and
// epilogue, tc_grouped_store: gate/up rows 0..63 are w1 rows r0.., 64..127 the same rows of w3), 4-stage cp.async
// pipeline of 128-column stages.
// Included INSIDE kernels.cu's anonymous namespace after expert_mma.cuh (ldmatrix_x4, e2m1_*_e4m3), gemv_ring.cuh
// (cp_async*) and moe_grouped.cuh (tc_grouped_store).
#pragma once

constexpr int kF8Rows = 128, kF8Slots = 64, kF8K = 128, kF8Threads = 256, kF8MaxExperts = 1024;
constexpr int kF8ABytes = kF8Rows * kF8K / 2;  // 8 KB of FP4 weights per stage
constexpr int kF8BBytes = kF8Slots * kF8K;     // 8 KB of E4M3 codes per stage
constexpr int kF8StageBytes = kF8ABytes + kF8BBytes + kF8Rows * 4 + kF8Slots * 4;  // + weight / activation scales

// The xg scratch as this kernel uses it: codes of slot p at xg + p * K, the scales after all nk rows of codes, then
// (16-byte aligned) the work list of (expert, 64-slot tile) pairs, kF8MaxTiles entries and their count.
__host__ __device__ inline int64_t f8_max_tiles(int64_t nk, int E) { return (nk + kF8Slots - 1) / kF8Slots + E; }
__host__ __device__ inline int64_t f8_tiles_offset(int64_t nk, int64_t K) { return (nk * K + nk * (K / 128) * 4 + 15) / 16 * 16; }
__host__ __device__ inline int64_t f8_scratch_bytes(int64_t nk, int64_t K, int E) {
  return f8_tiles_offset(nk, K) + 4 * (f8_max_tiles(nk, E) + 1);
}
__device__ __forceinline__ float* f8_xscales(uint8_t* xg, int64_t nk, int64_t K) { return reinterpret_cast<float*>(xg + nk * K); }

// Why a work list: a block per (row tile, expert) that loops over the expert's slot tiles serialises a busy expert
// on its 16-32 blocks (a skewed routing, e.g. hot experts, leaves the rest of the GPU idle); one block per (row tile,
// expert, slot tile) spreads every tile over the grid. One block of E threads (E <= 1024): tiles[i] = e << 16 | j
// for the j-th kSlots-slot tile of expert e, in expert order; tiles[max] = their count. (kSlots 128: expert_wg's wide
// variant; max, sized for 64-slot tiles, bounds it.)
// kFirst (moe_wb.cuh's bulk-copy variant): also first[e] = the index of expert e's first entry.
template <int kSlots, bool kFirst>
__device__ __forceinline__ void f8_tiles(const int32_t* offsets, int E, int64_t max, int32_t* tiles, int32_t* first) {
  pdl_wait();
  __shared__ int32_t start[1025];
  const int e = threadIdx.x;
  const int nt = e < E ? (offsets[e + 1] - offsets[e] + kSlots - 1) / kSlots : 0;
  if (e < E) start[e + 1] = nt;
  __syncthreads();
  if (e == 0) {
    start[0] = 0;
    for (int i = 1; i <= E; ++i) start[i] += start[i - 1];
    tiles[max] = start[E];
  }
  __syncthreads();
  if constexpr (kFirst) {
    if (e < E) first[e] = start[e];
  }
  for (int j = 0; j < nt; ++j) tiles[start[e] + j] = (e << 16) | j;
}
template <int kSlots = kF8Slots>
__global__ void moe_f8_tiles_kernel(const int32_t* offsets, int E, int64_t max, int32_t* tiles) {
  f8_tiles<kSlots, false>(offsets, E, max, tiles, nullptr);
}

// The gathers' common part: warp (slot p, 128-column block b) of grid (nk, ceil(K / 128 / 8)) x 256 threads loads
// its lane's 4 columns 4 lane .. + 3 of the slot's row (perm[p] / div) and returns the block's QA8 scale s (as
// stage_x_e4m3 computes it) with q[i] = the columns / s clamped to +-448: E4M3 values, since the row is QA8 already
// (q * s is exactly its value), so their E4M3 or f16 conversion is exact. False: no such block or slot.
__device__ __forceinline__ bool gather_qa8_block(const float* src, int64_t K, const int32_t* perm, const int32_t* end,
                                                 int div, int64_t& p, int64_t& b, float (&q)[4], float& s) {
  p = blockIdx.x, b = static_cast<int64_t>(blockIdx.y) * 8 + (threadIdx.x >> 5);
  if (b >= K / 128 || p >= *end) return false;
  const int lane = threadIdx.x & 31;
  const float4 v = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(perm[p] / div) * K + b * 128 + 4 * lane);
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
  const float inv = 1.0f / s;
  const float c[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) q[i] = fminf(fmaxf(c[i] * inv, -448.0f), 448.0f);
  return true;
}

// E4M3 codes of the grouped slots' rows in expert_f8's order (see above) and their scales.
__global__ void moe_gather_e4m3_kernel(const float* src, int64_t K, const int32_t* perm, const int32_t* end, int div,
                                       int64_t nk, uint8_t* xg) {
  pdl_wait();
  int64_t p, b;
  float q[4], s;
  if (!gather_qa8_block(src, K, perm, end, div, p, b, q, s)) return;
  const int lane = threadIdx.x & 31;
  const __nv_fp8x2_storage_t e01 = __nv_cvt_float2_to_fp8x2(make_float2(q[0], q[1]), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t e23 = __nv_cvt_float2_to_fp8x2(make_float2(q[2], q[3]), __NV_SATFINITE, __NV_E4M3);
  // Columns 4 lane .. + 3 = 32-block lane / 8, local columns c0 = 4 (lane % 8) .. c0 + 3: evens c0, c0 + 2 -> bytes
  // c0 / 2, c0 / 2 + 1; odds c0 + 1, c0 + 3 -> bytes 16 + c0 / 2, + 1.
  uint8_t* blk = xg + p * K + b * 128 + (lane >> 3) * 32;
  const int h = 2 * (lane & 7);
  *reinterpret_cast<uint16_t*>(blk + h) = static_cast<uint16_t>((e01 & 0xFFu) | ((e23 & 0xFFu) << 8));
  *reinterpret_cast<uint16_t*>(blk + 16 + h) = static_cast<uint16_t>(((e01 >> 8) & 0xFFu) | (((e23 >> 8) & 0xFFu) << 8));
  if (lane == 0) f8_xscales(xg, nk, K)[p * (K / 128) + b] = s;
}

// Block (x, y)'s work-list entry y (moe_f8_tiles_kernel<kSlots>): expert e, its slots [s0, s0 + ns) of the grouped
// order. False: y is past the list's end (the grid is sized for the most tiles there can be).
template <int kSlots = kF8Slots>
__device__ __forceinline__ bool f8_tile(const int32_t* tiles, int64_t max, const int32_t* offsets, int& e, int32_t& s0, int& ns) {
  if (static_cast<int>(blockIdx.y) >= tiles[max]) return false;
  const int32_t tile = tiles[blockIdx.y];
  e = tile >> 16;
  s0 = offsets[e] + kSlots * (tile & 0xFFFF);
  ns = min(kSlots, offsets[e + 1] - s0);
  return true;
}

__device__ __forceinline__ void mma_e4m3_16832_z(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                 uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// The prefill expert kernels' weight stage: 64 bytes (128 FP4 columns) per tile row, 16-byte chunk c of row r at
// f8_wchunk(r, c) (XOR-swizzled so that the 8 rows one ldmatrix matrix reads fall in 8 different 16-byte bank groups).
__device__ __forceinline__ int f8_wchunk(int r, int c) { return r * 64 + 16 * (c ^ ((r >> 1) & 3)); }
// This thread's share of a stage's weights: chunks c0 and c0 + 1 of tile row `row` from the row's 64 bytes at w.
__device__ __forceinline__ void f8_copy_weights(uint8_t* st, int row, int c0, const uint8_t* w) {
#pragma unroll
  for (int i = 0; i < 2; ++i) cp_async16(st + f8_wchunk(row, c0 + i), w + 16 * (c0 + i));
}

// grid (ceil(R / (GATE_UP ? 64 : 128)), f8_max_tiles), kF8Threads, kF8Stages * kF8StageBytes of dynamic shared memory;
// block (x, y) takes row tile x of work-list entry y (moe_f8_tiles_kernel), if there is one.
// Stage layout: weights [128 rows][4 chunks of 16 B] (chunk c of row r at 16 (c ^ ((r >> 1) & 3)): the 8 rows one
// ldmatrix matrix reads fall in 8 different 16-byte bank groups), codes [64 slots][8 units of 16 B] (unit u of slot s
// at 16 (u ^ (s & 7))), then the rows' scale words (4 E8M0 bytes each), then the slots' activation scales.
// 243 registers (ptxas), so one block (8 warps) per SM: the two-blocks-per-SM variant in 128 registers (the decode
// walk's per-MMA scale product instead of the per-128-block partials below; spills) measured slower (docs/BENCHMARKS.md,
// session 14).
// kF8Stages: the cp.async pipeline's stages (kF8Stages - 1 steps in flight): 4, or 8 with DSV4_MOE_PREFILL_STAGES=8
// (7 steps = 448 bytes of each weight row in flight, like the decode walk's ring: the test of the weight-stream
// hypothesis; measured no faster, gate/up 75.7 -> 78.8 ms, down 40.4 -> 39.3: docs/BENCHMARKS.md session 15).
template <bool GATE_UP, int kF8Stages>
__global__ void __launch_bounds__(kF8Threads, 1) expert_f8(ExpertArgs a, const uint8_t* xg) {
  pdl_wait();
  extern __shared__ __align__(16) uint8_t smem[];
  const int64_t K = GATE_UP ? a.d : a.I, R = GATE_UP ? a.I : a.d, nk = static_cast<int64_t>(a.n) * a.k;
  int e, ns1;
  int32_t beg;
  if (!f8_tile(reinterpret_cast<const int32_t*>(xg + f8_tiles_offset(nk, K)), f8_max_tiles(nk, a.E), a.offsets, e, beg, ns1)) return;
  const int32_t end = beg + ns1;
  const DevExpert E = a.table[e];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (GATE_UP ? kF8Rows / 2 : kF8Rows);
  const float* xsc = f8_xscales(const_cast<uint8_t*>(xg), nk, K);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;
  // Tile row tr (0..127) -> weight row and scale row (rows past R recompute the last row; never stored).
  auto wrow = [&](int tr, const uint8_t*& w, const uint8_t*& s) {
    const bool second = GATE_UP && tr >= kF8Rows / 2;
    mxfp4_expert_row<GATE_UP>(E, a, K, min(r0 + (GATE_UP ? tr % (kF8Rows / 2) : tr), R - 1), second, w, s);
  };
  // This thread's copies per stage: weights row tid / 2, chunks 2 (tid % 2) and + 1; codes slots tid / 8 and 32 +
  // tid / 8, unit tid % 8; threads < 128 the scale word of row tid, threads 128..191 the scale of slot tid - 128.
  const int a_row = tid >> 1, a_c0 = 2 * (tid & 1);
  const uint8_t *a_src, *a_scl;
  wrow(a_row, a_src, a_scl);
  const uint8_t* s_src = nullptr;
  if (tid < kF8Rows) {
    const uint8_t* unused;
    wrow(tid, unused, s_src);
  }
  const int b_slot = tid >> 3, b_unit = tid & 7;
  const int nks = static_cast<int>(K / kF8K), kb = static_cast<int>(K / kF8K);
  // ldmatrix lane addresses: weights (rows lrow of the m-tile, chunk lch of the pair); codes (slot of n-tile pair
  // member (lane >> 4), unit (lane >> 3) & 1 of the chunk).
  const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lch = lane >> 4;
  const int bsl = (lane & 7) + 8 * (lane >> 4), bun = (lane >> 3) & 1;
  auto mrow = [&](int mt) { return GATE_UP ? mt * (kF8Rows / 2) + 16 * wm : 32 * wm + 16 * mt; };
  // One pass: the work list gives a block one slot tile (end - beg <= 64). Kept as the GPU-measured loop of the
  // per-expert grid: flattening it changed the generated code (PTX), unmeasured.
  for (int32_t s0 = beg; s0 < end; s0 += kF8Slots) {
    const int ns = min(kF8Slots, end - s0);
    const int64_t sl0 = s0 + min(b_slot, ns - 1), sl1 = s0 + min(b_slot + 32, ns - 1);
    const uint8_t* b_src0 = xg + sl0 * K + 16 * b_unit;
    const uint8_t* b_src1 = xg + sl1 * K + 16 * b_unit;
    const float* x_src = tid >= kF8Rows && tid < kF8Rows + kF8Slots ? xsc + (s0 + min(tid - kF8Rows, ns - 1)) * kb : nullptr;
    auto issue = [&](int ks) {
      uint8_t* st = smem + (ks % kF8Stages) * kF8StageBytes;
      if (ks < nks) {
        const uint8_t* w = a_src + static_cast<int64_t>(ks) * (kF8K / 2);
        f8_copy_weights(st, a_row, a_c0, w);
        uint8_t* bst = st + kF8ABytes;
        cp_async16(bst + b_slot * 128 + 16 * (b_unit ^ (b_slot & 7)), b_src0 + static_cast<int64_t>(ks) * kF8K);
        const int s1 = b_slot + 32;
        cp_async16(bst + s1 * 128 + 16 * (b_unit ^ (s1 & 7)), b_src1 + static_cast<int64_t>(ks) * kF8K);
        if (tid < kF8Rows) cp_async4(st + kF8ABytes + kF8BBytes + 4 * tid, s_src + 4 * ks);
        else if (x_src) cp_async4(st + kF8ABytes + kF8BBytes + 4 * kF8Rows + 4 * (tid - kF8Rows), x_src + ks);
      }
      cp_async_commit();
    };
    float acc[2][4][4] = {};
    __syncthreads();  // the previous slot tile's stages are no longer read
#pragma unroll
    for (int p = 0; p < kF8Stages - 1; ++p) issue(p);
    for (int ks = 0; ks < nks; ++ks) {
      cp_async_wait<kF8Stages - 2>();
      __syncthreads();  // stage ks has landed for every thread; stage ks - 1 is no longer read
      issue(ks + kF8Stages - 1);
      const uint8_t* st = smem + (ks % kF8Stages) * kF8StageBytes;
      const uint8_t* bst = st + kF8ABytes;
      const uint32_t* wsc = reinterpret_cast<const uint32_t*>(st + kF8ABytes + kF8BBytes);
      const float* xs = reinterpret_cast<const float*>(st + kF8ABytes + kF8BBytes + 4 * kF8Rows);
      uint32_t ws[2][2];  // [mt][h]: the 4 E8M0 bytes (one per 32-column chunk) of rows g + 8h of m-tile mt
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) ws[mt][h] = wsc[mrow(mt) + g + 8 * h];
      float part[2][4][4] = {};  // this 128-column block's sums, weight-scaled, before the activation scale
      uint32_t wa[2][4];
#pragma unroll
      for (int c = 0; c < kF8K / 32; ++c) {
        if ((c & 1) == 0) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const int r = mrow(mt) + lrow, ch = c + lch;
            ldmatrix_x4(wa[mt], st + f8_wchunk(r, ch));  // {c g, c g8, c+1 g, c+1 g8}
          }
        }
        uint32_t b[4][2];
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
          const int s = wn * 32 + 16 * hp + bsl, u = 2 * c + bun;
          uint32_t r[4];
          ldmatrix_x4(r, bst + s * 128 + 16 * (u ^ (s & 7)));  // {tile 2hp b0, b1, tile 2hp+1 b0, b1}
          b[2 * hp][0] = r[0], b[2 * hp][1] = r[1], b[2 * hp + 1][0] = r[2], b[2 * hp + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const uint32_t wg = wa[mt][2 * (c & 1)], wg8 = wa[mt][2 * (c & 1) + 1];
          const uint32_t a0 = e2m1_lo_e4m3(wg), a1 = e2m1_lo_e4m3(wg8), a2 = e2m1_hi_e4m3(wg), a3 = e2m1_hi_e4m3(wg8);
          const float sg = e8m0_dev((ws[mt][0] >> (8 * c)) & 0xFFu), sg8 = e8m0_dev((ws[mt][1] >> (8 * c)) & 0xFFu);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float d[4];
            mma_e4m3_16832_z(d, a0, a1, a2, a3, b[j][0], b[j][1]);
            part[mt][j][0] = fmaf(d[0], sg, part[mt][j][0]);
            part[mt][j][1] = fmaf(d[1], sg, part[mt][j][1]);
            part[mt][j][2] = fmaf(d[2], sg8, part[mt][j][2]);
            part[mt][j][3] = fmaf(d[3], sg8, part[mt][j][3]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float x0 = xs[wn * 32 + 8 * j + 2 * t] * 64.0f, x1 = xs[wn * 32 + 8 * j + 2 * t + 1] * 64.0f;  // x 2^6: E2M1 -> E4M3
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          acc[mt][j][0] = fmaf(part[mt][j][0], x0, acc[mt][j][0]);
          acc[mt][j][1] = fmaf(part[mt][j][1], x1, acc[mt][j][1]);
          acc[mt][j][2] = fmaf(part[mt][j][2], x0, acc[mt][j][2]);
          acc[mt][j][3] = fmaf(part[mt][j][3], x1, acc[mt][j][3]);
        }
      }
    }
    cp_async_wait<0>();
    tc_grouped_store<GATE_UP>(a, acc, s0, ns, wn * 32, t, R, [&](int mt, int h) {
      return GATE_UP ? r0 + 16 * wm + g + 8 * h : r0 + 32 * wm + 16 * mt + g + 8 * h;
    });
  }
}
