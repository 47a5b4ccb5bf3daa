// Decode (one token) routed MXFP4 experts on FP8 tensor-core MMAs: the routed walk of expert_ring_kernel when the
// activation is QA8-quantized while staging (official numerics); by default (DSV4_SHARED_MMA=0: off) the fused shared
// expert's FP8 walk too (W8 below).
//
// Why: the ring walk (ring_walk + chunk_dot_s) decodes every E2M1 weight to fp32 and multiplies it on the FMA pipe:
// ~135 instructions per 16-byte chunk, and the FP4 probe (tools/gpu/probes/fp4_dequant_probe.cu) measured that decode
// alone at 14 B/cycle/SM -- the decode experts ran issue-bound at 1.4-2 TB/s (~60 us of a ~190 us layer). Here an
// E2M1 nibble becomes an E4M3 byte with two shifts and two masks per 4 weights (the 3 magnitude bits land on E4M3's
// low exponent bits and top mantissa bit, so E4M3's own subnormals line up with E2M1's: value x 2^-6), and one
// mma.sync m16n8k32 (E4M3 x E4M3, fp32 accumulation) takes 16 rows x 32 columns: ~25 instructions per 512 weights
// and lane instead of ~270.
//
// Exactness: E2M1 x 2^-6 and the QA8 codes are exact in E4M3, so every product is exact; each MMA covers exactly one
// 32-column block of one row (one E8M0 weight scale) inside one 128-column QA8 block (one activation scale), and its
// sum is scaled by 2^6 x the two power-of-two scales into an fp32 accumulator per row. That is the ring kernels'
// function up to the summation order and the tensor core's internal accumulation of the 32 products (the op test
// bounds the difference); the outputs are BF16-rounded as before.
//
// Layout: a tile is 16 weight rows (gate/up: 8 intermediate rows of w1 then the same 8 of w3; down: 16 rows of w2),
// walked CPS chunks (32 CPS columns) per step through a per-warp ring of cp.async copies (MmaCfg; each lane copies
// chunks lane % 4 (+ 4) of rows lane / 4 and lane / 4 + 8, lanes < 16 the CPS scale bytes of row lane). ldmatrix.x4 then hands
// lane (g, t) word t of rows g and g + 8 of two chunks: MMA A slots k = 4t..4t+3 take the word's even nibbles (weights
// 8t, 8t+2, 8t+4, 8t+6 of the chunk), k = 4t+16..4t+19 its odd ones, so the activation is staged as E4M3 codes in
// that order (per 8 columns: the 4 even ones, then the 4 odd ones) and lane t reads its 8 bytes with one load. Only
// column 0 of B / D is meaningful (one token); every lane loads the same B so no column holds garbage codes.
// Included INSIDE kernels.cu's anonymous namespace (via gemv_ring.cuh: cp_async*, pdl_wait, bf16r, swiglu1, e8m0_dev).
#pragma once

// CPS: 16-byte chunks per row and step: 4 for the MXFP4 walk (128 columns), 8 for the FP8 walk (W8, 128 columns);
// the ring keeps the same bytes (8 steps of 1 KB or 4 of 2 KB, plus scales).
template <int CPS>
struct MmaCfg {
  static constexpr int S = CPS == 4 ? 8 : 4;       // ring steps per warp (S - 1 in flight)
  static constexpr int StepW = 16 * CPS * 16;      // weight bytes per step: 16 rows x CPS chunks x 16 B
  static constexpr int Step = StepW + 16 * CPS;    // + 16 rows x CPS E8M0 scale bytes
  static constexpr size_t WarpBytes = static_cast<size_t>(S) * Step;
  // Byte offset of (row r, chunk c) in a step's weights, chunks swizzled so that the 8 rows one ldmatrix matrix reads
  // (one chunk) fall in 8 different 16-byte bank groups: rows 64 B apart (CPS 4) or 128 B apart (CPS 8).
  __device__ static __forceinline__ int piece(int r, int c) {
    return CPS == 4 ? tile_piece(r, c) : 128 * r + 16 * (c ^ (r & 7));  // tile_piece: expert_tiles.h
  }
};
constexpr size_t kMmaWarpBytes = MmaCfg<4>::WarpBytes > MmaCfg<8>::WarpBytes ? MmaCfg<4>::WarpBytes : MmaCfg<8>::WarpBytes;
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))), "l"(src) : "memory");
}

// E2M1 nibbles 0, 2, 4, 6 (lo) and 1, 3, 5, 7 (hi) of w as E4M3 bytes (value x 2^-6).
__device__ __forceinline__ uint32_t e2m1_lo_e4m3(uint32_t w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }
__device__ __forceinline__ uint32_t e2m1_hi_e4m3(uint32_t w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

// The f16 walk (F16 below, DSV4_EXPERT_F16): E2M1 nibbles i and i + 4 of w (weights 8t + i and 8t + i + 4 of the
// lane's word t) as one f16x2, value x 2^-14: the nibble's 3 magnitude bits go to the half's bits 9..11 (the low two
// exponent bits and the top mantissa bit) and its sign to bit 15, so f16's subnormals line up with E2M1's as E4M3's do
// above. Two shifts and a LOP3 per pair, all integer-pipe work the emulated E4M3 MMA's F2FP unpacks (A and B, ~40 % of
// the walk's instructions, docs/BENCHMARKS.md session 10) no longer need: the activation is staged as f16 once.
template <int I>
__device__ __forceinline__ uint32_t e2m1_pair_f16(uint32_t w) {
  if constexpr (I == 3) return ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);
  else return ((w << (9 - 4 * I)) & 0x0E000E00u) | ((w << (12 - 4 * I)) & 0x80008000u);
}
__device__ __forceinline__ void mma_f16_16816_acc(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
}
// One warp's QA8 of a 128-block from lane l's columns 4 l .. 4 l + 3 (v): two E4M3 pairs (e01, e23) and the block's
// power-of-two scale s -- stage_x's arithmetic, shared by the stagings below. qa8_e4m3_lane loads v from x itself;
// stage_qa8_blocks loads several blocks' v first, so that their round trips overlap.
__device__ __forceinline__ void qa8_e4m3_v(const float4 v, __nv_fp8x2_storage_t& e01, __nv_fp8x2_storage_t& e23, float& s) {
  const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
  const float inv = 1.0f / s;
  auto q = [inv](float a) { return fminf(fmaxf(a * inv, -448.0f), 448.0f); };
  e01 = __nv_cvt_float2_to_fp8x2(make_float2(q(v.x), q(v.y)), __NV_SATFINITE, __NV_E4M3);
  e23 = __nv_cvt_float2_to_fp8x2(make_float2(q(v.z), q(v.w)), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ void qa8_e4m3_lane(const float* __restrict__ x, __nv_fp8x2_storage_t& e01,
                                              __nv_fp8x2_storage_t& e23, float& s) {
  const int lane = threadIdx.x & 31;
  qa8_e4m3_v(__ldg(reinterpret_cast<const float4*>(x) + lane), e01, e23, s);
}
// One warp's QA8 result of a 128-block written as natural-order E4M3 codes (codes: the block's 128 bytes) and its
// scale (stage_x_e4m3<true>), or in the f16 walk's MMA order (put_f16p: the block's 128 halves; stage_x_f16p).
__device__ __forceinline__ void put_e4m3_nat(__nv_fp8x2_storage_t e01, __nv_fp8x2_storage_t e23, float s, uint8_t* codes,
                                             float* scale) {
  const int lane = threadIdx.x & 31;
  *reinterpret_cast<uint32_t*>(codes + lane * 4) = static_cast<uint32_t>(e01) | (static_cast<uint32_t>(e23) << 16);
  if (lane == 0) *scale = s;
}
// QA8 of x[0, len) (len % 128 == 0) as E4M3 codes in the MMA order (see above) and each 128-block's power-of-two
// scale: codes[b * 128 + ...], scales[b]; q * scale is exactly stage_x's QA8 value. All threads of the block.
// NAT (the FP8 walk): the codes in their natural column order instead.
template <bool NAT = false>
__device__ __forceinline__ void stage_x_e4m3(const float* __restrict__ x, int64_t len, uint8_t* codes, float* scales) {
  const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int64_t b = threadIdx.x >> 5; b < len / 128; b += nw) {
    __nv_fp8x2_storage_t e01, e23;
    float s;
    qa8_e4m3_lane(x + b * 128, e01, e23, s);
    if constexpr (NAT) {
      put_e4m3_nat(e01, e23, s, codes + b * 128, scales + b);
      continue;
    }
    // Columns 4 lane .. 4 lane + 3 = positions j0..j0+3 of an 8-column group (j0 = 0 or 4): evens go to the group's
    // first 4 bytes, odds to its last 4.
    uint8_t* grp = codes + b * 128 + (lane >> 1) * 8;
    const int h = (lane & 1) * 2;  // even slots h, h + 1 (and odd slots 4 + h, 5 + h)
    const uint32_t lo = e01 & 0xFFu, hi = e23 & 0xFFu, lo1 = (e01 >> 8) & 0xFFu, hi1 = (e23 >> 8) & 0xFFu;
    *reinterpret_cast<uint16_t*>(grp + h) = static_cast<uint16_t>(lo | (hi << 8));
    *reinterpret_cast<uint16_t*>(grp + 4 + h) = static_cast<uint16_t>(lo1 | (hi1 << 8));
    if (lane == 0) scales[b] = s;
  }
}

__device__ __forceinline__ void put_f16p(__nv_fp8x2_storage_t e01, __nv_fp8x2_storage_t e23, float s, __half* codes,
                                         float* scale) {
  const int lane = threadIdx.x & 31;
  const __half2_raw h01 = __nv_cvt_fp8x2_to_halfraw2(e01, __NV_E4M3), h23 = __nv_cvt_fp8x2_to_halfraw2(e23, __NV_E4M3);
  // This lane: columns 4 (lane & 1) + 0..3 of its 8-column group; the partner lane (lane ^ 1) the other four.
  const uint32_t mine01 = static_cast<uint32_t>(h01.x) | (static_cast<uint32_t>(h01.y) << 16);
  const uint32_t mine23 = static_cast<uint32_t>(h23.x) | (static_cast<uint32_t>(h23.y) << 16);
  const uint32_t o01 = __shfl_xor_sync(0xffffffffu, mine01, 1), o23 = __shfl_xor_sync(0xffffffffu, mine23, 1);
  // Each f16x2 written pairs column c of the even lane with column c of the odd lane: the even lane writes
  // positions 0..3 = (0, 4), (2, 6), the odd lane positions 4..7 = (1, 5), (3, 7) -- so that each MMA's two B
  // registers are consecutive words of the walk's 16-byte load (with (0, 4), (1, 5), (2, 6), (3, 7) ptxas copied
  // every B pair into adjacent registers first: ~13 moves per step, ncu SASS, session 29).
  const bool odd = lane & 1;
  uint32_t w0, w1;
  if (!odd) {
    w0 = (mine01 & 0xFFFFu) | (o01 << 16), w1 = (mine23 & 0xFFFFu) | (o23 << 16);
  } else {
    w0 = (o01 >> 16) | (mine01 & 0xFFFF0000u), w1 = (o23 >> 16) | (mine23 & 0xFFFF0000u);
  }
  *reinterpret_cast<uint2*>(codes + (lane >> 1) * 8 + (odd ? 4 : 0)) = make_uint2(w0, w1);
  if (lane == 0) *scale = s;
}
// QA8 of x[0, len) as f16 values of the E4M3 codes (exact) for the f16 walk, in its MMA order: per 8 columns
// 0, 4, 2, 6, 1, 5, 3, 7 (the k order of the two m16n8k16 MMAs a lane's word feeds, see mma_walk), so lane t reads its
// chunk's 8 values with one 16-byte load; scales[b] as stage_x_e4m3's. All threads of the block.
__device__ __forceinline__ void stage_x_f16p(const float* __restrict__ x, int64_t len, __half* codes, float* scales) {
  const int nw = blockDim.x >> 5;
  for (int64_t b = threadIdx.x >> 5; b < len / 128; b += nw) {
    __nv_fp8x2_storage_t e01, e23;
    float s;
    qa8_e4m3_lane(x + b * 128, e01, e23, s);
    put_f16p(e01, e23, s, codes + b * 128, scales + b);
  }
}
// The decode expert launches' QA8 stagings as one pass (expert_ring_kernel's batch): `count` 128-blocks, block i read
// from src(i) (128 floats) and written by put(i, e01, e23, s); warp w takes blocks w, w + warps, ... and requests up
// to kStageBatch of them before quantizing any, so their L2 round trips overlap (the per-row stagings above wait out
// one round trip per block: ~7 in a row per warp in down's, before its first MMA). Each block's QA8 is the same
// arithmetic whichever warp does it: the same bits as the stagings above.
constexpr int kStageBatch = 8;
// cg: the blocks read through L2 (ld.global.cg), past any L1 line -- for a read before griddepcontrol.wait of data an
// earlier kernel wrote (ExpertArgs::x_early).
template <typename Src, typename Put>
__device__ __forceinline__ void stage_qa8_blocks(int count, Src src, Put put, bool cg = false) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int base = warp; base < count; base += kStageBatch * nw) {
    float4 v[kStageBatch];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int i = base + u * nw;
      const float4* p = reinterpret_cast<const float4*>(src(i)) + lane;
      if (i < count) v[u] = cg ? __ldcg(p) : __ldg(p);
    }
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int i = base + u * nw;
      if (i < count) {
        __nv_fp8x2_storage_t e01, e23;
        float s;
        qa8_e4m3_v(v[u], e01, e23, s);
        put(i, e01, e23, s);
      }
    }
  }
}

// The walk of one warp: tiles gw, gw + nw, ... of ntiles (16-row tiles), K columns each. W8 (the shared expert; DSV4_SHARED_MMA=0: not used):
// FP8 E4M3 weights with fp32 128x128 block scales (the shared expert): no conversion, ldmatrix words go straight into
// the MMA (k = 4t.. of chunk 2m, 4t+16.. of chunk 2m+1: the activation codes in natural order, stage_x_e4m3<true>),
// one weight scale per row and 128-column step (CPS = 8 chunks of 16 columns); rows_of's scale pointer is then the
// row's fp32 scale row (one float per 128 columns).
// rows_of(t, r, w, s): weight and scale row pointers of tile row r (0..15); xcode(t) / xscale(t): the tile's staged
// codes and scales; flush(t, v0, v8): the epilogue with tile rows g and g + 8 (lanes t == 0 hold them: lane g * 4).
// parts > 1 (fewer tiles than warps: the shared expert's 256 16-row tiles, or the routed tiles of a TP2 rank's
// half-width experts, for ~2,100 warps): the `parts` warps of a group (warps parts x group .. + parts - 1 of the
// block, all walking the same tiles) take K part `part` of K / parts columns each, and the part-0 warp flushes the
// parts' sum, added in part order (deterministic) after named barrier bar0 + group of the group. Callers give
// walks that can run at the same time in one block (the shared and the routed walk) disjoint barrier ids.
// Like ring_walk: the first S - 1 steps' copies are issued before stage() (and before pdl_wait() when
// WAIT_AFTER_PROLOGUE); every thread of the block must call it (barrier) -- unless !sync: then stage() must be a
// no-op whose data an earlier barrier already published (a second walk whose input the first walk staged).
// TILED (the routed MXFP4 walk only): rows_of(t) instead returns tile t's tile-major copy (expert_tiles.h: block
// (t, 0); the blocks of its steps follow one another), and a step's 1,088 bytes -- already in the slot's layout --
// are copied with 2-3 coalesced 16-byte copies per lane instead of the 16 rows' pieces and scale words.
// F16 (the routed MXFP4 walk only; DSV4_EXPERT_F16, default): each 32-column chunk as two f16 m16n8k16 MMAs --
// nibbles i and i + 4 of the lane's words in A (e2m1_pair_f16), the activation staged by stage_x_f16p (xcode(t) then
// points at f16 values) -- instead of one emulated E4M3 m16n8k32: the same products (E2M1 x 2^-14 and the QA8 codes
// are exact in f16), the even nibbles in the first MMA and the odd ones in the second (the E4M3 MMA's two k halves),
// each chunk's sum scaled by 2^14 x the two power-of-two scales. The same function up to the tensor core's order
// inside an MMA (the op test compares it with the E4M3 walk).
template <bool WAIT_AFTER_PROLOGUE, int CPS, bool W8, bool TILED, bool F16 = false, typename RowsOf, typename XCode,
          typename XScale, typename Flush, typename Stage>
__device__ __forceinline__ void mma_walk(int64_t gw, int64_t nw, int64_t ntiles, int64_t K, uint8_t* ring,
                                         RowsOf rows_of, XCode xcode, XScale xscale, Flush flush, Stage stage,
                                         int parts = 1, int part = 0, int group = 0, int bar0 = 1, bool sync = true) {
  using M = MmaCfg<CPS>;
  static_assert(!W8 || CPS == 8, "the FP8 walk takes 128 columns (8 chunks) per step");
  static_assert(!TILED || (CPS == 4 && !W8 && M::Step == kTileStepBytes), "tile-major blocks are the MXFP4 slot");
  static_assert(!F16 || (CPS == 4 && !W8), "the f16 walk is the routed MXFP4 walk");
  constexpr int kS = M::S, kCols = CPS * (W8 ? 16 : 32);  // columns per step
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t col0 = part * (K / parts);  // this warp's first column
  const int64_t wb0 = W8 ? col0 : col0 / 2, sb0 = W8 ? 4 * (col0 / 128) : col0 / 32;  // its weight / scale byte offsets
  const int ks = static_cast<int>(K / parts / kCols);
  const int64_t steps = gw < ntiles ? ((ntiles - gw + nw - 1) / nw) * ks : 0;
  int64_t lt = gw;
  int lk = 0, lslot = 0;
  const uint8_t *lw0 = nullptr, *lw1 = nullptr, *ls = nullptr;
  auto load_rows = [&]() {
    if constexpr (TILED) {
      lw0 = rows_of(lt) + (col0 / 128) * kTileStepBytes;  // this part's first step
    } else {
      const uint8_t* unused;
      rows_of(lt, g, lw0, unused);
      rows_of(lt, g + 8, lw1, unused);
      if (lane < 16) rows_of(lt, lane, unused, ls);
      lw0 += wb0, lw1 += wb0;
      if (lane < 16) ls += sb0;
    }
  };
  if (steps > 0) load_rows();
  auto issue = [&]() {
    uint8_t* slot = ring + lslot * M::Step;
    if constexpr (TILED) {
      const uint8_t* src = lw0 + static_cast<int64_t>(lk) * kTileStepBytes;
      cp_async16(slot + lane * 16, src + lane * 16);
      cp_async16(slot + 512 + lane * 16, src + 512 + lane * 16);
      if (lane < 4) cp_async16(slot + 1024 + lane * 16, src + 1024 + lane * 16);
    }
#pragma unroll
    for (int i = 0; i < (TILED ? 0 : CPS / 4); ++i) {
      const int c = t4 + 4 * i;
      const int64_t off = static_cast<int64_t>(lk) * (16 * CPS) + c * 16;  // chunk CPS lk + c
      cp_async16(slot + M::piece(g, c), lw0 + off);
      cp_async16(slot + M::piece(g + 8, c), lw1 + off);
    }
    if (!TILED && lane < 16) {
      if constexpr (W8 || CPS == 4) cp_async4(slot + M::StepW + lane * 4, ls + 4 * lk);  // W8: the step's fp32 scale
      else cp_async8(slot + M::StepW + lane * 8, ls + 8 * lk);
    }
    lslot = lslot + 1 == kS ? 0 : lslot + 1;
    if (++lk == ks) {
      lk = 0;
      lt += nw;
      if (lt < ntiles) load_rows();
    }
  };
  __syncwarp();  // a walk before this one in the same ring memory has been read by every lane of the warp
#pragma unroll 1  // one copy of issue() here: the prologue runs once per walk; unrolled, its 7 copies cost icache room
  for (int p = 0; p < kS - 1; ++p) {
    if (p < steps) issue();
    cp_async_commit();
  }
  if constexpr (WAIT_AFTER_PROLOGUE) pdl_wait();
  stage();
  if (sync) __syncthreads();
  int64_t ct = gw;
  int ck = 0, cslot = 0;
  float acc0 = 0.0f, acc8 = 0.0f;
  // The tile's staged activation codes and scales, fetched once per tile: xcode / xscale may divide (the down walk's
  // slot of tile t), which was an int64 division every step (hoisting it and the prologue change below: -2 to -4 us
  // per layer, docs/BENCHMARKS.md session 12).
  const uint8_t* xct = steps > 0 ? xcode(ct) : nullptr;
  const float* xst = steps > 0 ? xscale(ct) : nullptr;
  // ldmatrix row addresses: lane i gives row (i % 8) + 8 * ((i / 8) & 1) of chunk (i / 16) (+ 2 for the second x4).
  const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lch = lane >> 4;
  for (int64_t st = 0; st < steps; ++st) {
    __syncwarp();  // every lane has read the slot the next copies overwrite (it was read one step ago)
    if (st + kS - 1 < steps) issue();
    cp_async_commit();
    cp_async_wait<kS - 1>();
    __syncwarp();  // the other lanes' copies of this step are visible
    const uint8_t* slot = ring + cslot * M::Step;
    if constexpr (W8) {
      const uint8_t* xc = xct + col0 + static_cast<int64_t>(ck) * 128 + t4 * 4;
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int p = 0; p < 4; ++p) {  // MMA p: chunks 2p (k 4t..) and 2p + 1 (k 4t + 16..), 16 columns each
        uint32_t w[4];
        ldmatrix_x4(w, slot + M::piece(lrow, lch + 2 * p));
        mma_e4m3_16832(d, w[0], w[1], w[2], w[3], *reinterpret_cast<const uint32_t*>(xc + 32 * p),
                       *reinterpret_cast<const uint32_t*>(xc + 32 * p + 16));
      }
      const float xsf = xst[col0 / 128 + ck];
      acc0 = fmaf(d[0], *reinterpret_cast<const float*>(slot + M::StepW + g * 4) * xsf, acc0);
      acc8 = fmaf(d[2], *reinterpret_cast<const float*>(slot + M::StepW + (g + 8) * 4) * xsf, acc8);
    } else {
      // F16: lane t's 8 staged f16 values of chunk c are 16 bytes at 64 c (stage_x_f16p's order 0, 4, 2, 6, 1, 5, 3,
      // 7: the first MMA's B in words x, y, the second's in z, w); E4M3: its 8 codes, 8 bytes at 32 c.
      const uint8_t* xc = xct + (F16 ? 2 : 1) * (col0 + static_cast<int64_t>(ck) * (32 * CPS)) + t4 * (F16 ? 16 : 8);
      const float* xsc = xst + col0 / 128 + static_cast<int64_t>(ck) * (CPS / 4);
#pragma unroll
      for (int p = 0; p < CPS / 2; ++p) {  // chunks 2p and 2p + 1
        uint32_t w[4];
        ldmatrix_x4(w, slot + M::piece(lrow, lch + 2 * p));  // rows g, g+8 of both chunks: {c g, c g8, c+1 g, c+1 g8}
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = 2 * p + h;
          const uint32_t wg = w[2 * h], wg8 = w[2 * h + 1];
          uint4 xb4;
          uint2 xb2;
          if constexpr (F16) xb4 = *reinterpret_cast<const uint4*>(xc + 64 * c);
          else xb2 = *reinterpret_cast<const uint2*>(xc + 32 * c);
          const uint8_t sgb = slot[M::StepW + g * CPS + c], sg8b = slot[M::StepW + (g + 8) * CPS + c];
          // With the E2M1 -> f16 factor 2^14, or the E2M1 -> E4M3 factor 2^6.
          const float xsf = xsc[c / 4] * (F16 ? 16384.0f : 64.0f);
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if constexpr (F16) {
            const uint4 xb = xb4;
            // A fragments (m16n8k16): {row g k 2t.., row g+8 k 2t.., row g k 2t+8.., row g+8 k 2t+8..}.
            mma_f16_16816_acc(d, e2m1_pair_f16<0>(wg), e2m1_pair_f16<0>(wg8), e2m1_pair_f16<2>(wg), e2m1_pair_f16<2>(wg8),
                              xb.x, xb.y);
            mma_f16_16816_acc(d, e2m1_pair_f16<1>(wg), e2m1_pair_f16<1>(wg8), e2m1_pair_f16<3>(wg), e2m1_pair_f16<3>(wg8),
                              xb.z, xb.w);
          } else {
            const uint2 xb = xb2;
            mma_e4m3_16832(d, e2m1_lo_e4m3(wg), e2m1_lo_e4m3(wg8), e2m1_hi_e4m3(wg), e2m1_hi_e4m3(wg8), xb.x, xb.y);
          }
          acc0 = fmaf(d[0], e8m0_dev(sgb) * xsf, acc0);
          acc8 = fmaf(d[2], e8m0_dev(sg8b) * xsf, acc8);
        }
      }
    }
    cslot = cslot + 1 == kS ? 0 : cslot + 1;
    if (++ck == ks) {
      if (parts == 1) {
        if (t4 == 0) flush(ct, acc0, acc8);
      } else {
        __shared__ float red[16][16];  // [warp of the block = parts x group + part][tile row]
        float(*mine)[16] = red + parts * group;
        if (t4 == 0) mine[part][g] = acc0, mine[part][g + 8] = acc8;
        asm volatile("bar.sync %0, %1;" ::"r"(bar0 + group), "r"(32 * parts) : "memory");  // the group has written
        if (part == 0 && t4 == 0) {
          float v0 = 0.0f, v8 = 0.0f;
          for (int q = 0; q < parts; ++q) v0 += mine[q][g], v8 += mine[q][g + 8];
          flush(ct, v0, v8);
        }
        asm volatile("bar.sync %0, %1;" ::"r"(bar0 + group), "r"(32 * parts) : "memory");  // ... and read before the next tile's writes
      }
      acc0 = acc8 = 0.0f;
      ck = 0;
      ct += nw;
      if (st + 1 < steps) xct = xcode(ct), xst = xscale(ct);
    }
  }
  cp_async_wait<0>();
}
