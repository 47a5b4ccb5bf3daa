// Prefill routed MXFP4 experts on warpgroup MMAs (wgmma, f16 operands, fp32 accumulation): the grouped prefill kernel
// of official numerics where K / 128 is a multiple of kWgGroup, in place of expert_f8 (moe_f8.cuh) as
// moe_wg_effective() chooses (by default the two-blocks-per-SM variant for gate/up, and for down from 96 slots per
// expert; DSV4_MOE_WG / set_moe_wg force a variant). Measured (session 15, one H200, 20 Flash layers, an 8K prompt in
// one chunk): routed gate/up 239 -> 210.8 ms, down 129.4 -> 122.4 vs expert_f8; 2K prompt gate/up 76.1 -> 74.6, down
// 40.6 -> 45.2 (so down keeps expert_f8 there).
//
// v1 (session 14, docs/BENCHMARKS.md; one H200, 20 Flash layers, one 2,048-token chunk): correct (vs expert_tc2
// unrounded rel L2 <= 1.34e-6, as expert_f8) but SLOWER than expert_f8: gate/up 85.4-87.5 ms vs 75.8-76.2, down
// 50.1-50.5 vs 40.5-40.7. Per 128-column step it ran 4 accumulator sets (one per 32-column scale), waited for all its
// wgmmas (wait_group 0), then did ~160 FMAs of scaling before building the next A registers: tensor cores and the
// other pipes took turns. v2 (session 15): the weight scales folded into the A operands (wg_fold), one accumulator
// set per step, promotion overlapped with the next step's wgmmas -- no faster; its two-blocks-per-SM variant (kTwo,
// the default) is what helped -- see the kernel.
//
// Why: expert_f8's m16n8k32 E4M3 mma.sync is not native on sm_90a (ptxas: F2FP unpacks + two f16 HMMAs per MMA), so
// it issues ~25 instructions per MMA and ran at ~150 TFLOP/s (ncu: 51 % issue slots busy). wgmma is Hopper's native
// tensor-core path: one m64n64k16 instruction per warpgroup does 32x the work of an m16n8k16, with B read from shared
// memory by descriptor. f16 rather than E4M3 operands: f16 wgmma accumulates in proper fp32 (the FP8 one through a
// ~14-bit block adder, rel L2 8.4e-5 in tools/gpu/probes/fp4_wgmma_probe.cu), E2M1 -> f16 is as cheap as E2M1 -> E4M3,
// and the QA8 activation codes (E4M3 values) are exact in f16. Half the FP8 rate still leaves the kernel
// tensor-bound on paper (per 128-column step and warpgroup: 256 tensor cycles vs ~230 issue cycles).
//
// Arithmetic: a row's E2M1 values of 32-column chunk c become f16 value x 2^-14 x 2^(e_c - base) (wg_fold: exact
// while the row's four chunk scales e_c of the step span <= 15 binades), so the step's 8 k16 wgmmas sum exact f16 x
// f16 products in fp32 into one accumulator set D; then acc += D x 2^(base - 127) x 2^14 x the slot's activation
// scale. The same exact products as expert_f8 (which scales per 32-column chunk), another fp32 summation order.
//
// Operands as staged:
// - x: moe_gather_f16_kernel writes each grouped slot's QA8 codes as f16 [slots][K] with K permuted inside every
//   32-column block so that the A registers below line up (stored position p = 16 h + 8 o + 2 t + j holds actual
//   column 8 t + 4 h + o + 2 j: k16 step h of the block, A register 2 h + o, its half j), then the per-128 scales
//   [slots][K / 128] fp32, then expert_f8's work list. In a stage: core matrices of 8 slots x 8 k (16 bytes per slot)
//   at [k-block kb][slot-block nb] (kb stride 1024 B = LBO, nb stride 128 B = SBO; no swizzle).
// - weights: expert_f8's stage layout (raw FP4 rows, 64 bytes per row and 128-column step, ldmatrix'ed) and each row's
//   four E8M0 bytes of the step. Lane (g, t) gets FP4 word t (columns 8t..8t+7 of a 32-block) of rows g and g + 8;
//   e2m1_word_f16 makes register 2 h + o from nibbles 4 h + o and 4 h + o + 2 (columns 8t + 4h + o, + 2).
// Block: 256 threads = 2 warpgroups = 8 warps of 16 rows; tile 128 weight rows x 64 slots. A warp's rows g and g + 8
// are, for gate/up, w1 and w3 of the same intermediate row (SwiGLU in the thread), for down two rows of w2.
// Included INSIDE kernels.cu's anonymous namespace after moe_f8.cuh (work list, stage layout constants).
#pragma once

// A stage of kSlots slots: FP4 weights, their scale words, the slots' f16 codes (16 KB at 64 slots), their scales.
constexpr int wg_b_bytes(int slots) { return slots * kF8K * 2; }
constexpr int wg_stage_bytes(int slots) { return kF8ABytes + kF8Rows * 4 + wg_b_bytes(slots) + slots * 4; }
constexpr int kWgBBytes = wg_b_bytes(kF8Slots);
constexpr int kWgStageBytes = wg_stage_bytes(kF8Slots);
constexpr int kWgGroup = 4;  // 128-column steps per unrolled group of the main loop (expert_wg); must divide K / 128

// The scratch as this kernel uses it (f16 codes, scales, work list), and its size.
__host__ __device__ inline int64_t wg_tiles_offset(int64_t nk, int64_t K) { return (nk * K * 2 + nk * (K / 128) * 4 + 15) / 16 * 16; }
__host__ __device__ inline int64_t wg_scratch_bytes(int64_t nk, int64_t K, int E) { return wg_tiles_offset(nk, K) + 4 * (f8_max_tiles(nk, E) + 1); }
__device__ __forceinline__ float* wg_xscales(uint8_t* xg, int64_t nk, int64_t K) { return reinterpret_cast<float*>(xg + nk * K * 2); }

// Stored position of actual column a (0..31) of a 32-column block (see above).
__host__ __device__ constexpr int wg_kpos(int a) {
  return 16 * ((a % 8) / 4) + 8 * (a % 2) + 2 * (a / 8) + (a % 8) / 2 % 2;
}

// f16 codes of the grouped slots' rows in expert_wg's order (see above) and their scales (gather_qa8_block:
// moe_f8.cuh).
__global__ void moe_gather_f16_kernel(const float* src, int64_t K, const int32_t* perm, const int32_t* end, int div,
                                      int64_t nk, uint8_t* xg) {
  pdl_wait();
  int64_t p, b;
  float q[4], s;
  if (!gather_qa8_block(src, K, perm, end, div, p, b, q, s)) return;
  const int lane = threadIdx.x & 31;
  uint16_t* row = reinterpret_cast<uint16_t*>(xg) + p * K + b * 128 + (lane >> 3) * 32;
  const int a0 = 4 * (lane & 7);  // actual columns a0 .. a0 + 3 of the lane's 32-block
#pragma unroll
  for (int i = 0; i < 4; ++i) row[wg_kpos(a0 + i)] = __half_as_ushort(__float2half_rn(q[i]));
  if (lane == 0) wg_xscales(xg, nk, K)[p * (K / 128) + b] = s;
}

// The 8 E2M1 nibbles of w as f16 values x 2^-14 (an f16 whose low byte is 0 and whose high byte is the nibble's sign
// bit, then its 3 magnitude bits, then a 0): r[2 h + o] = nibbles 4 h + o (low half) and 4 h + o + 2 (high half).
// Nibbles 2 apart sit in neighbouring bytes, so the even and the odd nibbles each become 4 high bytes at once and a
// byte permute per register spreads them (11 instructions per word; a per-register shift-and-mask took 16).
__device__ __forceinline__ void e2m1_word_f16(uint32_t w, uint32_t (&r)[4]) {
  const uint32_t xe = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0E0E0E0Eu);  // nibbles 0, 2, 4, 6
  const uint32_t xo = (w & 0x80808080u) | ((w >> 3) & 0x0E0E0E0Eu);         // nibbles 1, 3, 5, 7
  r[0] = __byte_perm(xe, 0u, 0x1404);  // [0, xe byte 0, 0, xe byte 1]: nibbles 0, 2
  r[1] = __byte_perm(xo, 0u, 0x1404);  // 1, 3
  r[2] = __byte_perm(xe, 0u, 0x3424);  // 4, 6
  r[3] = __byte_perm(xo, 0u, 0x3424);  // 5, 7
}
// Shared-memory matrix descriptor (sm_90): start >> 4, LBO >> 4 (bits 16..29), SBO >> 4 (bits 32..45), no swizzle.
__device__ __forceinline__ uint64_t wg_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return ((a & 0x3FFFF) >> 4) | (uint64_t{lbo >> 4} << 16) | (uint64_t{sbo >> 4} << 32);
}
// D (+)= A x B: m64n64k16, f16 operands, fp32 accumulators; A from registers (this warp's 16 rows), B by descriptor.
// ACC false: D = A x B (scale-d 0: D's old value is not read, so it is a write-only operand here).
#define DSV4_WG_D32(c)                                                                                                \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), c(d[8]), c(d[9]), c(d[10]), c(d[11]),     \
      c(d[12]), c(d[13]), c(d[14]), c(d[15]), c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]),   \
      c(d[23]), c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31])
#define DSV4_WG_D64(c)                                                                                                \
  DSV4_WG_D32(c), c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]), c(d[37]), c(d[38]), c(d[39]), c(d[40]),          \
      c(d[41]), c(d[42]), c(d[43]), c(d[44]), c(d[45]), c(d[46]), c(d[47]), c(d[48]), c(d[49]), c(d[50]), c(d[51]),   \
      c(d[52]), c(d[53]), c(d[54]), c(d[55]), c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]),   \
      c(d[63])
#define DSV4_WG_REGS32 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define DSV4_WG_REGS64                                                                                                \
  DSV4_WG_REGS32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,"  \
                 "%56,%57,%58,%59,%60,%61,%62,%63"
// regs: the accumulators; ab: A's four registers and B's descriptor (the operand numbers after them).
#define DSV4_WG_ASM(n, scale_d, regs, ab)                                                                             \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " scale_d ", 0;\n"                                                               \
  "wgmma.mma_async.sync.aligned.m64n" n "k16.f32.f16.f16 {" regs "}, " ab ", p, 1, 1, 0;\n}"
// NACC 64: m64n128k16 (expert_wg's 128-slot variant), the same with twice the accumulators.
template <bool ACC, int NACC>
__device__ __forceinline__ void wgmma_f16_64(float (&d)[NACC], const uint32_t (&a)[4], uint64_t bdesc) {
  static_assert(NACC == 32 || NACC == 64, "m64n64 or m64n128");
  if constexpr (NACC == 32 && ACC) {
    asm volatile(DSV4_WG_ASM("64", "1", DSV4_WG_REGS32, "{%32,%33,%34,%35}, %36") : DSV4_WG_D32("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  } else if constexpr (NACC == 32) {
    asm volatile(DSV4_WG_ASM("64", "0", DSV4_WG_REGS32, "{%32,%33,%34,%35}, %36") : DSV4_WG_D32("=f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  } else if constexpr (ACC) {
    asm volatile(DSV4_WG_ASM("128", "1", DSV4_WG_REGS64, "{%64,%65,%66,%67}, %68") : DSV4_WG_D64("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  } else {
    asm volatile(DSV4_WG_ASM("128", "0", DSV4_WG_REGS64, "{%64,%65,%66,%67}, %68") : DSV4_WG_D64("=f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  }
}
#undef DSV4_WG_ASM
#undef DSV4_WG_REGS32
#undef DSV4_WG_REGS64
#undef DSV4_WG_D64
#undef DSV4_WG_D32
template <int N>
__device__ __forceinline__ void wg_fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The weight-scale fold of one row and 128-column step (v2, see the top): the row's four E8M0 bytes e_c (one per
// 32-column chunk) in w. f[c] = 2^(e_c - base) as an f16 pair (both halves), base = max(min e_c, max e_c - 15), so
// every factor is <= 2^15; the returned row factor 2^(base - 127) x 2^14 (E2M1 -> f16 gives value x 2^-14) goes to
// the per-step promotion. A chunk more than 15 binades below the row's largest gets 2^(e_c - base) < 1: its f16
// products then round below 2^-24 of the largest chunk's scale (0 below 2^-25) -- never in the test checkpoints or,
// as far as we know, real ones (a chunk's scale is its amax / 6: spans of 2^15 inside 128 columns of one row); the op
// test CudaOps.Mxfp4ExpertsPrefillScaleSpread bounds it.
__device__ __forceinline__ float wg_fold(uint32_t w, uint32_t (&f)[4]) {
  const int e0 = w & 0xFF, e1 = (w >> 8) & 0xFF, e2 = (w >> 16) & 0xFF, e3 = w >> 24;
  const int emax = max(max(e0, e1), max(e2, e3)), emin = min(min(e0, e1), min(e2, e3));
  const int base = max(emin, emax - 15);
  const int e[4] = {e0, e1, e2, e3};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int s = e[c] - base;  // <= 15
    const uint32_t h = s >= -14 ? static_cast<uint32_t>(s + 15) << 10 : s >= -24 ? 1u << (s + 24) : 0u;  // f16 2^s
    f[c] = h | (h << 16);
  }
  return e8m0_dev(static_cast<uint32_t>(base)) * 16384.0f;
}
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));  // no .ftz: f16 subnormals kept
  return r;
}

// Tile row tr of the wgmma expert kernels (warp tr / 16, its row tr % 16; r0 the tile's first row) -> its weight and
// scale rows (rows past R recompute the last row): for gate/up a warp's rows 0..7 are w1 rows, 8..15 the same w3 rows.
template <bool GATE_UP>
__device__ __forceinline__ void wg_tile_row(const DevExpert& E, const ExpertArgs& a, int64_t K, int64_t R, int64_t r0, int tr,
                                            const uint8_t*& w, const uint8_t*& s) {
  const int wq = tr >> 4, i = tr & 15;
  const bool second = GATE_UP && i >= 8;
  mxfp4_expert_row<GATE_UP>(E, a, K, min(r0 + (GATE_UP ? 8 * wq + (i & 7) : tr), R - 1), second, w, s);
}
// The wgmma expert kernels' epilogue: acc[4 i + 2 h + q] is row g + 8 h of the warp (tile rows mrow + ...), slot
// 8 i + 2 t + q of the tile; rows g / g + 8 times rf0 / rf8 (expert_wb's row factors; 1 for expert_wg).
template <bool GATE_UP, int kSlots, int kAcc>
__device__ __forceinline__ void wg_store_tile(const ExpertArgs& a, const float (&acc)[kAcc], int32_t s0, int ns, int64_t r0,
                                              int64_t R, int warp, int mrow, int g, int t, float rf0, float rf8) {
#pragma unroll
  for (int i = 0; i < kSlots / 8; ++i)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int sl = 8 * i + 2 * t + q;
      if (sl >= ns) continue;
      const int slot = a.perm[s0 + sl];
      if (GATE_UP) {
        const int64_t r = r0 + 8 * warp + g;
        if (r >= R) continue;
        float gv = acc[4 * i + q] * rf0, uv = acc[4 * i + 2 + q] * rf8;
        if (a.official) gv = bf16r(gv), uv = bf16r(uv);
        a.act[static_cast<int64_t>(slot) * a.I + r] = swiglu1(gv, uv, a.limit, a.wts ? a.wts[slot] : 1.0f, a.official);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = r0 + mrow + g + 8 * h;
          if (r >= R) continue;
          const float y = acc[4 * i + 2 * h + q] * (h ? rf8 : rf0);
          a.y[static_cast<int64_t>(slot) * a.d + r] = a.official ? bf16r(y) : y;
        }
      }
    }
}

// grid (ceil(R / (GATE_UP ? 64 : 128)), f8_max_tiles), 256 threads, kWgStages * kWgStageBytes of dynamic shared memory.
// kWgStages: 4, or 8 with DSV4_MOE_PREFILL_STAGES=8.
//
// v2 (session 15; v1 measured in session 14: slower than expert_f8, see the top): the weight scales are folded into
// the A operands (wg_fold: the f16 E2M1 values times 2^(e_c - base), exact while a row's four chunk scales span <= 15
// binades), so a 128-column step is ONE chain of 8 wgmmas into one accumulator set, promoted once (acc += D x row
// factor x slot scale: 32 FMAs, not v1's 4 accumulator sets and 160 FMAs); the accumulator sets and A registers are
// double-buffered, so step ks's wgmmas run while the thread promotes step ks - 1 (wait_group 1), passes the stage
// barrier, issues the next loads and builds step ks + 1's A registers.
//
// kTwo (DSV4_MOE_WG=2, A/B): two blocks per SM (<= 128 registers: 16 warps to hide latency instead of 8) with one
// accumulator set and one A register set, each step's wgmmas waited for (wait_group 0) before its promotion;
// kEarlyBar (DSV4_MOE_WG=3): its stage barrier and next loads while the wgmmas run.
// kSlots 128 (DSV4_MOE_WG=4, with kTwo's step; compiled only so far, session 16): 128-slot tiles, m64n128 wgmmas, so
// each converted weight register feeds twice the MMA work (the conversion and the scale fold are most of the kernel's
// instructions: ncu, session 16); ~170 registers, one block per SM.
template <bool GATE_UP, int kWgStages, bool kTwo, bool kEarlyBar = false, int kSlots = kF8Slots>
__global__ void __launch_bounds__(kF8Threads, kTwo && kSlots == kF8Slots ? 2 : 1) expert_wg(ExpertArgs a, const uint8_t* xg) {
  static_assert(kSlots == kF8Slots || (kSlots == 2 * kF8Slots && kTwo && !kEarlyBar), "128 slots: the kTwo step only");
  constexpr int kStageBytes = wg_stage_bytes(kSlots), kBBytes = wg_b_bytes(kSlots);
  constexpr int kLbo = kSlots / 8 * 128;  // bytes between the B operand's 8-column k-blocks (a k-block: 8-slot blocks x 128 B)
  constexpr int kTps = kF8Threads / kSlots, kKbPer = 16 / kTps;  // threads per slot's codes, 16-byte k-blocks per thread
  pdl_wait();
  extern __shared__ __align__(1024) uint8_t smem[];
  const int64_t K = GATE_UP ? a.d : a.I, R = GATE_UP ? a.I : a.d, nk = static_cast<int64_t>(a.n) * a.k;
  int e, ns;
  int32_t s0;
  if (!f8_tile<kSlots>(reinterpret_cast<const int32_t*>(xg + wg_tiles_offset(nk, K)), f8_max_tiles(nk, a.E), a.offsets, e, s0, ns)) return;
  const DevExpert E = a.table[e];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (GATE_UP ? kF8Rows / 2 : kF8Rows);
  const uint16_t* xc = reinterpret_cast<const uint16_t*>(xg);
  const float* xsc = wg_xscales(const_cast<uint8_t*>(xg), nk, K);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  auto wrow = [&](int tr, const uint8_t*& w, const uint8_t*& s) { wg_tile_row<GATE_UP>(E, a, K, R, r0, tr, w, s); };
  // Copies per stage: weights row tid / 2, chunks 2 (tid % 2) and + 1; scale word of row tid (tid < 128), scale of
  // slot tid - 128 (128 .. 128 + kSlots - 1); codes: slot tid / kTps, k-blocks kKbPer (tid % kTps) .. + kKbPer - 1
  // (16 bytes each; 64 slots: tid / 4, 4 k-blocks).
  const int a_row = tid >> 1, a_c0 = 2 * (tid & 1);
  const uint8_t *a_src, *unused;
  wrow(a_row, a_src, unused);
  const uint8_t* s_src = nullptr;
  if (tid < kF8Rows) wrow(tid, unused, s_src);
  static_assert(kTps == 4 || kTps == 2, "64 or 128 slots");
  const int b_slot = tid >> (kTps == 4 ? 2 : 1), b_kb0 = kKbPer * (tid & (kTps - 1));
  const uint16_t* b_src = xc + static_cast<int64_t>(s0 + min(b_slot, ns - 1)) * K;
  const int kb = static_cast<int>(K / kF8K), nks = kb;
  const float* x_src = tid >= kF8Rows && tid < kF8Rows + kSlots ? xsc + (s0 + min(tid - kF8Rows, ns - 1)) * kb : nullptr;
  auto stage = [&](int ks) { return smem + (ks % kWgStages) * kStageBytes; };
  auto issue = [&](int ks) {
    uint8_t* st = stage(ks);
    if (ks < nks) {
      const uint8_t* w = a_src + static_cast<int64_t>(ks) * (kF8K / 2);
      f8_copy_weights(st, a_row, a_c0, w);
      if (tid < kF8Rows) cp_async4(st + kF8ABytes + 4 * tid, s_src + 4 * ks);
      else if (x_src) cp_async4(st + kF8ABytes + kF8Rows * 4 + kBBytes + 4 * (tid - kF8Rows), x_src + ks);
      uint8_t* bst = st + kF8ABytes + kF8Rows * 4;
#pragma unroll
      for (int i = 0; i < kKbPer; ++i) {
        const int kbk = b_kb0 + i;
        cp_async16(bst + kbk * kLbo + (b_slot >> 3) * 128 + (b_slot & 7) * 16, b_src + static_cast<int64_t>(ks) * kF8K + 8 * kbk);
      }
    }
    cp_async_commit();
  };
  const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lch = lane >> 4;
  const int mrow = 16 * warp;  // this warp's first tile row
  // A step's A registers (E2M1 -> f16 of the lane's FP4 words of rows g and g + 8, times the fold factors) and the two
  // rows' promotion factors.
  auto build_a = [&](const uint8_t* st, uint32_t (&av)[4][2][4], float (&rf)[2]) {
    uint32_t f0[4], f8[4];
    rf[0] = wg_fold(*reinterpret_cast<const uint32_t*>(st + kF8ABytes + 4 * (mrow + g)), f0);
    rf[1] = wg_fold(*reinterpret_cast<const uint32_t*>(st + kF8ABytes + 4 * (mrow + g + 8)), f8);
#pragma unroll
    for (int cp = 0; cp < 2; ++cp) {  // chunk pairs: one ldmatrix.x4 gives rows g, g + 8 of chunks 2 cp and 2 cp + 1
      uint32_t w[4];
      const int r = mrow + lrow, ch = 2 * cp + lch;
      ldmatrix_x4(w, st + f8_wchunk(r, ch));
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int c = 2 * cp + h2;
        const uint32_t wg = w[2 * h2], wg8 = w[2 * h2 + 1];
        uint32_t r[4], r8[4];
        e2m1_word_f16(wg, r);
        e2m1_word_f16(wg8, r8);
#pragma unroll
        for (int j = 0; j < 4; ++j)  // register j = 2 h + o of k16 step h: A registers 2 o (row g), 2 o + 1 (row g + 8)
          av[c][j / 2][2 * (j % 2)] = hmul2_bits(r[j], f0[c]), av[c][j / 2][2 * (j % 2) + 1] = hmul2_bits(r8[j], f8[c]);
      }
    }
  };
  constexpr int kAcc = kSlots / 2;  // accumulator registers per thread: 64 rows x kSlots over a warpgroup
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  // acc += D x (row factor x slot scale) of a finished step, the slot scales from its stage.
  auto promote = [&](const float (&d)[kAcc], const float (&rf)[2], const uint8_t* st) {
    const float* xs = reinterpret_cast<const float*>(st + kF8ABytes + kF8Rows * 4 + kBBytes);
#pragma unroll
    for (int i = 0; i < kSlots / 8; ++i) {
      const float x0 = xs[8 * i + 2 * t], x1 = xs[8 * i + 2 * t + 1];
      acc[4 * i + 0] = fmaf(d[4 * i + 0], rf[0] * x0, acc[4 * i + 0]);  // row g, slots 8i + 2t, + 1
      acc[4 * i + 1] = fmaf(d[4 * i + 1], rf[0] * x1, acc[4 * i + 1]);
      acc[4 * i + 2] = fmaf(d[4 * i + 2], rf[1] * x0, acc[4 * i + 2]);  // row g + 8
      acc[4 * i + 3] = fmaf(d[4 * i + 3], rf[1] * x1, acc[4 * i + 3]);
    }
  };
#pragma unroll
  for (int p = 0; p < kWgStages - 1; ++p) issue(p);
  cp_async_wait<kWgStages - 2>();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async writes -> the wgmma (async proxy) reads
  __syncthreads();  // stage 0 has landed for every thread
  if constexpr (kTwo) {
    uint32_t av[4][2][4];  // [chunk][k16 step][A register]
    float rf[2], d[kAcc];
    build_a(stage(0), av, rf);
    for (int ks = 0; ks < nks; ++ks) {
      const uint8_t* bst = stage(ks) + kF8ABytes + kF8Rows * 4;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (c == 0) wgmma_f16_64<false>(d, av[0][0], wg_desc(bst, kLbo, 128));
        else wgmma_f16_64<true>(d, av[c][0], wg_desc(bst + (4 * c) * kLbo, kLbo, 128));
        wgmma_f16_64<true>(d, av[c][1], wg_desc(bst + (4 * c + 2) * kLbo, kLbo, 128));
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      if constexpr (kEarlyBar) {
        // While the wgmmas run: the barrier and the next loads (stage ks - 1's wgmmas were waited for and its scales
        // read in the previous step, by every thread once past the barrier). ptxas: a few spilled registers.
        cp_async_wait<kWgStages - 3>();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();  // stage ks + 1 has landed for every thread; stage ks - 1 is no longer read
        issue(ks + kWgStages - 1);
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      wg_fence_acc(d);
      promote(d, rf, stage(ks));
      if constexpr (!kEarlyBar) {
        cp_async_wait<kWgStages - 3>();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();  // stage ks + 1 has landed for every thread; stage ks - 1 is no longer read
        issue(ks + kWgStages - 1);
      }
      build_a(stage(ks + 1), av, rf);  // past the last step: a stale stage, never used
    }
  } else {
    uint32_t av[2][4][2][4];  // [buffer][chunk][k16 step][A register]
    float rf[2][2], d[2][32];  // [buffer]: the step's row factors, its accumulator set
    build_a(stage(0), av[0], rf[0]);
    // Step ks = group start + J on buffer J % 2 (template constants: register arrays need static indices).
    auto step = [&](auto J, int ks) {
      constexpr int j = decltype(J)::value, b = j & 1, o = 1 - b;
      const uint8_t* bst = stage(ks) + kF8ABytes + kF8Rows * 4;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");  // the A registers and accumulators were written
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (c == 0) wgmma_f16_64<false>(d[b], av[b][0][0], wg_desc(bst, 1024, 128));
        else wgmma_f16_64<true>(d[b], av[b][c][0], wg_desc(bst + (4 * c) * 1024, 1024, 128));
        wgmma_f16_64<true>(d[b], av[b][c][1], wg_desc(bst + (4 * c + 2) * 1024, 1024, 128));
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      if constexpr (j > 0) {  // step ks - 1's wgmmas (the other buffer) are done: promote them while this step's run
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        wg_fence_acc(d[o]);
        promote(d[o], rf[o], stage(ks - 1));
      }
      cp_async_wait<kWgStages - 3>();  // stage ks + 1 (prologue S - 1 groups + one per step so far)
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();  // stage ks + 1 has landed for every thread; stage ks - 1 is no longer read (wgmmas, scales)
      issue(ks + kWgStages - 1);
      build_a(stage(ks + 1), av[o], rf[o]);  // past the last step: a stale stage, never used
    };
    // Groups of kWgGroup steps, every step unconditional and the group's last step waited for at its end: ptxas
    // serialises every wgmma (C7514) when one is in flight across a loop back edge or a branch (measured with a probe).
    // So the last step of a group is promoted without overlap; launch_tc2 takes this kernel only where kWgGroup
    // divides K / 128 (Flash and Pro: 16..56 steps).
    for (int ks = 0; ks < nks; ks += kWgGroup) {
      step(std::integral_constant<int, 0>{}, ks);
      step(std::integral_constant<int, 1>{}, ks + 1);
      step(std::integral_constant<int, 2>{}, ks + 2);
      step(std::integral_constant<int, 3>{}, ks + 3);
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      wg_fence_acc(d[1]);
      promote(d[1], rf[1], stage(ks + 3));
    }
  }
  cp_async_wait<0>();
  wg_store_tile<GATE_UP, kSlots>(a, acc, s0, ns, r0, R, warp, mrow, g, t, 1.0f, 1.0f);
}
