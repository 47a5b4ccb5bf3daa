// Prefill routed experts v2 on the tensor cores: MXFP4 weights, official numerics (QA8 activations, exact in BF16).
// WIP (written without a GPU; the first GPU run is CudaOps.Mxfp4ExpertsGroupedPrefill).
//
// Why: expert_tc_grouped (moe_grouped.cuh) runs at ~42 TFLOP/s and is 60 % of an 8K prefill: per 64-wide K step every
// block dequantizes its weight tile through fp32 (load8 + LUT + pack), re-reads and re-packs the fp32 activations of
// its slots from global memory, and waits for both before its MMAs (no pipelining). Here:
//   1. moe_gather_bf16_kernel writes the slots' activation rows once, in expert order, as BF16 (exact: QA8 values),
//      with K permuted inside each 16-column block (see kPerm below);
//   2. expert_tc2 streams raw FP4 weight bytes and those BF16 rows through a 3-stage cp.async pipeline, converts each
//      weight byte (two E2M1 values) to a BF16 pair through a 256-entry table in shared memory and applies the row's
//      E8M0 block scale with one exact BF16 multiply, and feeds mma.sync m16n8k16 (BF16, fp32 accumulation) with
//      activation fragments from ldmatrix.
// Block: 256 threads = 8 warps = 4 (rows) x 2 (slots); tile 128 weight rows x 64 slots, K steps of 64. Gate/up: the
// tile's rows 0..63 are w1 rows r0.., rows 64..127 the same rows of w3, and warp m's two 16-row MMA tiles are w1 and
// w3 of intermediate rows r0 + 16 m .. + 15, so g and u of one output meet in one thread. Down: 128 rows of w2.
//
// K permutation: an m16n8k16 A fragment gives thread (g, t) the columns {2t, 2t+1, 2t+8, 2t+9} of its two rows. With
// the activation's columns stored permuted (stored column q of a 16-block holds actual column kPerm(q): 2t + j ->
// 4t + j, 8 + 2t + j -> 4t + 2 + j), those four columns are the thread's actual columns 4t .. 4t + 3, i.e. two
// consecutive bytes of the FP4 row: one 16-bit shared-memory load per row per MMA. The sum over K is the same set of
// products; MXFP4 scale blocks (32 columns) are whole 16-blocks, so the permutation never crosses them.
// Included INSIDE kernels.cu's anonymous namespace, after gemv_ring.cuh (cp_async16, cp_async_commit, cp_async_wait)
// and moe_grouped.cuh (mma_bf16_16816, swiglu1).
#pragma once

constexpr int kTc2Rows = 128;   // weight rows per block tile
constexpr int kTc2Slots = 64;   // slots per block tile
constexpr int kTc2K = 64;       // K per pipeline stage
constexpr int kTc2Stages = 3;
constexpr int kTc2Threads = 256;
constexpr int kTc2ABytes = kTc2Rows * kTc2K / 2;  // 4 KB of FP4 bytes per stage
constexpr int kTc2BBytes = kTc2Slots * kTc2K * 2;  // 8 KB of BF16 activations per stage
constexpr int kTc2StageBytes = kTc2ABytes + kTc2BBytes;

// Stored column q (0..15) of a 16-column block holds actual column kperm16(q).
__host__ __device__ constexpr int kperm16(int q) { return q < 8 ? 4 * (q >> 1) + (q & 1) : 4 * ((q - 8) >> 1) + 2 + (q & 1); }

// xg[p, :] = BF16(src[perm[p] / div, :]) for p < *end (= offsets[E]), columns permuted per 16-block (K % 16 == 0).
// grid (nk, ceil(K / 256)).
__global__ void moe_gather_bf16_kernel(const float* src, int64_t K, const int32_t* perm, const int32_t* end, int div,
                                       uint16_t* xg) {
  pdl_wait();
  const int64_t p = blockIdx.x, q = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (q >= K || p >= *end) return;  // only the grouped slots (offsets[E]); the rest of perm is never read
  const int64_t row = perm[p] / div;
  const int64_t k = (q & ~int64_t{15}) + kperm16(static_cast<int>(q & 15));
  const float v = src[row * K + k];
  xg[p * K + q] = static_cast<uint16_t>(__float_as_uint(v) >> 16);  // exact: v is a BF16 value (QA8)
}

// E8M0 byte -> the BF16 pair (2^(b - 127), 2^(b - 127)); byte 0 is 2^-127, a BF16 subnormal (0x0040).
__device__ __forceinline__ uint32_t e8m0_bf16x2(uint32_t b) {
  const uint32_t h = b ? (b << 7) : 0x0040u;
  return h | (h << 16);
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(&a), y = *reinterpret_cast<const __nv_bfloat162*>(&b);
  const __nv_bfloat162 r = __hmul2_rn(x, y);  // exact here (a power of two times a BF16 value); _rn: never contracted
  return *reinterpret_cast<const uint32_t*>(&r);
}
// ldmatrix_x4: expert_mma.cuh (included before this file through gemv_ring.cuh).

// grid (ceil(rows / (GATE_UP ? 64 : 128)), E). Dynamic shared memory: the stages, the byte->BF16 table (1 KB) and the
// tile rows' E8M0 scales for the whole K (kTc2Rows * K / 32 bytes).
// The FP4 bytes and E8M0 scale bytes of weight row r of an expert's gate/up (w1, or w3 when `second`) or down matrix
// (w2): the row lookup of the grouped prefill kernels (expert_tc2, expert_f8, expert_wg), which differ only in how a
// tile row maps to (r, second).
template <bool GATE_UP>
__device__ __forceinline__ void mxfp4_expert_row(const DevExpert& E, const ExpertArgs& a, int64_t K, int64_t r, bool second,
                                                 const uint8_t*& w, const uint8_t*& s) {
  w = static_cast<const uint8_t*>(GATE_UP ? (second ? E.w3 : E.w1) : E.w2) + r * (K / 2);
  s = static_cast<const uint8_t*>(GATE_UP ? (second ? E.s3 : E.s1) : E.s2) + r * (GATE_UP ? a.sb1 : a.sb2);
}

template <bool GATE_UP>
__global__ void __launch_bounds__(kTc2Threads) expert_tc2(ExpertArgs a, const uint16_t* xg) {
  pdl_wait();
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* stage = smem;                                                    // [S][A bytes | B bf16]
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + kTc2Stages * kTc2StageBytes);  // [256]
  uint8_t* scl = reinterpret_cast<uint8_t*>(lut + 256);                     // [K / 32][kTc2Rows]
  const int e = blockIdx.y;
  const int32_t beg = a.offsets[e], end = a.offsets[e + 1];
  if (beg == end) return;
  const DevExpert E = a.table[e];
  const int64_t K = GATE_UP ? a.d : a.I, R = GATE_UP ? a.I : a.d, sbk = K / 32;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * (GATE_UP ? kTc2Rows / 2 : kTc2Rows);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;
  // Tile row tr (0..127) -> weight row pointer and scale row (rows past R recompute the last row; never stored).
  auto wrow = [&](int tr, const uint8_t*& w, const uint8_t*& s) {
    const bool second = GATE_UP && tr >= kTc2Rows / 2;
    mxfp4_expert_row<GATE_UP>(E, a, K, min(r0 + (GATE_UP ? tr % (kTc2Rows / 2) : tr), R - 1), second, w, s);
  };
  // The byte -> (E2M1 low nibble, E2M1 high nibble) BF16 pair table, and the tile rows' scales.
  for (int i = tid; i < 256; i += kTc2Threads) {
    auto bf = [](uint32_t c) { return __float_as_uint(e2m1_value(c)) >> 16; };  // exact in BF16
    lut[i] = bf(i & 15u) | (bf(i >> 4) << 16);
  }
  // Scales transposed ([block][row]): the 8 rows a warp's fragments read per block are 8 adjacent bytes (one or two
  // banks) instead of 8 bytes sbk apart (an 8-way conflict at K = 4096). Rows by warp, blocks by lane: coalesced
  // global reads and no divisions.
  for (int tr = warp; tr < kTc2Rows; tr += kTc2Threads / 32) {
    const uint8_t *w, *s;
    wrow(tr, w, s);
    for (int64_t c = lane; c < sbk; c += 32) scl[c * kTc2Rows + tr] = s[c];
  }
  // This thread's copies per stage: A: row tid / 2, 16-byte half tid % 2; B: slots tid / 8 and 32 + tid / 8, chunk
  // tid % 8 (16 bytes = 8 columns), stored at chunk ^ (slot & 7) so that ldmatrix reads hit 8 different bank groups.
  const uint8_t *a_src, *a_scl;
  wrow(tid >> 1, a_src, a_scl);
  a_src += 16 * (tid & 1);
  const int b_slot = tid >> 3, b_chunk = tid & 7;
  const int nks = static_cast<int>(K / kTc2K);
  for (int32_t s0 = beg; s0 < end; s0 += kTc2Slots) {
    const int ns = min(kTc2Slots, end - s0);
    const uint16_t* b_src0 = xg + static_cast<int64_t>(s0 + min(b_slot, ns - 1)) * K + 8 * b_chunk;
    const uint16_t* b_src1 = xg + static_cast<int64_t>(s0 + min(b_slot + 32, ns - 1)) * K + 8 * b_chunk;
    auto issue = [&](int ks) {
      uint8_t* st = stage + (ks % kTc2Stages) * kTc2StageBytes;
      if (ks < nks) {
        cp_async16(st + tid * 16, a_src + static_cast<int64_t>(ks) * (kTc2K / 2));
        uint8_t* bst = st + kTc2ABytes;
        cp_async16(bst + (b_slot * 8 + (b_chunk ^ (b_slot & 7))) * 16, b_src0 + static_cast<int64_t>(ks) * kTc2K);
        const int s1 = b_slot + 32;
        cp_async16(bst + (s1 * 8 + (b_chunk ^ (s1 & 7))) * 16, b_src1 + static_cast<int64_t>(ks) * kTc2K);
      }
      cp_async_commit();
    };
    float acc[2][4][4] = {};
    __syncthreads();  // the previous slot tile's stages are no longer read; lut / scl are written
#pragma unroll
    for (int p = 0; p < kTc2Stages - 1; ++p) issue(p);
    for (int ks = 0; ks < nks; ++ks) {
      cp_async_wait<kTc2Stages - 2>();
      __syncthreads();  // stage ks has landed for every thread; stage ks - 1 is no longer read
      issue(ks + kTc2Stages - 1);
      const uint8_t* st = stage + (ks % kTc2Stages) * kTc2StageBytes;
      const uint8_t* bst = st + kTc2ABytes;
      // This stage's two E8M0 blocks (columns 64 ks .. + 31, + 32 .. + 63) for the thread's 4 fragment rows.
      uint32_t sc[2][2][2];  // [mt][hh][block]
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int tr = (GATE_UP ? mt * (kTc2Rows / 2) + 16 * wm : 32 * wm + 16 * mt) + g + 8 * hh;
#pragma unroll
          for (int bk = 0; bk < 2; ++bk) sc[mt][hh][bk] = e8m0_bf16x2(scl[(2 * static_cast<int64_t>(ks) + bk) * kTc2Rows + tr]);
        }
#pragma unroll
      for (int kk = 0; kk < kTc2K / 16; ++kk) {
        // Activation fragments of the warp's 4 n8 tiles (slots wn * 32 + 8 j ..): two ldmatrix.x4, each two tiles.
        uint32_t b[4][2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int mi = lane >> 3, sl = wn * 32 + 16 * h + 8 * (mi >> 1) + (lane & 7), ch = 2 * kk + (mi & 1);
          uint32_t r[4];
          ldmatrix_x4(r, bst + (sl * 8 + (ch ^ (sl & 7))) * 16);
          b[2 * h][0] = r[0], b[2 * h][1] = r[1], b[2 * h + 1][0] = r[2], b[2 * h + 1][1] = r[3];
        }
        // Weight fragments: rows g and g + 8 of each 16-row tile; actual columns 16 kk + 4 t .. + 3 (two bytes).
        uint32_t af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const int base = GATE_UP ? mt * (kTc2Rows / 2) + 16 * wm : 32 * wm + 16 * mt;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int tr = base + g + 8 * hh;
            const uint32_t two = *reinterpret_cast<const uint16_t*>(st + tr * (kTc2K / 2) + 8 * kk + 2 * t);
            const uint32_t scv = sc[mt][hh][kk >> 1];            // 16-column block kk lies in 32-block kk / 2
            af[mt][hh] = bf16x2_mul(lut[two & 0xFFu], scv);      // columns 4t, 4t+1 -> stored 2t, 2t+1
            af[mt][2 + hh] = bf16x2_mul(lut[two >> 8], scv);     // columns 4t+2, 4t+3 -> stored 2t+8, 2t+9
          }
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_bf16_16816(acc[mt][j], af[mt], b[j][0], b[j][1]);
      }
    }
    cp_async_wait<0>();
    tc_grouped_store<GATE_UP>(a, acc, s0, ns, wn * 32, t, R, [&](int mt, int h) {
      return GATE_UP ? r0 + 16 * wm + g + 8 * h : r0 + 32 * wm + 16 * mt + g + 8 * h;
    });
  }
}
