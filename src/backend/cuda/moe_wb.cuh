// Prefill routed MXFP4 experts on BF16 warpgroup MMAs with every scale folded into the operands (expert_wb): the
// grouped prefill kernel of official numerics where K / 128 is a multiple of kWgGroup (DSV4_MOE_WG=5 .. 14,
// set_moe_wg; by default 13: four warpgroups x 128 slots with bulk-copied activations, m64n64 wgmmas on tiles of
// <= 64 slots). Measured (docs/BENCHMARKS.md, session 17; one H200, 20 Flash layers): 8K prompt routed gate/up 210.6
// -> 114.6 ms, down 122.6 -> 67.1 vs expert_wg kTwo (mode 9); 2K 74.5 -> 43.0, 40.6 -> 24.2; session 18, mode 13:
// 8K 112.4 / 66.1, 2K 40.2 / 22.9.
//
// Why (ncu, session 17, expert_wg kTwo gate/up of one Flash layer at 8K: 10.6 ms, 156 TFLOP/s of the ~990 the f16 /
// BF16 tensor cores do): ~440 instructions per warp and 128-column step, of which the f16 range fold (wg_fold: ~100)
// and the per-step promotion (acc += D x row factor x slot scale: 32 FMUL + 32 FFMA + 16 LDS, after waiting for the
// step's wgmmas) are the part this kernel removes; the issue slots (not the tensor cores) bound expert_wg.
//
// Arithmetic: both operands are exact BF16 values, so every product is exact in the fp32 accumulators and the
// kernel is the reference's function up to fp32 summation order (like expert_wg / expert_f8):
// - activations: moe_gather_wb_kernel writes each grouped slot's QA8 value q x s (an E4M3 value times a power of two:
//   <= 4 significant bits, exponents far inside BF16's range) as BF16 -- the activation scale needs no promotion;
// - weights: an E2M1 nibble placed in BF16 bits is its value x 2^-126 (e2m1_word_bf16: 0.5 is the subnormal 2^-127),
//   times F_c = 2^(e_c - base) for the row's 32-column chunk c with E8M0 scale e_c (one bf16x2 multiply per register:
//   exact). base is per ROW over all of K (the prologue reads the row's scale bytes): base = max(1, max_c e_c - 127),
//   so F_c <= 2^127 always; the result is the weight x 2^(1 - base), and the epilogue multiplies the row by 2^(base - 1)
//   (1 for any scale <= 2^1, i.e. for every checkpoint we know of). Only a chunk more than ~253 binades below its
//   row's largest would lose its products (F_c = 0): impossible with E8M0 bytes 0..254 unless the row holds both 0
//   and 254.
// One accumulator set for the whole K (no per-step promotion), so the wgmmas of a step only have to finish before
// their A registers are rebuilt: kDbl false waits after each step (the stage barrier and next loads overlap it; two
// blocks per SM overlap the rest), kDbl true builds the next step's A registers into a second set while the step's
// wgmmas run (groups of kWgGroup steps: ptxas serialises wgmmas in flight across a loop back edge).
// Operands as staged: expert_wg's layouts (moe_wg.cuh), the f16 codes replaced by the BF16 values, no slot scales.
// Included INSIDE kernels.cu's anonymous namespace after attend_wg.cuh (WgaDesc) and moe_wg.cuh.
#pragma once

// A stage of a block of kWG warpgroups (64 kWG weight rows) and kSlots slots: FP4 weights (64 bytes per row), the
// rows' scale words, the slots' BF16 values (kSlots x 128 x 2 bytes).
constexpr int wb_stage_bytes(int wgs, int slots) { return 64 * wgs * (64 + 4) + slots * kF8K * 2; }
constexpr int kWbStages = 4;
constexpr size_t wb_smem_bytes(int wgs, int slots) { return size_t{kWbStages} * wb_stage_bytes(wgs, slots) + 64 * wgs * 4 + kWbStages * 16; }

// The scratch: BF16 values [slots][K] (K permuted as expert_wg's codes), then the work list.
__host__ __device__ inline int64_t wb_tiles_offset(int64_t nk, int64_t K) { return (nk * K * 2 + 15) / 16 * 16; }
__host__ __device__ inline int64_t wb_scratch_bytes(int64_t nk, int64_t K, int E) { return wb_tiles_offset(nk, K) + 4 * (f8_max_tiles(nk, E) + 1); }

// BF16 QA8 values of the grouped slots' rows in expert_wg's order (wg_kpos).
__global__ void moe_gather_wb_kernel(const float* src, int64_t K, const int32_t* perm, const int32_t* end, int div,
                                     int64_t nk, uint8_t* xg) {
  pdl_wait();
  int64_t p, b;
  float q[4], s;
  if (!gather_qa8_block(src, K, perm, end, div, p, b, q, s)) return;
  const int lane = threadIdx.x & 31;
  uint16_t* row = reinterpret_cast<uint16_t*>(xg) + p * K + b * 128 + (lane >> 3) * 32;
  const int a0 = 4 * (lane & 7);
#pragma unroll
  for (int i = 0; i < 4; ++i) row[wg_kpos(a0 + i)] = __bfloat16_as_ushort(__float2bfloat16_rn(q[i] * s));  // exact
}

// kBulk (DSV4_MOE_WG=9 / 10): the slots' BF16 values as per-tile shared-memory IMAGES in the scratch, so that one
// thread brings a stage's B operand in with bulk copies (cp.async.bulk, completion on an mbarrier) instead of every
// thread issuing 16-byte cp.asyncs. Why (ncu, session 17, mode 8): 36 % of the warp stalls were long-scoreboard
// waits on the registers of queued cp.asyncs and 18 % the stage barrier behind them, with the L2 at 53 %.
// Image (tile T, step ks) at wbt_image(T, ks): kSlots x 128 BF16 in the stage layout ([16-byte k-block][8-slot
// block][slot][8 values], k permuted as wg_kpos); then the work list (f8_max_tiles<kSlots>-sized) and each expert's
// first work-list entry.
template <int kSlots>
__host__ __device__ inline int64_t wbt_max_tiles(int64_t nk, int E) { return (nk + kSlots - 1) / kSlots + E; }
template <int kSlots>
__host__ __device__ inline int64_t wbt_tiles_offset(int64_t nk, int64_t K, int E) { return wbt_max_tiles<kSlots>(nk, E) * (K / 128) * kSlots * 256; }
template <int kSlots>
__host__ __device__ inline int64_t wbt_scratch_bytes(int64_t nk, int64_t K, int E) {
  return wbt_tiles_offset<kSlots>(nk, K, E) + 4 * (wbt_max_tiles<kSlots>(nk, E) + 1) + 4 * (E + 1);
}

// moe_f8_tiles_kernel's work list (tiles[max] = count) plus first[e] = the index of expert e's first entry.
template <int kSlots>
__global__ void moe_wbt_tiles_kernel(const int32_t* offsets, int E, int64_t max, int32_t* tiles, int32_t* first) {
  f8_tiles<kSlots, true>(offsets, E, max, tiles, first);
}

// The images: warp (slot p, 128-column block b) writes its 128 values into image (T, b) of p's tile T, at p's place
// in it. Slots past an expert's last tile's end are never written (their columns of D are never stored).
template <int kSlots>
__global__ void moe_gather_wbt_kernel(const float* src, int64_t K, const int32_t* perm, const int32_t* offsets, int E,
                                      int div, uint8_t* xg) {
  pdl_wait();
  int64_t p, b;
  float q[4], s;
  if (!gather_qa8_block(src, K, perm, offsets + E, div, p, b, q, s)) return;
  int lo = 0, hi = E - 1;  // the last expert whose slots start at or before p (empty experts share its offset)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (offsets[mid] <= p) lo = mid;
    else hi = mid - 1;
  }
  const int64_t nk = offsets[E];
  const int32_t* first = reinterpret_cast<const int32_t*>(xg + wbt_tiles_offset<kSlots>(nk, K, E)) + wbt_max_tiles<kSlots>(nk, E) + 1;
  const int rel = static_cast<int>(p - offsets[lo]), pos = rel % kSlots;
  const int64_t T = first[lo] + rel / kSlots;
  uint8_t* im = xg + (T * (K / 128) + b) * (kSlots * 256) + (pos >> 3) * 128 + (pos & 7) * 16;
  const int lane = threadIdx.x & 31;
  // The 128 values into the warp's 256 bytes of shared memory in stored order first, then lane l stores stored positions
  // 4 l .. 4 l + 3 (half of 8-column chunk l / 2) to the image with one 8-byte store: the values' scattered 2-byte
  // global stores ran this kernel at ~1.5 TB/s (ncu, one H200, 8K Flash prefill: 586 us per gate/up gather).
  __shared__ __align__(16) uint16_t st[8][128];
  uint16_t* w = st[threadIdx.x >> 5];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[32 * (lane >> 3) + wg_kpos(4 * (lane & 7) + i)] = __bfloat16_as_ushort(__float2bfloat16_rn(q[i] * s));  // exact
  __syncwarp();
  *reinterpret_cast<uint2*>(im + (lane >> 1) * (kSlots / 8 * 128) + (lane & 1) * 8) = reinterpret_cast<const uint2*>(w)[lane];
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}
// The same bytes into this shared-memory offset of every CTA of the cluster in mask, each CTA's mbarrier at bar's
// offset taking the completion.
__device__ __forceinline__ void bulk_copy_mc(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint16_t mask) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "h"(mask) : "memory");
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

// e2m1_word_f16's registers as BF16 values x 2^-126: the sign stays at bit 15, the three magnitude bits move from
// 11..9 (f16 exponent low bits + mantissa top) to 8..6 (BF16's), per half.
__device__ __forceinline__ void e2m1_word_bf16(uint32_t w, uint32_t (&r)[4]) {
  e2m1_word_f16(w, r);
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = (r[j] | (r[j] >> 3)) & 0x81C081C0u;
}
__device__ __forceinline__ uint32_t bmul2_bits(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));  // exact here: a power-of-two factor, no overflow
  return r;
}
// D += A x B: m64nNk16 (N = 64 or 128: 32 or 64 accumulators), BF16 operands, A from registers (this warp's 16
// rows), B by descriptor.
template <int NACC>
__device__ __forceinline__ void wgmma_bf16_ra(float (&d)[NACC], const uint32_t (&a)[4], uint64_t bdesc) {
  static_assert(NACC == 32 || NACC == 64, "m64n64 or m64n128");
  if constexpr (NACC == 32) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DSV4_WGA_D32_REGS ", {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"
                 : DSV4_WGA_D32_RW
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"
        "%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,"
        "%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  }
}

// grid (ceil(R / (GATE_UP ? 32 kWG : 64 kWG)), f8_max_tiles), 128 kWG threads (kWG warpgroups, 4 kWG warps of 16
// rows; tile 64 kWG weight rows x kSlots slots, rows as expert_wg), wb_smem_bytes(kWG, kSlots) of dynamic shared
// memory. Why wider blocks (ncu, session 17: expert_wb at kWG 2 / 64 slots ran L2-bound, 70 % of the L2's throughput,
// IPC 0.95): every block reads its slot tile's activations (kSlots x K BF16) and its row tile's weights, so the L2
// traffic per FLOP falls with both tile sides -- 4 warpgroups halve the activation reads, 128 slots the weight reads.
// kPair (DSV4_MOE_WG=11, with kBulk): clusters of two blocks, neighbouring row tiles of the same slot tile; each
// block bulk-copies half of a stage's B image into both (multicast), so the L2 serves each tile's activations once
// per pair; the stage barrier becomes a cluster barrier (a slot is refilled only when both blocks are done with it).
// The grid's x is even (a block past R recomputes the last rows and stores nothing).
// kWgSync (DSV4_MOE_WG=12, with kBulk): no block-wide barrier per step (ncu, mode 9: 23 % of the stall samples at
// it). Each warpgroup copies its own 64 weight rows and their scale words and syncs with a named barrier of its 128
// threads; the shared B slot is refilled only when every warpgroup has arrived on the slot's "empty" mbarrier (after
// waiting for its wgmmas of that step), which warp 0 waits for before the bulk copies. Measured no faster (session
// 17, 8 Flash layers at 8K: gate/up 46.8 vs 46.8 ms, down 27.0 vs 27.3): the warps at the barrier were waiting for
// data, not for the barrier.
// kNarrow (DSV4_MOE_WG=13, with 128-slot tiles; compiled only, session 17): a tile of <= 64 slots (an expert's last,
// partial tile: at an 8K Flash prompt ~192 slots per expert, so about every other tile) runs m64n64 wgmmas on the
// first half of the accumulators instead of m64n128 on zeros-and-garbage columns -- half the tensor work and a
// shorter wgmma wait per step there. The n64 accumulator fragment is the n128 one's first 32 registers (8-column
// blocks in order) and its B the first 8 of the tile's 16 slot blocks: the same descriptor.
// kWG 3 with kDbl (DSV4_MOE_WG=14, 128-slot tiles, bulk B; compiled only, session 17): each warpgroup converts the
// next step's weights into its second A register set while its wgmmas run (mode 9's warpgroups wait for their
// wgmmas before converting: ~41 % tensor, ~36 % issue utilisation); the registers that takes leave room for three
// warpgroups (192 weight rows) per SM instead of four.
template <bool GATE_UP, bool kDbl, int kWG, int kSlots, bool kBulk = false, bool kPair = false, bool kWgSync = false,
          bool kNarrow = false>
__global__ void __launch_bounds__(128 * kWG, kWG == 2 ? 2 : 1) expert_wb(ExpertArgs a, const uint8_t* xg) {
  static_assert(!kNarrow || (kSlots == 128 && !kDbl && !kWgSync), "narrow tail tiles: 128-slot tiles, one A set");
  static_assert(!kPair || kBulk, "pairs multicast the bulk copies");
  static_assert(!kWgSync || (kBulk && !kPair && !kDbl), "per-warpgroup sync: bulk B, one block, one A set");
  static_assert((kWG == 2 || kWG == 4 || (kWG == 3 && kBulk)) && (kSlots == 64 || kSlots == 128),
                "2 or 4 warpgroups (3 with bulk-copied B), 64 or 128 slots");
  // Two A register sets at 128 slots: 64 accumulators + 64 A registers, ~160 registers: three warpgroups (384 threads).
  static_assert(!kDbl || kSlots == 64 || kWG == 3, "two A register sets: 64-slot tiles, or 128 with three warpgroups");
  constexpr int kS = kWbStages, kRows = 64 * kWG, kThreads = 128 * kWG, kLbo = kSlots / 8 * 128, kAcc = kSlots / 2;
  constexpr int kABytes = kRows * 64, kBOff = kABytes + kRows * 4, kStage = wb_stage_bytes(kWG, kSlots);
  constexpr int kTps = kThreads / kSlots, kKbPer = 16 / kTps;  // threads per slot's values, 16-byte k-blocks per thread
  static_assert(kBulk || (kThreads % kSlots == 0 && 16 % kTps == 0), "the per-thread B copies cover every k-block");
  pdl_wait();
  extern __shared__ __align__(1024) uint8_t smem[];
  uint32_t* row_k = reinterpret_cast<uint32_t*>(smem + kS * kStage);  // [kRows]: (127 - base) x 0x00800080
  uint64_t* full = reinterpret_cast<uint64_t*>(row_k + kRows);        // [kS] kBulk: a stage's B has landed
  uint64_t* empty = full + kS;                                        // [kS] kWgSync: every warpgroup is done with it
  const int64_t K = GATE_UP ? a.d : a.I, R = GATE_UP ? a.I : a.d, nk = static_cast<int64_t>(a.n) * a.k;
  int e, ns;
  int32_t s0;
  const int64_t tiles_off = kBulk ? wbt_tiles_offset<kSlots>(nk, K, a.E) : wb_tiles_offset(nk, K);
  const int64_t max_tiles = kBulk ? wbt_max_tiles<kSlots>(nk, a.E) : f8_max_tiles(nk, a.E);
  if (!f8_tile<kSlots>(reinterpret_cast<const int32_t*>(xg + tiles_off), max_tiles, a.offsets, e, s0, ns)) return;
  const DevExpert E = a.table[e];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (GATE_UP ? kRows / 2 : kRows);
  const uint16_t* xc = reinterpret_cast<const uint16_t*>(xg);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  auto wrow = [&](int tr, const uint8_t*& w, const uint8_t*& s) { wg_tile_row<GATE_UP>(E, a, K, R, r0, tr, w, s); };
  // Copies per stage: weights row tid / 2, chunks 2 (tid % 2) and + 1; the scale word of row tid (tid < kRows); slot
  // tid / kTps's values, 16-byte k-blocks kKbPer (tid % kTps) .. + kKbPer - 1 (zero-filled past the tile's slots).
  const int a_row = tid >> 1, a_c0 = 2 * (tid & 1);
  const uint8_t *a_src, *a_scl;
  wrow(a_row, a_src, a_scl);
  const uint8_t* s_src = nullptr;
  if (tid < kRows) {
    const uint8_t* unused;
    wrow(tid, unused, s_src);
  }
  const int b_slot = tid / kTps, b_kb0 = kKbPer * (tid % kTps);
  const bool b_ok = b_slot < ns;
  const uint16_t* b_src = xc + static_cast<int64_t>(s0 + min(b_slot, ns - 1)) * K;
  const int nks = static_cast<int>(K / kF8K);
  auto stage = [&](int ks) { return smem + (ks % kS) * kStage; };
  auto issue = [&](int ks) {
    uint8_t* st = stage(ks);
    if (ks < nks) {
      const uint8_t* w = a_src + static_cast<int64_t>(ks) * (kF8K / 2);
      f8_copy_weights(st, a_row, a_c0, w);
      if constexpr (kWgSync) {
        if ((tid & 1) == 0) cp_async4(st + kABytes + 4 * a_row, a_scl + 4 * ks);  // this warpgroup's rows only
      } else {
        if (tid < kRows) cp_async4(st + kABytes + 4 * tid, s_src + 4 * ks);
      }
      uint8_t* bst = st + kBOff;
      if constexpr (kBulk) {
        // Warp 0: the image's first ceil(ns / 8) 8-slot blocks of each of the 16 k-blocks, one bulk copy per lane.
        if (warp == 0) {
          const uint32_t nb_bytes = static_cast<uint32_t>((ns + 7) / 8) * 128;
          if (lane == 0) mbar_expect_tx(&full[ks % kS], 16 * nb_bytes);
          __syncwarp();
          const uint8_t* img = xg + (static_cast<int64_t>(blockIdx.y) * nks + ks) * (kSlots * 256);
          if constexpr (kPair) {  // k-blocks 8 rank .. + 7 into both blocks
            const int kbk = 8 * static_cast<int>(cluster_rank()) + lane;
            if (lane < 8) bulk_copy_mc(bst + kbk * kLbo, img + kbk * kLbo, nb_bytes, &full[ks % kS], 0x3);
          } else {
            if (lane < 16) bulk_copy(bst + lane * kLbo, img + lane * kLbo, nb_bytes, &full[ks % kS]);
          }
        }
      } else {
#pragma unroll
      for (int i = 0; i < kKbPer; ++i) {
        const int kbk = b_kb0 + i;
        cp_async16_zfill(bst + kbk * kLbo + (b_slot >> 3) * 128 + (b_slot & 7) * 16, b_src + static_cast<int64_t>(ks) * kF8K + 8 * kbk, b_ok);
      }
      }
    }
    cp_async_commit();
  };
  if constexpr (kBulk) {
    if (tid == 0) {
      for (int i = 0; i < kS; ++i) mbar_init(&full[i], 1);
      if constexpr (kWgSync)
        for (int i = 0; i < kS; ++i) mbar_init(&empty[i], kWG);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the bulk copies' complete_tx
    }
    if constexpr (kPair) cluster_sync_all();  // the pair's barriers are initialised before either multicasts
    else __syncthreads();
  }
#pragma unroll
  for (int p = 0; p < kS - 1; ++p) issue(p);
  // While those land: each tile row's base from its K / 32 scale bytes (two threads per row, words 2 i + (tid % 2)).
  {
    const uint32_t* sw = reinterpret_cast<const uint32_t*>(a_scl);
    uint32_t m = 0;
    for (int i = tid & 1; i < static_cast<int>(K / 128); i += 2) m = __vmaxu4(m, __ldg(sw + i));
    m = max(max(m & 0xFF, (m >> 8) & 0xFF), max((m >> 16) & 0xFF, m >> 24));
    m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
    const int base = max(1, static_cast<int>(m) - 127);
    if ((tid & 1) == 0) row_k[a_row] = static_cast<uint32_t>(127 - base) * 0x00800080u;
  }
  cp_async_wait<kS - 2>();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async writes -> the wgmma (async proxy) reads
  __syncthreads();  // stage 0 has landed for every thread; row_k is written
  const int mrow = 16 * warp;
  const uint32_t k0 = row_k[mrow + g], k8 = row_k[mrow + g + 8];
  const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lch = lane >> 4;
  // A step's A registers: the lane's FP4 words of rows g and g + 8 as BF16 x 2^-126, times F_c of their chunks.
  auto build_a = [&](const uint8_t* st, uint32_t (&av)[4][2][4]) {
    const uint32_t w0 = *reinterpret_cast<const uint32_t*>(st + kABytes + 4 * (mrow + g));
    const uint32_t w8 = *reinterpret_cast<const uint32_t*>(st + kABytes + 4 * (mrow + g + 8));
#pragma unroll
    for (int cp = 0; cp < 2; ++cp) {
      uint32_t w[4];
      const int r = mrow + lrow, ch = 2 * cp + lch;
      ldmatrix_x4(w, st + f8_wchunk(r, ch));
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int c = 2 * cp + h2;
        // F_c for both rows: [e_c, 0, e_c, 0] + (127 - base) per half, shifted into the BF16 exponent field.
        const uint32_t sel = 0x4040u | (0x0101u * c);
        const uint32_t f0 = __byte_perm(w0, 0u, sel) * 128u + k0, f8 = __byte_perm(w8, 0u, sel) * 128u + k8;
        uint32_t r0v[4], r8v[4];
        e2m1_word_bf16(w[2 * h2], r0v);
        e2m1_word_bf16(w[2 * h2 + 1], r8v);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          av[c][j / 2][2 * (j % 2)] = bmul2_bits(r0v[j], f0), av[c][j / 2][2 * (j % 2) + 1] = bmul2_bits(r8v[j], f8);
      }
    }
  };
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  // A step's 8 wgmmas (k16 steps 2c + h of the 4 chunks) on the stage's B; Narrow (std::true_type): m64n64 on the
  // first half of the accumulators (kNarrow's tiles of <= 64 slots).
  auto mma_step = [&](int ks, const uint32_t (&av)[4][2][4], auto Narrow) {
    const WgaDesc bd = wga_desc(stage(ks) + kBOff, kLbo, 128);
    if constexpr (kBulk) mbar_wait(&full[ks % kS], static_cast<uint32_t>(ks / kS) & 1);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");  // the A registers were written
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (decltype(Narrow)::value) wgmma_bf16_ra(*reinterpret_cast<float(*)[32]>(acc), av[c][h], wga_at(bd, (4 * c + 2 * h) * kLbo));
        else wgmma_bf16_ra(acc, av[c][h], wga_at(bd, (4 * c + 2 * h) * kLbo));
      }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  };
  auto next_stage = [&](int ks) {  // stage ks + 1 landed for every thread, stage ks - 1's slot refilled
    cp_async_wait<kS - 3>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    // Stage ks - 1 is no longer read (its wgmmas were waited for, its A registers built) -- by either block of a pair.
    if constexpr (kPair) {
      cluster_sync_all();
    } else if constexpr (kWgSync) {
      // This warpgroup's copies of stage ks + 1 have landed and it no longer reads its rows of stage ks - 1; warp 0
      // (which refills the shared B) waits until every warpgroup is done with stage ks - 1.
      asm volatile("bar.sync %0, 128;" ::"r"(1 + (tid >> 7)) : "memory");
      if (warp == 0 && ks >= 1 && ks + kS - 1 < nks) mbar_wait(&empty[(ks - 1) % kS], static_cast<uint32_t>((ks - 1) / kS) & 1);
    } else {
      __syncthreads();
    }
    issue(ks + kS - 1);
  };
  if constexpr (!kDbl) {
    uint32_t av[4][2][4];
    build_a(stage(0), av);
    auto run = [&](auto Narrow) {
      for (int ks = 0; ks < nks; ++ks) {
        mma_step(ks, av, Narrow);
        next_stage(ks);  // while the wgmmas run
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        if constexpr (kWgSync) {
          if ((tid & 127) == 0) mbar_arrive(&empty[ks % kS]);  // this warpgroup is done with stage ks's B
        }
        build_a(stage(ks + 1), av);  // past the last step: a stale stage, never used
      }
    };
    if constexpr (kNarrow) {  // the wgmma width chosen once per block
      if (ns <= 64) run(std::true_type{});
      else run(std::false_type{});
    } else {
      run(std::false_type{});
    }
  } else {
    uint32_t av[2][4][2][4];
    build_a(stage(0), av[0]);
    auto step = [&](auto J, int ks) {
      constexpr int j = decltype(J)::value, b = j & 1, o = 1 - b;
      mma_step(ks, av[b], std::false_type{});
      if constexpr (j > 0) asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // step ks - 1's: av[o] free
      next_stage(ks);
      build_a(stage(ks + 1), av[o]);
    };
    static_assert(kWgGroup == 4, "groups of 4 steps");
    for (int ks = 0; ks < nks; ks += kWgGroup) {
      step(std::integral_constant<int, 0>{}, ks);
      step(std::integral_constant<int, 1>{}, ks + 1);
      step(std::integral_constant<int, 2>{}, ks + 2);
      step(std::integral_constant<int, 3>{}, ks + 3);
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
  }
  wg_fence_acc(acc);
  cp_async_wait<0>();
  if constexpr (kPair) cluster_sync_all();  // neither block leaves while its pair may still write into it
  // Epilogue: the rows times 2^(base - 1).
  const float rf0 = __uint_as_float((253u - (k0 >> 7 & 0xFF)) << 23), rf8 = __uint_as_float((253u - (k8 >> 7 & 0xFF)) << 23);
  wg_store_tile<GATE_UP, kSlots>(a, acc, s0, ns, r0, R, warp, mrow, g, t, rf0, rf8);
}
