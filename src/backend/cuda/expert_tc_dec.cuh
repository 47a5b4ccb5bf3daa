// Decode (one token) routed MXFP4 experts on the tensor cores, official numerics (QA8 activations). WIP: written
// without a GPU; tools/emu/expert_tc_dec_fragments.py checks the index math.
//
// Why: the ring expert kernels (gemv_ring.cuh) spend ~135 instructions per 16-byte FP4 chunk (E2M1 decode to fp32,
// 32 FMAs, 8 activation loads) and ncu found them issue-bound at ~1.8 TB/s (gate/up) and ~1.2 TB/s (down). Here a
// warp's 16 weight rows x 128 columns step becomes 8 mma.sync m16n8k16 (f16, fp32 accumulation) fed by E2M1 -> f16
// pairs (e2m1_pair: 3 instructions per two weights, values x 2^-14) and a pre-permuted f16 activation row.
// Exactness: E2M1 x 2^-14 and the QA8 E4M3 values q are exact in f16, products exact in fp32; each 32-column block's
// MMA sum is scaled by 2^14 * (E8M0 weight scale) * (QA8 block scale), powers of two, into an fp32 accumulator. The
// result is the ring kernels' function up to fp32 summation order.
//
// Fragment mapping (per 32-column chunk c, thread (g, t) = (lane / 4, lane % 4)): the thread reads 32-bit word t of
// chunk c of tile rows g and g + 8 (8 nibbles = actual columns 8t .. 8t + 7 of the chunk). MMA 1 takes the nibble
// pairs (0, 4) as A slots (2t, 2t + 1) and (1, 5) as slots (2t + 8, 2t + 9); MMA 2 the pairs (2, 6) and (3, 7). The
// activation is staged as f16 in the order (0, 4, 1, 5, 2, 6, 3, 7) within every 8 columns, so lane t < 4 (the only
// column n = 0 of B; other lanes hold zeros) loads its 4 B registers for both MMAs with one 16-byte read.
// Tiles: gate/up = 8 intermediate rows of one slot (tile rows 0..7 = w1, 8..15 = w3: g and u of a row meet in the
// thread holding column 0 of rows g and g + 8); down = 16 rows of w2 of one slot.
// Included INSIDE kernels.cu's anonymous namespace, after gemv_tc.cuh (mma_f16_16816, cp_async*, pdl_wait).
#pragma once

constexpr int kEtThreads = 512;
constexpr int kEtWarps = kEtThreads / 32;
constexpr int kEtS = 8;                    // ring stages per warp (7 steps of 1 KB in flight)
constexpr int kEtStepW = 16 * 4 * 16;      // weight bytes per step: 16 rows x 4 chunks x 16 B
constexpr int kEtStepS = 16 * 4;           // scale bytes per step: 16 rows x 4 chunks
constexpr int kEtStep = kEtStepW + kEtStepS;
constexpr size_t kEtRingBytes = static_cast<size_t>(kEtWarps) * kEtS * kEtStep;  // 136 KB

__device__ __forceinline__ uint32_t e2m1x2_f16x2(uint32_t w) {  // nibbles 0 and 4 of w -> f16 pair (x 2^-14)
  return ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
}

template <bool GATE_UP>
__global__ void __launch_bounds__(kEtThreads, 1) expert_tc_dec_kernel(ExpertArgs a) {
  pdl_wait();
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ DevExpert ex[kTilesMaxK];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, k = a.k;
  const int64_t K = GATE_UP ? a.d : a.I, nxr = GATE_UP ? 1 : k;  // staged activation rows
  uint8_t* ring = smem + static_cast<size_t>(warp) * kEtS * kEtStep;
  __half* xq = reinterpret_cast<__half*>(smem + kEtRingBytes);
  float* xsc = reinterpret_cast<float*>(xq + nxr * K);
  if (tid < k) ex[tid] = a.table[a.sel[tid]];
  __syncthreads();
  const int64_t per_slot = GATE_UP ? a.I / 8 : a.d / 16, ntiles = per_slot * k;
  const int ks = static_cast<int>(K / 128);  // steps per tile
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kEtWarps + warp, nw = static_cast<int64_t>(gridDim.x) * kEtWarps;
  const int64_t steps = gw < ntiles ? ((ntiles - gw + nw - 1) / nw) * ks : 0;
  const int64_t rb = K / 2, sb = GATE_UP ? a.sb1 : a.sb2;  // bytes per weight row / scale row
  // Tile row r (0..15) of tile tt: weight row and scale row pointers.
  auto rows_of = [&](int64_t tt, int r, const uint8_t*& w, const uint8_t*& s) {
    const int j = static_cast<int>(tt / per_slot);
    const int64_t rt = tt - j * per_slot;
    const DevExpert& E = ex[j];
    if (GATE_UP) {
      const int64_t row = 8 * rt + (r & 7);
      w = static_cast<const uint8_t*>(r < 8 ? E.w1 : E.w3) + row * rb;
      s = static_cast<const uint8_t*>(r < 8 ? E.s1 : E.s3) + row * sb;
    } else {
      const int64_t row = 16 * rt + r;
      w = static_cast<const uint8_t*>(E.w2) + row * rb;
      s = static_cast<const uint8_t*>(E.s2) + row * sb;
    }
  };
  // Load cursor: this lane copies weight pieces lane and lane + 32 (row piece / 4, chunk piece % 4) and, lanes < 16,
  // the 4 scale bytes of row lane.
  int64_t lt = gw;
  int lk = 0, lslot = 0;
  const uint8_t *lw0 = nullptr, *lw1 = nullptr, *ls = nullptr;
  auto load_rows = [&]() {
    const uint8_t* s0;
    rows_of(lt, lane >> 2, lw0, s0);
    rows_of(lt, (lane >> 2) + 8, lw1, s0);
    if (lane < 16) rows_of(lt, lane, s0, ls);
  };
  if (steps > 0) load_rows();
  // Piece (row r, chunk c) sits at 16 * (4 r + (c ^ ((r >> 1) & 3))): the 32 lanes' 4-byte reads of one chunk column
  // (rows g, words t) then hit 32 different banks (unswizzled: 4-way conflicts on every read).
  auto piece = [](int r, int c) { return 16 * (4 * r + (c ^ ((r >> 1) & 3))); };
  auto issue = [&]() {
    uint8_t* slot = ring + lslot * kEtStep;
    const int64_t off = static_cast<int64_t>(lk) * 64 + (lane & 3) * 16;  // chunk 4 lk + lane % 4
    cp_async16(slot + piece(lane >> 2, lane & 3), lw0 + off);
    cp_async16(slot + piece((lane >> 2) + 8, lane & 3), lw1 + off);
    if (lane < 16) cp_async4(slot + kEtStepW + lane * 4, ls + 4 * lk);
    lslot = lslot + 1 == kEtS ? 0 : lslot + 1;
    if (++lk == ks) {
      lk = 0;
      lt += nw;
      if (lt < ntiles) load_rows();
    }
  };
#pragma unroll
  for (int p = 0; p < kEtS - 1; ++p) {
    if (p < steps) issue();
    cp_async_commit();
  }
  if (GATE_UP) {
    stage_x_qa8_f16<true>(a.x, a.d, xq, xsc);
  } else {
    for (int j = 0; j < k; ++j) stage_x_qa8_f16<true>(a.act_q + static_cast<int64_t>(j) * a.I, a.I, xq + j * a.I, xsc + j * (a.I / 128));
  }
  __syncthreads();
  int64_t ct = gw;
  int ck = 0, cslot = 0;
  int j = static_cast<int>(ct / per_slot);  // the compute tile's slot (updated when the tile changes)
  float acc0 = 0.0f, acc8 = 0.0f;  // rows g and g + 8, column 0 (lanes t == 0)
  for (int64_t st = 0; st < steps; ++st) {
    __syncwarp();  // every lane is done reading the slot the next copies overwrite (read in the previous step)
    if (st + kEtS - 1 < steps) issue();
    cp_async_commit();
    cp_async_wait<kEtS - 1>();
    __syncwarp();  // other lanes' copies of this step are read below
    const uint8_t* slot = ring + cslot * kEtStep;
    const __half* xrow = xq + (GATE_UP ? 0 : static_cast<int64_t>(j) * a.I) + static_cast<int64_t>(ck) * 128;
    const float xs = xsc[(GATE_UP ? 0 : j * (a.I / 128)) + ck] * 16384.0f;  // with the E2M1 pairs' 2^14
    const uint32_t sg = *reinterpret_cast<const uint32_t*>(slot + kEtStepW + g * 4);
    const uint32_t sg8 = *reinterpret_cast<const uint32_t*>(slot + kEtStepW + (g + 8) * 4);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t wg = *reinterpret_cast<const uint32_t*>(slot + piece(g, c) + 4 * t);
      const uint32_t wg8 = *reinterpret_cast<const uint32_t*>(slot + piece(g + 8, c) + 4 * t);
      uint4 xb = make_uint4(0u, 0u, 0u, 0u);
      if (g == 0) xb = *reinterpret_cast<const uint4*>(xrow + 32 * c + 8 * t);
      float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const uint32_t a1[4] = {e2m1x2_f16x2(wg), e2m1x2_f16x2(wg8), e2m1x2_f16x2(wg >> 4), e2m1x2_f16x2(wg8 >> 4)};
      mma_f16_16816(cc, a1, xb.x, xb.y);
      const uint32_t a2[4] = {e2m1x2_f16x2(wg >> 8), e2m1x2_f16x2(wg8 >> 8), e2m1x2_f16x2(wg >> 12), e2m1x2_f16x2(wg8 >> 12)};
      mma_f16_16816(cc, a2, xb.z, xb.w);
      const float f0 = e8m0_dev((sg >> (8 * c)) & 0xFFu) * xs;
      const float f8 = e8m0_dev((sg8 >> (8 * c)) & 0xFFu) * xs;
      acc0 = fmaf(cc[0], f0, acc0);
      acc8 = fmaf(cc[2], f8, acc8);
    }
    cslot = cslot + 1 == kEtS ? 0 : cslot + 1;
    if (++ck == ks) {
      if (t == 0) {
        const int64_t rt = ct - static_cast<int64_t>(j) * per_slot;
        if (GATE_UP) {
          const int64_t r = 8 * rt + g;
          float gv = acc0, uv = acc8;
          if (a.official) gv = bf16r(gv), uv = bf16r(uv);
          a.act[static_cast<int64_t>(j) * a.I + r] = swiglu1(gv, uv, a.limit, a.wts ? a.wts[j] : 1.0f, a.official);
        } else {
          const int64_t r = 16 * rt + g;
          a.y[static_cast<int64_t>(j) * a.d + r] = a.official ? bf16r(acc0) : acc0;
          a.y[static_cast<int64_t>(j) * a.d + r + 8] = a.official ? bf16r(acc8) : acc8;
        }
      }
      acc0 = acc8 = 0.0f;
      ck = 0;
      ct += nw;
      if (ct < ntiles) j = static_cast<int>(ct / per_slot);
    }
  }
  cp_async_wait<0>();
}
