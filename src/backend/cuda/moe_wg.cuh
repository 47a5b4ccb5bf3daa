// Prefill routed MXFP4 experts on warpgroup MMAs (wgmma, f16 operands, fp32 accumulation): the grouped prefill kernel
// of official numerics where K is whole 128-column blocks, DSV4_MOE_WG=1 / set_moe_wg(true) (opt-in), in place of
// expert_f8 (moe_f8.cuh).
//
// Measured (docs/BENCHMARKS.md, session 14; one H200, 20 Flash layers, one 2,048-token chunk): correct (vs expert_tc2
// unrounded rel L2 <= 1.34e-6, the same as expert_f8: both sum f16-exact products per 32-column block in fp32), but
// SLOWER than expert_f8: gate/up 85.4 ms (wgmma and wait per chunk) / 87.5 ms (all 4 chunks in flight, one wait per
// step) vs 75.8-76.2; down 50.1-50.5 vs 40.5-40.7. With ~2.5x fewer instructions than expert_f8 (ncu: 51 % issue
// slots busy) and no gain, both kernels look bound by the weight stream: each block reads 64 bytes of each of its 128
// rows (2 KB apart) per step with only 3 steps in flight (expert_f8 ncu: DRAM 14 % of peak, ~1.8 us per step), where
// the decode walk keeps 7 steps of a row in flight. Next: deeper pipelines / longer row runs per step (compiled but
// not run: 8 stages), then this kernel again.
//
// Why: expert_f8's m16n8k32 E4M3 mma.sync is not native on sm_90a (ptxas: F2FP unpacks + two f16 HMMAs per MMA), so
// it issues ~25 instructions per MMA and ran at ~150 TFLOP/s (ncu: 51 % issue slots busy). wgmma is Hopper's native
// tensor-core path: one m64n64k16 instruction per warpgroup does 32x the work of an m16n8k16, with B read from shared
// memory by descriptor. f16 rather than E4M3 operands: f16 wgmma accumulates in proper fp32 (the FP8 one through a
// ~14-bit block adder, rel L2 8.4e-5 in tools/gpu/probes/fp4_wgmma_probe.cu), E2M1 -> f16 is as cheap as E2M1 -> E4M3,
// and the QA8 activation codes (E4M3 values) are exact in f16. Half the FP8 rate still leaves the kernel
// tensor-bound on paper (per 128-column step and warpgroup: 256 tensor cycles vs ~230 issue cycles).
//
// Arithmetic (expert_f8's): per 32-column block (one E8M0 weight scale per row) the two k16 wgmmas accumulate into a
// fresh accumulator set D (f16 x f16 products are exact, summed in fp32); part += D x weight scale; after the
// 128-column step acc += part x the slot's activation scale x 2^14 (E2M1 -> f16 gives value x 2^-14).
//
// Operands as staged:
// - x: moe_gather_f16_kernel writes each grouped slot's QA8 codes as f16 [slots][K] with K permuted inside every
//   32-column block so that the A registers below line up (stored position p = 16 h + 8 o + 2 t + j holds actual
//   column 8 t + 2 h + o + 4 j: k16 step h of the block, A register 2 h + o, its half j), then the per-128 scales
//   [slots][K / 128] fp32, then expert_f8's work list. In a stage: core matrices of 8 slots x 8 k (16 bytes per slot)
//   at [k-block kb][slot-block nb] (kb stride 1024 B = LBO, nb stride 128 B = SBO; no swizzle).
// - weights: expert_f8's stage layout (raw FP4 rows, 64 bytes per row and 128-column step, ldmatrix'ed) and each row's
//   four E8M0 bytes of the step. Lane (g, t) gets FP4 word t (columns 8t..8t+7 of a 32-block) of rows g and g + 8;
//   e2m1_pair_f16<J> makes register J from nibbles J and J + 4 (columns 8t + J, 8t + J + 4).
// Block: 256 threads = 2 warpgroups = 8 warps of 16 rows; tile 128 weight rows x 64 slots. A warp's rows g and g + 8
// are, for gate/up, w1 and w3 of the same intermediate row (SwiGLU in the thread), for down two rows of w2.
// Included INSIDE kernels.cu's anonymous namespace after moe_f8.cuh (work list, stage layout constants).
#pragma once

constexpr int kWgBBytes = kF8Slots * kF8K * 2;                                  // 16 KB of f16 codes per stage
constexpr int kWgStageBytes = kF8ABytes + kF8Rows * 4 + kWgBBytes + kF8Slots * 4;  // + weight / activation scales

// The scratch as this kernel uses it (f16 codes, scales, work list), and its size.
__host__ __device__ inline int64_t wg_tiles_offset(int64_t nk, int64_t K) { return (nk * K * 2 + nk * (K / 128) * 4 + 15) / 16 * 16; }
__host__ __device__ inline int64_t wg_scratch_bytes(int64_t nk, int64_t K, int E) { return wg_tiles_offset(nk, K) + 4 * (f8_max_tiles(nk, E) + 1); }
__device__ __forceinline__ float* wg_xscales(uint8_t* xg, int64_t nk, int64_t K) { return reinterpret_cast<float*>(xg + nk * K * 2); }

// Stored position of actual column a (0..31) of a 32-column block (see above).
__host__ __device__ constexpr int wg_kpos(int a) {
  return 16 * ((a % 4) / 2) + 8 * (a % 2) + 2 * (a / 8) + (a % 8) / 4;
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

// E2M1 nibbles J (low half) and J + 4 (high half) of w as f16 values x 2^-14: magnitude bits to 9..11, sign to 15.
template <int J>
__device__ __forceinline__ uint32_t e2m1_pair_f16(uint32_t w) {
  const uint32_t m = J <= 2 ? w << (9 - 4 * J) : w >> 3, sgn = w << (12 - 4 * J);
  return (m & 0x0E000E00u) | (sgn & 0x80008000u);
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
#define DSV4_WG_ASM(scale_d)                                                                                          \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " scale_d ", 0;\n"                                                               \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "                                                              \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, " \
  "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}"
template <bool ACC>
__device__ __forceinline__ void wgmma_f16_64(float (&d)[32], const uint32_t (&a)[4], uint64_t bdesc) {
  if constexpr (ACC) {
    asm volatile(DSV4_WG_ASM("1") : DSV4_WG_D32("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  } else {
    asm volatile(DSV4_WG_ASM("0") : DSV4_WG_D32("=f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  }
}
#undef DSV4_WG_ASM
#undef DSV4_WG_D32
__device__ __forceinline__ void wg_fence_acc(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// grid (ceil(R / (GATE_UP ? 64 : 128)), f8_max_tiles), 256 threads, kWgStages * kWgStageBytes of dynamic shared memory.
// kWgStages: as expert_f8's kF8Stages (4 measured; 8 with DSV4_MOE_PREFILL_STAGES=8, compiled, not yet run). The
// main loop's overlap of the next stage's barrier with the step's wgmmas was written after the measured runs:
// compiled, not yet run. Its cost: a step waits for stage ks + 1 (not ks), so a stage's copies have S - 2 steps to
// land instead of S - 1 (2 instead of 3 at 4 stages) -- measure it at both depths.
template <bool GATE_UP, int kWgStages>
__global__ void __launch_bounds__(kF8Threads, 1) expert_wg(ExpertArgs a, const uint8_t* xg) {
  pdl_wait();
  extern __shared__ __align__(1024) uint8_t smem[];
  const int64_t K = GATE_UP ? a.d : a.I, R = GATE_UP ? a.I : a.d, nk = static_cast<int64_t>(a.n) * a.k;
  int e, ns;
  int32_t s0;
  if (!f8_tile(reinterpret_cast<const int32_t*>(xg + wg_tiles_offset(nk, K)), f8_max_tiles(nk, a.E), a.offsets, e, s0, ns)) return;
  const DevExpert E = a.table[e];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (GATE_UP ? kF8Rows / 2 : kF8Rows);
  const uint16_t* xc = reinterpret_cast<const uint16_t*>(xg);
  const float* xsc = wg_xscales(const_cast<uint8_t*>(xg), nk, K);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // Tile row tr (0..127; warp tr / 16, its row tr % 16) -> weight and scale rows (rows past R recompute the last row).
  auto wrow = [&](int tr, const uint8_t*& w, const uint8_t*& s) {
    const int wq = tr >> 4, i = tr & 15;
    const bool second = GATE_UP && i >= 8;
    const int64_t r = min(r0 + (GATE_UP ? 8 * wq + (i & 7) : tr), R - 1);
    w = static_cast<const uint8_t*>(GATE_UP ? (second ? E.w3 : E.w1) : E.w2) + r * (K / 2);
    s = static_cast<const uint8_t*>(GATE_UP ? (second ? E.s3 : E.s1) : E.s2) + r * (GATE_UP ? a.sb1 : a.sb2);
  };
  // Copies per stage: weights row tid / 2, chunks 2 (tid % 2) and + 1; scale word of row tid (tid < 128), scale of
  // slot tid - 128 (128..191); codes: slot tid / 4, k-blocks 4 (tid % 4) .. + 3 (16 bytes each).
  const int a_row = tid >> 1, a_c0 = 2 * (tid & 1);
  const uint8_t *a_src, *unused;
  wrow(a_row, a_src, unused);
  const uint8_t* s_src = nullptr;
  if (tid < kF8Rows) wrow(tid, unused, s_src);
  const int b_slot = tid >> 2, b_kb0 = 4 * (tid & 3);
  const uint16_t* b_src = xc + static_cast<int64_t>(s0 + min(b_slot, ns - 1)) * K;
  const int kb = static_cast<int>(K / kF8K), nks = kb;
  const float* x_src = tid >= kF8Rows && tid < kF8Rows + kF8Slots ? xsc + (s0 + min(tid - kF8Rows, ns - 1)) * kb : nullptr;
  auto issue = [&](int ks) {
    uint8_t* st = smem + (ks % kWgStages) * kWgStageBytes;
    if (ks < nks) {
      const uint8_t* w = a_src + static_cast<int64_t>(ks) * (kF8K / 2);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = a_c0 + i;
        cp_async16(st + a_row * 64 + 16 * (c ^ ((a_row >> 1) & 3)), w + 16 * c);
      }
      if (tid < kF8Rows) cp_async4(st + kF8ABytes + 4 * tid, s_src + 4 * ks);
      else if (x_src) cp_async4(st + kF8ABytes + kF8Rows * 4 + kWgBBytes + 4 * (tid - kF8Rows), x_src + ks);
      uint8_t* bst = st + kF8ABytes + kF8Rows * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kbk = b_kb0 + i;
        cp_async16(bst + kbk * 1024 + (b_slot >> 3) * 128 + (b_slot & 7) * 16, b_src + static_cast<int64_t>(ks) * kF8K + 8 * kbk);
      }
    }
    cp_async_commit();
  };
  const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lch = lane >> 4;
  const int mrow = 16 * warp;  // this warp's first tile row
  // The A registers of a step's 4 chunks (E2M1 -> f16 of the lane's FP4 words of rows g and g + 8).
  auto build_a = [&](const uint8_t* st, uint32_t (&av)[4][2][4]) {
#pragma unroll
    for (int cp = 0; cp < 2; ++cp) {  // chunk pairs: one ldmatrix.x4 gives rows g, g + 8 of chunks 2 cp and 2 cp + 1
      uint32_t w[4];
      const int r = mrow + lrow, ch = 2 * cp + lch;
      ldmatrix_x4(w, st + r * 64 + 16 * (ch ^ ((r >> 1) & 3)));
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int c = 2 * cp + h2;
        const uint32_t wg = w[2 * h2], wg8 = w[2 * h2 + 1];
        av[c][0][0] = e2m1_pair_f16<0>(wg), av[c][0][1] = e2m1_pair_f16<0>(wg8);
        av[c][0][2] = e2m1_pair_f16<1>(wg), av[c][0][3] = e2m1_pair_f16<1>(wg8);
        av[c][1][0] = e2m1_pair_f16<2>(wg), av[c][1][1] = e2m1_pair_f16<2>(wg8);
        av[c][1][2] = e2m1_pair_f16<3>(wg), av[c][1][3] = e2m1_pair_f16<3>(wg8);
      }
    }
  };
#pragma unroll
  for (int p = 0; p < kWgStages - 1; ++p) issue(p);
  cp_async_wait<kWgStages - 2>();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async writes -> the wgmma (async proxy) reads
  __syncthreads();  // stage 0 has landed for every thread
  uint32_t av[4][2][4];  // [chunk][k16 step][A register]
  build_a(smem, av);
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  // Per step: the 4 chunks' wgmmas in flight at once (one commit, one wait; the first GPU run waited per chunk: 4
  // round trips per step, slower), and while they run the next stage's barrier and the loads of stage ks + S - 1 (into
  // the slot step ks - 1 used: its wgmmas were waited for, its scales read, before this step's barrier). The A
  // registers and accumulator sets of the wgmmas in flight stay untouched until the wait; the next step's A registers
  // are built after it.
  for (int ks = 0; ks < nks; ++ks) {
    const uint8_t* st = smem + (ks % kWgStages) * kWgStageBytes;
    const uint8_t* bst = st + kF8ABytes + kF8Rows * 4;
    float d[4][32];
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");  // the A registers are written
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      wgmma_f16_64<false>(d[c], av[c][0], wg_desc(bst + (4 * c) * 1024, 1024, 128));
      wgmma_f16_64<true>(d[c], av[c][1], wg_desc(bst + (4 * c + 2) * 1024, 1024, 128));
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    cp_async_wait<kWgStages - 3>();  // stage ks + 1 (prologue S - 1 groups + one per step so far)
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();  // stage ks + 1 has landed for every thread; stage ks - 1 is no longer read
    issue(ks + kWgStages - 1);
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int c = 0; c < 4; ++c) wg_fence_acc(d[c]);
    const uint32_t ws0 = *reinterpret_cast<const uint32_t*>(st + kF8ABytes + 4 * (mrow + g));
    const uint32_t ws8 = *reinterpret_cast<const uint32_t*>(st + kF8ABytes + 4 * (mrow + g + 8));
    const float* xs = reinterpret_cast<const float*>(bst + kWgBBytes);
    float sg[4], sg8[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) sg[c] = e8m0_dev((ws0 >> (8 * c)) & 0xFFu), sg8[c] = e8m0_dev((ws8 >> (8 * c)) & 0xFFu);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float x0 = xs[8 * i + 2 * t] * 16384.0f, x1 = xs[8 * i + 2 * t + 1] * 16384.0f;  // x 2^14: E2M1 -> f16
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int n = 4 * i + q;
        const float* s4 = q < 2 ? sg : sg8;  // rows g (q 0, 1) and g + 8 (q 2, 3)
        // The chunks in K order, as expert_f8 sums them.
        float p = d[0][n] * s4[0];
        p = fmaf(d[1][n], s4[1], p);
        p = fmaf(d[2][n], s4[2], p);
        p = fmaf(d[3][n], s4[3], p);
        acc[n] = fmaf(p, (q & 1) ? x1 : x0, acc[n]);
      }
    }
    if (ks + 1 < nks) build_a(smem + ((ks + 1) % kWgStages) * kWgStageBytes, av);
  }
  cp_async_wait<0>();
  // Epilogue: acc[4 i + 2 h + q] is row g + 8 h of the warp, slot 8 i + 2 t + q of the tile.
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int sl = 8 * i + 2 * t + q;
      if (sl >= ns) continue;
      const int slot = a.perm[s0 + sl];
      if (GATE_UP) {
        const int64_t r = r0 + 8 * warp + g;
        if (r >= R) continue;
        float gv = acc[4 * i + q], uv = acc[4 * i + 2 + q];
        if (a.official) gv = bf16r(gv), uv = bf16r(uv);
        a.act[static_cast<int64_t>(slot) * a.I + r] = swiglu1(gv, uv, a.limit, a.wts ? a.wts[slot] : 1.0f, a.official);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = r0 + mrow + g + 8 * h;
          if (r >= R) continue;
          const float y = acc[4 * i + 2 * h + q];
          a.y[static_cast<int64_t>(slot) * a.d + r] = a.official ? bf16r(y) : y;
        }
      }
    }
}
