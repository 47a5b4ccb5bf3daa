// Decode GEMV v4 ("ring"): single-token GEMVs and routed experts streaming their weights through a per-warp ring of
// shared memory filled by cp.async (LDGSTS), one 512-thread block per SM.
//
// Why: the v3 kernels (gemv_xsmem.cuh) hold the weights in flight in registers, two chunk-steps per warp, so each SM
// had at most ~32 KB of loads outstanding. By Little's law that caps a 4.3 TB/s part at ~1.5-2 TB/s for the ~1.5 us
// loaded DRAM latency, which is what they measured (35-45 % of the bandwidth, `dsv4 bench-ops` / ncu). Here every
// lane copies its 16-byte weight chunk (and the 4-byte word holding its block scale) of S - 1 future chunk-steps
// into shared memory: (S - 1) * R * 20 bytes per lane, ~100 KB per SM in flight, no registers held. A lane reads back
// only what it copied itself, so cp.async.wait_group alone orders each read after its copy (no barrier needed).
// The arithmetic is chunk_dot_s of v3 in the same per-lane chunk order (lane, lane + 32, ...), followed by the same
// warp_sum: results are bit-identical to gemv_xs_tiles_kernel / expert_tiles_kernel and to any v3 kernel without K
// split.
// Included INSIDE kernels.cu's anonymous namespace, after gemv_xsmem.cuh (stage_x, chunk_dot_s, scale_row, ...).
#pragma once

// Geometry: R weight rows per tile (per warp step), S chunk-steps per warp ring (S - 1 in flight while one is
// consumed), T threads per block (one block per SM). Measured and dropped: 2 rows x 32 warps (the same bytes in
// flight, twice the warps): 6-30 % slower (more activation reads per weight; the FP4 kernels spill at 64 registers).
template <int R_, int S_, int T_>
struct RingCfg {
  static constexpr int R = R_, S = S_, T = T_, W = T_ / 32;
  static constexpr size_t WarpBytes = static_cast<size_t>(S) * R * 32 * (16 + 4);
  static constexpr size_t Bytes = W * WarpBytes;  // the staged activation comes after the rings
};
using RingA = RingCfg<4, 4, 512>;
constexpr int kRingR = 4;  // rows the launchers require per group (a multiple of every geometry's R)
constexpr size_t kRingBytes = RingA::Bytes;  // 160 KB

// cp_async16 / cp_async4 / cp_async_commit / cp_async_wait: kernels.cu (before the first kernel that uses them).

// The aligned 4-byte word holding chunk c's block scale(s), and the bit offset of those inside it: FP8 one fp32 per
// 8 chunks (always aligned); MXFP4 one byte per chunk; NVFP4 two bytes per chunk (the launcher requires an even
// scale row stride, so the pair never straddles two words).
template <int F>
__device__ __forceinline__ const uint32_t* scale_word(const void* sp, int64_t c, int blk, int& shift) {
  if constexpr (F == kFP8) {
    shift = 0;
    return reinterpret_cast<const uint32_t*>(static_cast<const float*>(sp) + (c >> 3));
  } else {
    const uintptr_t at = reinterpret_cast<uintptr_t>(sp) + static_cast<uintptr_t>(blk == 16 ? 2 * c : c);
    shift = static_cast<int>(at & 3u) * 8;
    return reinterpret_cast<const uint32_t*>(at & ~static_cast<uintptr_t>(3));
  }
}
// raw_scale's value from the copied word.
template <int F>
__device__ __forceinline__ uint32_t scale_bits(uint32_t word, int shift, int blk) {
  if constexpr (F == kFP8) return word;
  else return (word >> shift) & (blk == 16 ? 0xFFFFu : 0xFFu);
}

// One tile: R weight rows, their scale rows and global scales, and the staged activation they multiply.
template <int R>
struct RingTile {
  const uint8_t* wp[R];
  const void* sp[R];
  float gs[R];
  const float* xs;
};

// The warp's walk over tiles gw, gw + nw, ... (nw warps in its group), ks chunk-steps each, through the ring.
// tile_at(t, RingTile&) describes tile t; flush(t, acc) is its epilogue (acc: lane partials, not warp-reduced).
// stage() stages the activation(s) with all threads of the block; called once, after the first copies are issued.
// WAIT_AFTER_PROLOGUE: the kernel has not called pdl_wait() yet; the first S - 1 steps' weight copies are issued
// before it (weights never depend on the previous kernel), so under programmatic dependent launch they overlap the
// previous kernel's tail instead of following it; the activation is staged after the wait.
template <int F, int R, int S, bool WAIT_AFTER_PROLOGUE, typename TileAt, typename Flush, typename Stage>
__device__ __forceinline__ void ring_walk(int64_t gw, int64_t nw, int64_t ntiles, int64_t nch, int blk, uint8_t* ring,
                                         TileAt tile_at, Flush flush, Stage stage) {
  constexpr bool kScaled = F == kFP8 || F == kFP4;
  const int lane = threadIdx.x & 31;
  const int ks = static_cast<int>((nch + 31) / 32);
  const int64_t steps = gw < ntiles ? ((ntiles - gw + nw - 1) / nw) * ks : 0;
  uint4* wring = reinterpret_cast<uint4*>(ring);                       // [S][R][32]
  uint32_t* sring = reinterpret_cast<uint32_t*>(ring + S * R * 32 * 16);  // [S][R][32]
  // Load cursor: the tile and chunk-step whose copies are issued next, and the ring slot they go to.
  int64_t lt = gw;
  int lk = 0, lslot = 0;
  RingTile<R> L;
  if (steps > 0) tile_at(lt, L);
  auto issue = [&]() {
    const int64_t c = static_cast<int64_t>(lk) * 32 + lane;
    if (c < nch) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        cp_async16(wring + (lslot * R + r) * 32 + lane, L.wp[r] + c * 16);
        if constexpr (kScaled) {
          int sh;
          cp_async4(sring + (lslot * R + r) * 32 + lane, scale_word<F>(L.sp[r], c, blk, sh));
        }
      }
    }
    lslot = lslot + 1 == S ? 0 : lslot + 1;
    if (++lk == ks) {
      lk = 0;
      lt += nw;
      if (lt < ntiles) tile_at(lt, L);
    }
  };
#pragma unroll
  for (int p = 0; p < S - 1; ++p) {
    if (p < steps) issue();
    cp_async_commit();  // empty groups keep the group count uniform
  }
  if constexpr (WAIT_AFTER_PROLOGUE) pdl_wait();
  stage();
  __syncthreads();
  int64_t ct = gw;
  int ck = 0, cslot = 0;
  RingTile<R> C;
  if (steps > 0) tile_at(ct, C);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t s = 0; s < steps; ++s) {
    if (s + S - 1 < steps) issue();
    cp_async_commit();
    cp_async_wait<S - 1>();  // this lane's copies of step s have landed
    const int64_t c = static_cast<int64_t>(ck) * 32 + lane;
    if (c < nch) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 q = wring[(cslot * R + r) * 32 + lane];
        uint32_t sraw = 0;
        if constexpr (kScaled) {
          int sh;
          scale_word<F>(C.sp[r], c, blk, sh);
          sraw = scale_bits<F>(sring[(cslot * R + r) * 32 + lane], sh, blk);
        }
        acc[r] += chunk_dot_s<F>(q, C.xs, c, sraw, blk, C.gs[r]);
      }
    }
    cslot = cslot + 1 == S ? 0 : cslot + 1;
    if (++ck == ks) {
      flush(ct, acc);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = 0.0f;
      ck = 0;
      ct += nw;
      if (ct < ntiles) tile_at(ct, C);
    }
  }
  cp_async_wait<0>();  // nothing may still be writing this block's shared memory when it exits
}

// Single-token GEMV y = W x (optionally grouped: G = out / group_rows groups, group g reading x + g * group_x_off).
// Blocks are split evenly between groups (gridDim.x a multiple of G); a group's blocks stage its x slice once and
// their warps walk its R-row tiles.
template <int F, typename C>
__global__ void __launch_bounds__(C::T, 1) gemv_ring_kernel(WRow W, int64_t out, LinearArgs a, int G) {
  constexpr int kRingR = C::R, kRingWarps = C::W;  // pdl_wait(): in ring_walk, after the weight prologue
  // (DSV4_PHASE_STAMPS builds) 0 entry, 1 past the wait (x about to be staged), 2 warp 0's walk done; tag: the rows.
  // And the last warp's (its last thread): 0 entry, 1 its walk done; tag: minus the rows.
  PHASE_DECL;
  PHASE_DECL2(pl, C::T - 1);
  BLOCK_STAMPS_DECL;
  PHASE_MARK(0);
  PHASE_MARK2(pl, 0);
  extern __shared__ float4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* xs = reinterpret_cast<float*>(smem + kRingBytes);
  const int bpg = gridDim.x / G, g = blockIdx.x / bpg;
  const int64_t grows = G > 1 ? a.group_rows : out, row_base = g * grows;
  const int64_t ntiles = (grows + kRingR - 1) / kRingR, nch = W.in / Chunk<F>::CW;
  const float* x = a.x + (G > 1 ? g * a.group_x_off : 0);
  const int64_t gw = static_cast<int64_t>(blockIdx.x % bpg) * kRingWarps + warp, nw = static_cast<int64_t>(bpg) * kRingWarps;
  auto tile_at = [&](int64_t t, RingTile<kRingR>& T) {
#pragma unroll
    for (int r = 0; r < kRingR; ++r) {
      const int64_t rr = row_base + min(t * kRingR + r, grows - 1);  // rows past the end recompute the last row
      T.wp[r] = static_cast<const uint8_t*>(W.w) + rr * row_bytes<F>(W.in);
      T.sp[r] = scale_row<F>(W, rr);
      T.gs[r] = W.g;
    }
    T.xs = xs;
  };
  auto flush = [&](int64_t t, float (&acc)[kRingR]) {
#pragma unroll
    for (int r = 0; r < kRingR; ++r) {
      const float v = warp_sum(acc[r]);
      const int64_t rr = t * kRingR + r;
      if (lane == 0 && rr < grows) a.y[row_base + rr] = a.round_bf16 ? bf16r(v) : v;
    }
  };
  ring_walk<F, kRingR, C::S, true>(gw, nw, ntiles, nch, W.blk, smem + warp * C::WarpBytes, tile_at, flush, [&] {
    PHASE_MARK(1);
    BLOCK_STAMPS_WAITED;
    stage_x<F>(x, W.in, xs, a.qa8_x);
  });
  PHASE_MARK(2);
  PHASE_RECORD("gemv_ring", out);
  PHASE_MARK2(pl, 1);
  PHASE_RECORD2(pl, "gemv_ring", -out);
  BLOCK_STAMPS_END("gemv_ring");
}

#include "backend/cuda/expert_mma.cuh"  // the routed MXFP4 walk on FP8 MMAs (mma_walk), used below

// The decode experts' epilogues, one place for every walk (routed, shared, MMA): gate/up row r of slot j from its
// gate and up sums ([official] BF16 each, then SwiGLU with the slot's weight wt), and down row r of slot j.
__device__ __forceinline__ void expert_store_act(const ExpertArgs& a, int j, int64_t r, float gv, float uv, float wt) {
  if (a.official) gv = bf16r(gv), uv = bf16r(uv);
  a.act[static_cast<int64_t>(j) * a.I + r] = swiglu1(gv, uv, a.limit, wt, a.official);
}
__device__ __forceinline__ void expert_store_y(const ExpertArgs& a, int j, int64_t r, float v) {
  a.y[static_cast<int64_t>(j) * a.d + r] = a.official ? bf16r(v) : v;
}

// Decode (one token) routed experts through the ring, one pass per matrix kind over all k selected experts.
// GATE_UP: tile = R / 2 intermediate rows r.. of slot j (w1 r, w3 r, w1 r+1, w3 r+1, ...), SwiGLU epilogue; x staged
// once. down: tile = R output rows of slot j; all k act rows staged.
//
// With the shared expert (sh: its FP8 w1|w3 pair for gate/up -- rows [0, I) w1, [I, 2I) w3 -- or its w2 for down;
// has_sh), the kernel also walks the shared expert's tiles as slot k (act row k, y row k), exactly the ring GEMVs'
// arithmetic on the same rows plus the SwiGLU epilogue of the routed slots with weight 1, i.e. what the separate
// shared-expert kernels computed on the ring GEMVs (DSV4_GEMV_TC=0; by default those use the tensor-core GEMV, which
// sums in another order: the fused result is the same function, not the same bits) in one launch fewer each. Which
// walk goes first (and has its copies issued before griddepcontrol.wait) is explained at the walks below.
// mma != 0 (MXFP4 with the activation QA8-quantized while staging; expert_mma_mode): the routed walk is mma_walk
// (expert_mma.cuh) instead of ring_walk, in the same ring memory; mma == 2: the shared expert's FP8 walk on the
// MMAs too (the default where its shapes allow; DSV4_SHARED_MMA=0: off), else unchanged. parts (1, 2 or 4;
// expert_mma_parts): the routed MMA walk's K split, for fewer routed tiles than warps. once (mma == 2 with has_sh;
// expert_stage_once): the first of the two walks stages both walks' inputs (gate/up: and reads the selection), the
// second skips its staging and block barrier, so a warp goes from its first walk's tiles straight to its second's.
// MMA_ONLY (launched only with mma == 2, or mma == 1 without the shared expert; the default; DSV4_EXPERT_MMA_ONLY=0: off): the same
// kernel without its FMA walks, which those launches never reach -- 76-78 KB of SASS instead of 189-217 KB and
// 104-108 registers instead of 124-125 (ptxas): ncu sampled 18 % of the full kernel's warp stalls waiting for
// instructions (docs/BENCHMARKS.md, session 12). Same code on the paths it keeps: the same bits.
// F16R (MMA_ONLY launches only; DSV4_EXPERT_F16, default): the routed MXFP4 walk on f16 MMAs (mma_walk F16) with its
// activation staged as f16 (stage_x_f16p; 2 bytes per column where the E4M3 codes took 1, inside the same fp32-sized
// region), the shared expert's walk unchanged.
// XROWS (F16R only; the batched launch of expert_rows_*): gate/up stages a.x_rows rows of x, slot j reading row
// j / (k / x_rows); a separate instantiation so that the single-token kernels keep their code.
template <int F, bool GATE_UP, typename C, bool MMA_ONLY = false, bool F16R = false, bool XROWS = false>
__global__ void __launch_bounds__(C::T, 1) expert_ring_kernel(ExpertArgs a, int blk, WRow sh, bool has_sh, int mma, int parts, bool once,
                                                           bool balance, bool batch) {
  static_assert(!F16R || MMA_ONLY, "the f16 routed walk is instantiated on the MMA-only kernel");
  static_assert(!XROWS || F16R, "several x rows: the f16 walk only");
  const int x_rows = XROWS ? a.x_rows : 1;
  // (DSV4_PHASE_STAMPS builds, the MMA walks; block 0's warp 0) 0 entry, 1 gate/up's first (shared) walk done, 2
  // the selection read, 3 the routed walk done, 4 down's second (shared) walk done, 5 / 6 the routed walk past its
  // wait / its input staged (where it stages: down); tag 1 gate/up, 0 down
  PHASE_DECL;
  BLOCK_STAMPS_DECL;
  PHASE_MARK(0);
  if constexpr (MMA_ONLY) {
    if (mma == 0 || (has_sh && mma != 2)) __trap();  // a launch this variant has no walk for: an error, never a wrong result
  }
  constexpr int kRingR = C::R, kRingWarps = C::W, kHalf = C::R / 2;  // gate/up: kHalf intermediate rows a tile
  extern __shared__ float4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  __shared__ DevExpert ex[kTilesMaxK];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, k = a.k;
  float* xs = reinterpret_cast<float*>(smem + kRingBytes);
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kRingWarps + warp, nw = static_cast<int64_t>(gridDim.x) * kRingWarps;
  // The MMA walks' staged activations: the routed rows' E4M3 codes (in the MMA order) and scales at xs, the shared
  // expert's (natural order) after the routed rows (xs2, as for the FMA walks).
  float* xs2 = xs + (GATE_UP ? a.d : static_cast<int64_t>(k) * a.I);
  uint8_t* xcodes = reinterpret_cast<uint8_t*>(xs);
  // (a.x_rows > 1: the batched launch of expert_rows_*, gate/up staging x_rows rows of x, F16R without a shared walk)
  float* xscales = reinterpret_cast<float*>(xcodes + (F16R ? 2 : 1) * (GATE_UP ? x_rows * a.d : static_cast<int64_t>(k) * a.I));
  uint8_t* xc2 = reinterpret_cast<uint8_t*>(xs2);
  float* xsc2 = reinterpret_cast<float*>(xc2 + (GATE_UP ? a.d : a.I));
  auto stage_routed_m = [&] {
    if constexpr (F16R) {
      __half* xh = reinterpret_cast<__half*>(xcodes);
      if (GATE_UP && XROWS) {
        for (int r = 0; r < x_rows; ++r)
          stage_x_f16p(a.x + r * a.d, a.d, xh + r * a.d, xscales + r * (a.d / 128));
      } else if (GATE_UP) {
        stage_x_f16p(a.x, a.d, xh, xscales);
      } else {
        for (int j = 0; j < k; ++j)
          stage_x_f16p(a.act_q + static_cast<int64_t>(j) * a.I, a.I, xh + static_cast<int64_t>(j) * a.I,
                       xscales + static_cast<int64_t>(j) * (a.I / 128));
      }
    } else if (GATE_UP) {
      stage_x_e4m3(a.x, a.d, xcodes, xscales);
    } else {
      for (int j = 0; j < k; ++j)
        stage_x_e4m3(a.act_q + static_cast<int64_t>(j) * a.I, a.I, xcodes + static_cast<int64_t>(j) * a.I,
                     xscales + static_cast<int64_t>(j) * (a.I / 128));
    }
  };
  auto stage_shared_m = [&] {
    if (GATE_UP) stage_x_e4m3<true>(a.x, a.d, xc2, xsc2);
    else stage_x_e4m3<true>(a.act_q + static_cast<int64_t>(k) * a.I, a.I, xc2, xsc2);
  };
  // batch (F16R with once; expert_stage_batch): stage_routed_m and stage_shared_m as one stage_qa8_blocks pass, so
  // a warp's blocks are requested together -- gate/up: each 128-block of x read once for both layouts; down: the k
  // routed act rows' blocks, then the shared row's. The same bits.
  auto stage_both_batched = [&](bool cg = false) {  // cg: x read through L2 (before the wait: x_early)
    if constexpr (F16R) {
      __half* xh = reinterpret_cast<__half*>(xcodes);
      if (GATE_UP) {
        stage_qa8_blocks(static_cast<int>(a.d / 128), [&](int i) { return a.x + static_cast<int64_t>(i) * 128; },
                         [&](int i, __nv_fp8x2_storage_t e01, __nv_fp8x2_storage_t e23, float s) {
                           put_f16p(e01, e23, s, xh + static_cast<int64_t>(i) * 128, xscales + i);
                           put_e4m3_nat(e01, e23, s, xc2 + static_cast<int64_t>(i) * 128, xsc2 + i);
                         }, cg);
      } else {
        const int KB = static_cast<int>(a.I / 128);
        stage_qa8_blocks((k + 1) * KB, [&](int i) { return a.act_q + static_cast<int64_t>(i) * 128; },
                         [&](int i, __nv_fp8x2_storage_t e01, __nv_fp8x2_storage_t e23, float s) {
                           const int j = i / KB, b = i - j * KB;
                           if (j < k) put_f16p(e01, e23, s, xh + static_cast<int64_t>(i) * 128, xscales + i);
                           else put_e4m3_nat(e01, e23, s, xc2 + static_cast<int64_t>(b) * 128, xsc2 + b);
                         });
      }
    }
  };
  auto load_selection = [&] {  // one token: slots 0..k-1, read through L2 (__ldcg), past any older L1 line
    if (threadIdx.x < k) ex[threadIdx.x] = a.table[__ldcg(a.sel + threadIdx.x)];
  };
  // The shared expert's walk (has_sh); PRE: its first copies are issued before griddepcontrol.wait (ring_walk).
  // ROLE (once, MMA walk only): 1 = the first walk (gate/up): it stages the routed walk's input too and reads the
  // selection; 2 = the second walk (down): the routed walk staged its input, no staging, no block barrier; 3 = gate/up's
  // first walk with x_early (batch only, PRE false): it stages both inputs before any wait (x through L2) and does
  // not read the selection (x_early_selection does, past the wait).
  auto walk_shared = [&](auto pre, auto role) {
    constexpr bool PRE = decltype(pre)::value;
    constexpr int ROLE = decltype(role)::value;
    const int64_t K2 = GATE_UP ? a.d : a.I, rows2 = GATE_UP ? a.I : a.d;
    [[maybe_unused]] const int64_t nt2 = GATE_UP ? (a.I + kHalf - 1) / kHalf : (a.d + kRingR - 1) / kRingR;  // FMA walk
    auto tile2 = [&](int64_t t, RingTile<kRingR>& T) {
      if (GATE_UP) {
#pragma unroll
        for (int jj = 0; jj < kHalf; ++jj) {
          const int64_t r = min(kHalf * t + jj, rows2 - 1);
          T.wp[2 * jj] = static_cast<const uint8_t*>(sh.w) + r * row_bytes<kFP8>(K2);
          T.wp[2 * jj + 1] = static_cast<const uint8_t*>(sh.w) + (a.I + r) * row_bytes<kFP8>(K2);
          T.sp[2 * jj] = scale_row<kFP8>(sh, r), T.sp[2 * jj + 1] = scale_row<kFP8>(sh, a.I + r);
          T.gs[2 * jj] = T.gs[2 * jj + 1] = sh.g;
        }
      } else {
#pragma unroll
        for (int r = 0; r < kRingR; ++r) {
          const int64_t rr = min(t * kRingR + r, rows2 - 1);
          T.wp[r] = static_cast<const uint8_t*>(sh.w) + rr * row_bytes<kFP8>(K2);
          T.sp[r] = scale_row<kFP8>(sh, rr);
          T.gs[r] = sh.g;
        }
      }
      T.xs = xs2;
    };
    auto flush2 = [&](int64_t t, float (&acc)[kRingR]) {
#pragma unroll
      for (int r = 0; r < kRingR; ++r) acc[r] = warp_sum(acc[r]);
      if (lane != 0) return;
      if (GATE_UP) {
#pragma unroll
        for (int jj = 0; jj < kHalf; ++jj) {
          const int64_t r = kHalf * t + jj;
          if (r < rows2) expert_store_act(a, k, r, acc[2 * jj], acc[2 * jj + 1], 1.0f);
        }
      } else {
#pragma unroll
        for (int r = 0; r < kRingR; ++r)
          if (t * kRingR + r < rows2) expert_store_y(a, k, t * kRingR + r, acc[r]);
      }
    };
    // Shared tiles go to warps block-minor (tile t -> block t % grid): the shared expert's 1/7 of the work spreads
    // over every SM instead of the first ~64 blocks' warps.
    [[maybe_unused]] const int64_t gw2 = static_cast<int64_t>(warp) * gridDim.x + blockIdx.x;  // FMA walk
    if (mma == 2) {
      // expert_mma_mode 2 (default; DSV4_SHARED_MMA=0: the ring walk below): the FP8 MMA walk (mma_walk W8) in
      // 16-row tiles -- gate/up: 8 rows of w1 and the same 8 of w3 (pair rows I + r), down: 16 rows of w2 -- with
      // the activation staged as natural-order E4M3 codes.
      const int64_t per2 = GATE_UP ? a.I / 8 : a.d / 16;
      auto rows2_of = [&](int64_t t, int r, const uint8_t*& w, const uint8_t*& sc) {
        const int64_t row = GATE_UP ? (r < 8 ? 8 * t + r : a.I + 8 * t + (r - 8)) : 16 * t + r;
        w = static_cast<const uint8_t*>(sh.w) + row * K2;
        sc = static_cast<const uint8_t*>(scale_row<kFP8>(sh, row));
      };
      auto flush2_m = [&](int64_t t, float v0, float v8) {
        const int g = lane >> 2;
        if (GATE_UP) {
          expert_store_act(a, k, 8 * t + g, v0, v8, 1.0f);
        } else {
          expert_store_y(a, k, 16 * t + g, v0);
          expert_store_y(a, k, 16 * t + g + 8, v8);
        }
      };
      // K split 4 ways inside groups of 4 warps (mma_walk parts): 256 tiles x 4 parts keep ~8 warps per SM busy.
      static_assert(C::W == 16, "4 groups of 4 warps (named barriers 1..4)");
      // balance (down, where this walk comes second): its groups are taken from the block's top warps down, away
      // from the routed walk's tiles, which fill warps from 0 up.
      const int wg = (balance && !GATE_UP) ? C::W / 4 - 1 - warp / 4 : warp / 4;
      const int64_t gwg = static_cast<int64_t>(wg) * gridDim.x + blockIdx.x, nwg = static_cast<int64_t>(C::W / 4) * gridDim.x;
      mma_walk<PRE, 8, true, false>(gwg, nwg, per2, K2, smem + warp * C::WarpBytes, rows2_of,
                             [&](int64_t) -> const uint8_t* { return xc2; }, [&](int64_t) -> const float* { return xsc2; },
                             flush2_m, [&] {
                               if constexpr (ROLE == 3) {
                                 stage_both_batched(true);
                                 return;
                               }
                               if constexpr (ROLE == 1) {
                                 if (batch) {
                                   load_selection();
                                   stage_both_batched();
                                   return;
                                 }
                                 stage_routed_m(), load_selection();
                               }
                               if constexpr (ROLE != 2) stage_shared_m();
                             }, 4, warp % 4, warp / 4, 1, ROLE != 2);
      return;
    }
    if constexpr (!MMA_ONLY) {
      ring_walk<kFP8, kRingR, C::S, PRE>(gw2, nw, nt2, K2 / Chunk<kFP8>::CW, 0, smem + warp * C::WarpBytes, tile2, flush2, [&] {
        if (GATE_UP) stage_x<kFP8>(a.x, a.d, xs2, a.qa8_x);
        else stage_x<kFP8>(a.act_q + static_cast<int64_t>(k) * a.I, a.I, xs2, a.qa8_act);
      });
    }
  };
  // gate/up: the routed experts are known only once the router (the previous kernel) is done, so the shared expert
  // goes first, its copies issued before griddepcontrol.wait. down: the router finished before gate/up passed its own
  // wait, and this grid is launched only after every gate/up block passed it (launch_dependents follows the wait), so
  // the selection is already final here: the routed tiles go first and THEIR copies overlap gate/up's tail (half of a
  // down warp's 6 chunk-steps for Flash). The selection is read through L2 (__ldcg), past any older L1 line.
  using Role0 = std::integral_constant<int, 0>;
  using Role1 = std::integral_constant<int, 1>;
  using Role2 = std::integral_constant<int, 2>;
  using Role3 = std::integral_constant<int, 3>;
  once = once && F == kFP4 && mma == 2 && has_sh;  // the launcher sets it only there; the kernel relies on it
  batch = batch && once && F16R;
  // x_early (ExpertArgs): the shared walk before the wait; then each warp passes the wait on its own and the first
  // one to get there loads the selection for the block (ex_state 0 -> 1 -> 2), so that no block barrier holds the
  // warps without shared tiles (they go straight to their routed tiles, as with ROLE 1) behind the shared ones.
  const bool early = GATE_UP && a.x_early && batch;
  static_assert(kTilesMaxK <= 32, "x_early_selection: one warp loads the selection");
  __shared__ int ex_state;
  if (early && threadIdx.x == 0) ex_state = 0;  // published by the shared walk's block barrier (sync = true)
  auto x_early_selection = [&] {
    pdl_wait();  // every thread: the routed flushes read the router's weights (a.wts)
    int leader = 0;
    if (lane == 0) leader = atomicCAS(&ex_state, 0, 1) == 0;
    leader = __shfl_sync(0xffffffffu, leader, 0);
    if (leader) {
      if (lane < k) ex[lane] = a.table[__ldcg(a.sel + lane)];
      __threadfence_block();
      __syncwarp();
      if (lane == 0) atomicExch(&ex_state, 2);
    } else {
      if (lane == 0)
        while (atomicAdd(&ex_state, 0) != 2) {
        }
      __syncwarp();
      __threadfence_block();
    }
  };
  if constexpr (GATE_UP) {
    if (early) {
      walk_shared(std::false_type{}, Role3{});  // stages both inputs before any wait
      x_early_selection();
    } else if (has_sh && once) {
      walk_shared(std::true_type{}, Role1{});  // stages both inputs and reads the selection
    } else if (has_sh) {
      walk_shared(std::true_type{}, Role0{});
    } else {
      pdl_wait();
    }
    PHASE_MARK(1);
  }
  if (!(GATE_UP && once)) {
    load_selection();
    __syncthreads();
  }
  PHASE_MARK(2);
  const int64_t K = GATE_UP ? a.d : a.I, rows = GATE_UP ? a.I : a.d;
  if constexpr (F == kFP4) {
    if (mma) {
      static_assert(kMmaWarpBytes <= C::WarpBytes, "the MMA walk's ring must fit the warp's ring memory");
      // 16-row tiles (gate/up: 8 intermediate rows of w1, then of w3); fewer tiles than warps (Flash: 1,536 for
      // 2,112 warps), so tiles go to warps block-minor: every SM gets a share. With half as many tiles again (a TP2
      // rank's gate/up: 768) a tile's K is split over `parts` warps of one block: one warp per tile left ~6 of 16
      // warps per SM walking 32 steps each (the TP2 trace: gate/up 23.5 us for half the bytes of TP1's 34.6).
      const int64_t per_m = GATE_UP ? a.I / 8 : a.d / 16, nt_m = per_m * k;
      // balance (gate/up after the fused shared walk, mma == 2): the shared walk took groups of 4 warps from warp 0
      // up (block-minor: group g of this block walks shared tiles iff g * grid + block < I / 8); the routed tiles
      // start at the first warp after them and wrap around, so a warp walks shared OR routed tiles until both sets
      // need more warps than the block has (TP2 Flash: 4 shared + 12 routed warps). Before, warps 0-3 walked both,
      // twice the steps of the others -- yet the A/B (docs/BENCHMARKS.md, session 12) showed no difference either way:
      // the launch is latency-bound on every warp, not bound by its busiest warp.
      int shw = 0;
      if (balance && GATE_UP && has_sh && mma == 2)
        for (int g = 0; g < C::W / 4; ++g) shw += static_cast<int64_t>(g) * gridDim.x + blockIdx.x < a.I / 8 ? 4 : 0;
      const int rw = (warp + C::W - shw) % C::W;  // multiple-of-4 shift: groups of `parts` warps stay aligned
      const int64_t gwm = static_cast<int64_t>(rw / parts) * gridDim.x + blockIdx.x, nwm = static_cast<int64_t>(C::W / parts) * gridDim.x;
      auto rows_of = [&](int64_t t, int r, const uint8_t*& w, const uint8_t*& sc) {
        const int j = static_cast<int>(t) / static_cast<int>(per_m);  // int32: < 2^31 tiles
        const int64_t rt = t - j * per_m;
        const DevExpert& E = ex[j];
        if (GATE_UP) {
          const int64_t row = 8 * rt + (r & 7);
          w = static_cast<const uint8_t*>(r < 8 ? E.w1 : E.w3) + row * (a.d / 2);
          sc = static_cast<const uint8_t*>(r < 8 ? E.s1 : E.s3) + row * a.sb1;
        } else {
          const int64_t row = 16 * rt + r;
          w = static_cast<const uint8_t*>(E.w2) + row * (a.I / 2);
          sc = static_cast<const uint8_t*>(E.s2) + row * a.sb2;
        }
      };
      // gate/up of x_rows > 1 rows: slot j reads row j / (k / x_rows) (k / x_rows slots per token, in token order).
      [[maybe_unused]] auto xrow = [&](int64_t t) { return static_cast<int>(t) / static_cast<int>(per_m) / (k / x_rows); };
      auto xcode = [&](int64_t t) -> const uint8_t* {  // F16R: 2 bytes per staged column
        if constexpr (GATE_UP && XROWS) return xcodes + 2 * static_cast<int64_t>(xrow(t)) * a.d;
        return GATE_UP ? xcodes : xcodes + (F16R ? 2 : 1) * static_cast<int64_t>(static_cast<int>(t) / static_cast<int>(per_m)) * a.I;
      };
      auto xscale = [&](int64_t t) -> const float* {
        if constexpr (GATE_UP && XROWS) return xscales + static_cast<int64_t>(xrow(t)) * (a.d / 128);
        return GATE_UP ? xscales : xscales + static_cast<int64_t>(static_cast<int>(t) / static_cast<int>(per_m)) * (a.I / 128);
      };
      auto flush_m = [&](int64_t t, float v0, float v8) {  // lanes with t4 == 0: rows g and g + 8 of the tile
        const int g = lane >> 2, j = static_cast<int>(t) / static_cast<int>(per_m);
        const int64_t rt = t - j * per_m;
        if (GATE_UP) {
          expert_store_act(a, j, 8 * rt + g, v0, v8, a.wts ? a.wts[j] : 1.0f);
        } else {
          expert_store_y(a, j, 16 * rt + g, v0);
          expert_store_y(a, j, 16 * rt + g + 8, v8);
        }
      };
      uint8_t* ring = smem + warp * C::WarpBytes;
      // Named barriers 5.. (the shared walk's groups use 1..4 and may still be running in other warps of the block).
      // once: gate/up's shared walk staged this input (and published it with its barrier); down's walk stages the
      // shared walk's input too.
      auto stage_m = [&] {  // (phase stamps: 5 past the walk's wait, 6 staged)
        PHASE_MARK(5);
        BLOCK_STAMPS_WAITED;
        if (!GATE_UP && batch) {
          stage_both_batched();
        } else {
          if (!(GATE_UP && once)) stage_routed_m();
          if (!GATE_UP && once) stage_shared_m();
        }
        PHASE_MARK(6);
      };
      if (a.tiles) {  // the tile-major copies (expert_tiles.h): the same bytes per step, fetched contiguously
        auto tile_of = [&](int64_t t) -> const uint8_t* {
          const int j = static_cast<int>(t) / static_cast<int>(per_m);  // int32: < 2^31 tiles
          const int64_t rt = t - j * per_m;
          return static_cast<const uint8_t*>(GATE_UP ? ex[j].t13 : ex[j].t2) + rt * (K / 128) * kTileStepBytes;
        };
        mma_walk<!GATE_UP, 4, false, true, F16R>(gwm, nwm, nt_m, K, ring, tile_of, xcode, xscale, flush_m, stage_m, parts,
                                                 rw % parts, rw / parts, 5, !(GATE_UP && once));
      } else {
        mma_walk<!GATE_UP, 4, false, false, F16R>(gwm, nwm, nt_m, K, ring, rows_of, xcode, xscale, flush_m, stage_m, parts,
                                                  rw % parts, rw / parts, 5, !(GATE_UP && once));
      }
      PHASE_MARK(3);
      if constexpr (!GATE_UP) {
        if (has_sh && once) walk_shared(std::false_type{}, Role2{});
        else if (has_sh) walk_shared(std::false_type{}, Role0{});
      }
      PHASE_MARK(4);
      PHASE_RECORD("expert_ring", GATE_UP ? 1 : 0);
      BLOCK_STAMPS_END("expert_ring");
      return;
    }
  }
  if constexpr (!MMA_ONLY) {  // the FMA walks (MMA_ONLY: unreachable, see above)
    const int64_t per_slot = GATE_UP ? (a.I + kHalf - 1) / kHalf : (a.d + kRingR - 1) / kRingR, ntiles = per_slot * k;
    auto tile_at = [&](int64_t t, RingTile<kRingR>& T) {
      const int j = static_cast<int>(t / per_slot);
      const int64_t rt = t - j * per_slot;
      const DevExpert& E = ex[j];
      if (GATE_UP) {
        const WRow W1{E.w1, E.s1, E.g1, a.d, a.sb1, blk}, W3{E.w3, E.s3, E.g3, a.d, a.sb1, blk};
#pragma unroll
        for (int jj = 0; jj < kHalf; ++jj) {
          const int64_t r = min(kHalf * rt + jj, rows - 1), rb = r * row_bytes<F>(a.d);
          T.wp[2 * jj] = static_cast<const uint8_t*>(E.w1) + rb, T.wp[2 * jj + 1] = static_cast<const uint8_t*>(E.w3) + rb;
          T.sp[2 * jj] = scale_row<F>(W1, r), T.sp[2 * jj + 1] = scale_row<F>(W3, r);
          T.gs[2 * jj] = E.g1, T.gs[2 * jj + 1] = E.g3;
        }
        T.xs = xs;
      } else {
        const WRow W2{E.w2, E.s2, E.g2, a.I, a.sb2, blk};
#pragma unroll
        for (int r = 0; r < kRingR; ++r) {
          const int64_t rr = min(rt * kRingR + r, rows - 1);
          T.wp[r] = static_cast<const uint8_t*>(E.w2) + rr * row_bytes<F>(a.I);
          T.sp[r] = scale_row<F>(W2, rr);
          T.gs[r] = E.g2;
        }
        T.xs = xs + static_cast<int64_t>(j) * a.I;
      }
    };
    auto flush = [&](int64_t t, float (&acc)[kRingR]) {
#pragma unroll
      for (int r = 0; r < kRingR; ++r) acc[r] = warp_sum(acc[r]);
      if (lane != 0) return;
      const int j = static_cast<int>(t / per_slot);
      const int64_t rt = t - j * per_slot;
      if (GATE_UP) {
#pragma unroll
        for (int jj = 0; jj < kHalf; ++jj) {
          const int64_t r = kHalf * rt + jj;
          if (r < rows) expert_store_act(a, j, r, acc[2 * jj], acc[2 * jj + 1], a.wts ? a.wts[j] : 1.0f);
        }
      } else {
#pragma unroll
        for (int r = 0; r < kRingR; ++r)
          if (rt * kRingR + r < rows) expert_store_y(a, j, rt * kRingR + r, acc[r]);
      }
    };
    ring_walk<F, kRingR, C::S, !GATE_UP>(gw, nw, ntiles, K / Chunk<F>::CW, blk, smem + warp * C::WarpBytes, tile_at, flush, [&] {
      if (GATE_UP) {
        stage_x<F>(a.x, a.d, xs, a.qa8_x);
      } else {
        for (int j = 0; j < k; ++j)
          stage_x<F>(a.act_q + static_cast<int64_t>(j) * a.I, a.I, xs + static_cast<int64_t>(j) * a.I, a.qa8_act);
      }
    });
    if constexpr (!GATE_UP)
      if (has_sh) walk_shared(std::false_type{}, Role0{});
  }
}
