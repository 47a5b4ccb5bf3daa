// mHC kernels (GPU_KERNELS.md §6.7, MODEL.md's hyper-connections): the pre's split mix (hc_mix*_kernel: partial dot
// products of the streams with fn per slice) and its finish (hc_finish_kernel: mix, sigmoids, Sinkhorn, collapse,
// RMSNorm), the post (hc_post_kernel) and the post fused into the next pre's mix (hc_post_mix_kernel, which can also
// sum the MoE's expert rows itself: moe_sum4), the Sinkhorn in its forms (one warp, one thread per token, a deferred
// comb finished by an extra block of a later launch: finish_deferred_comb).
// Included INSIDE kernels.cu's anonymous namespace, after the embedding kernel and before the compressor's (pdl_wait,
// cp_async*, bf16r and the block reductions come from there and from device_math.cuh).
#pragma once

__device__ __forceinline__ float sigm(float v) { return 1.0f / (1.0f + expf(-v)); }

// mHC pre, split (GPU_KERNELS.md §6.7): (1) hc_mix_kernel: grid (slices, token groups, groups of 8 mix rows), each block
// streams its slice of the nmix rows of fn once and writes partial dot products plus the partial sum of squares;
// (2) hc_finish_kernel: one block per token; warp 0 sums the partials (double), runs the sigmoids and then the
// Sinkhorn iterations while the other warps collapse the streams and apply the RMSNorm.
// A slice is a range of kHcSliceCols columns of d across all hc streams (warp s = stream s, 4 columns per lane), so
// that one block owns whole groups of the elementwise mHC post: hc_post_mix_kernel (the post fused into the next
// pre's mix) computes its slice of the new streams from the old ones alone and produces the same partials.
constexpr int kHcSliceCols = 128;  // 32 lanes x 4 columns
// Tokens per mix block (prefill): the block's fn slice (24 rows x 512 floats, in registers) serves this many tokens;
// one token per block re-read the whole 1.5 MB of fn from L2 for every token (3 GB per 2048-token chunk and call:
// hc_pre + hc_post_pre were 105 ms of a 20-layer 8K prefill). The per-token arithmetic is unchanged.
// 8 -> 32 (session 16, one H200, 20 Flash layers, 8K prefill, one run each): hc_post_pre 71.7 ms at 8, 69.8 at 32,
// 73.8 at 128, 83.6 at 2.
constexpr int kHcTokensPerBlock = 32;
// DSV4_HC_TPB=N: N tokens per mix block instead (A/B; the per-token arithmetic, hence the bits, do not change).
int hc_tokens_per_block() {
  static const int v = [] {
    const char* e = std::getenv("DSV4_HC_TPB");
    const int t = e ? std::atoi(e) : kHcTokensPerBlock;
    if (t < 1 || t > 4096) fail("DSV4_HC_TPB must be 1..4096 (got '", e ? e : "", "')");
    return t;
  }();
  return v;
}
// The mix kernel with kHcMixT tokens per barrier step (hc_mix_t_kernel; the same bits) from kHcMixT tokens, unless
// DSV4_HC_MIX_T=0 / set_hc_mix_t(false). Session 18 (one H200, 20 Flash layers, 8K prompt, one run each):
// hc_post_pre 53.8 -> 50.4 ms, prefill 16,519 -> 16,621 tok/s.
std::atomic<int> g_hc_mix_t{[] {
  const char* e = std::getenv("DSV4_HC_MIX_T");
  return e && std::string(e) == "0" ? 0 : 1;
}()};
bool hc_mix_t_on() { return g_hc_mix_t.load(std::memory_order_relaxed) == 1; }
constexpr int kHcMaxMix = 32;
constexpr int kHcPostMix = 24;  // mix rows of a non-head pre at hc <= 4: (2 + hc) * hc
static_assert(kHcPostMix <= kHcMaxMix);

__device__ __forceinline__ float hc_dot4(float4 a, float4 b) {
  // Explicit roundings: the fused and the unfused path must contract these products identically.
  return __fmaf_rn(a.w, b.w, __fmaf_rn(a.z, b.z, __fmaf_rn(a.y, b.y, __fmul_rn(a.x, b.x))));
}

// One slice's partials (rows r0 .. r0 + R - 1 of the mix, from this thread's fn values f and stream values xv; the
// sum of squares when with_ss), summed over lanes and then over the block's warps in warp order. Both mix kernels use
// it, so a pre gives bit-identical results whether or not it was fused with the post before it.
// The lane sums are a reduce-scatter butterfly (hc_rs_step): each xor step halves the values a lane carries, so the
// R + 1 sums of a token cost 31 shuffles (R + 1 <= 32; 16 + 15 for <= 16) instead of 5 per sum (the prefill mix was
// shuffle-bound: 1.34 ms per call at 8K, ncu). Every sum is formed over the same xor tree as warp_sum (offsets 16, 8,
// 4, 2, 1), so the bits are warp_sum's.
template <int N>
__device__ __forceinline__ void hc_rs_step(float* v, int lane) {  // N values -> N / 2: lane keeps its half's sums
  constexpr int h = N / 2;
  const bool up = (lane & h) != 0;
#pragma unroll
  for (int i = 0; i < h; ++i) {
    const float keep = up ? v[i + h] : v[i], send = up ? v[i] : v[i + h];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, h);
  }
}
// The warp's part: the lane's R + 1 products summed over the warp's lanes; lane l < R + 1 stores sum l at red_w[l].
template <int R>
__device__ __forceinline__ void hc_warp_partials(const float4 (&f)[R], float4 xv, float* red_w) {
  const int lane = threadIdx.x & 31;
  constexpr int V = R + 1 <= 16 ? 16 : 32;  // values per lane: the R row sums and the sum of squares (index R), padded
  static_assert(R + 1 <= 32, "one butterfly");
  float v[V];
#pragma unroll
  for (int r = 0; r < V; ++r) v[r] = r < R ? hc_dot4(f[r], xv) : (r == R ? hc_dot4(xv, xv) : 0.0f);
  if constexpr (V == 32) {
    hc_rs_step<32>(v, lane);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], 16);
  }
  hc_rs_step<16>(v, lane);
  hc_rs_step<8>(v, lane);
  hc_rs_step<4>(v, lane);
  hc_rs_step<2>(v, lane);
  const int row = lane & (V - 1);  // lane l now holds the warp's sum of value l (V = 16: lanes l and l + 16)
  if (row <= R && lane < V) red_w[row] = v[0];
}
template <int R>
__device__ __forceinline__ void hc_slice_partials(const float4 (&f)[R], float4 xv, int r0, int nmix, bool with_ss,
                                                  float (*red)[R + 1], float* out) {
  const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  hc_warp_partials<R>(f, xv, red[warp]);
  __syncthreads();
  auto over_warps = [&](int r) {
    float v = red[0][r];
    for (int w = 1; w < nwarps; ++w) v += red[w][r];
    return v;
  };
  if (threadIdx.x < R && r0 + static_cast<int>(threadIdx.x) < nmix) out[r0 + threadIdx.x] = over_warps(threadIdx.x);
  if (with_ss && threadIdx.x == R) out[kHcMaxMix] = over_warps(R);
}

// A mix block's place -- slice sl = blockIdx.y, mix rows rb .. rb + 7 (rb = 8 blockIdx.x), this thread's column e of
// the flattened streams (in the slice: inb) -- and its 8 fn rows' values there (constant weights: loaded before the
// caller's griddepcontrol.wait).
struct HcMixSlice {
  int sl, rb;
  int64_t nf, e;
  bool inb;
};
__device__ __forceinline__ HcMixSlice hc_mix_slice(const HcPreArgs& a, int nmix, float4 (&f)[8]) {
  HcMixSlice m;
  m.sl = blockIdx.y, m.rb = blockIdx.x * 8;
  const int64_t d = a.d;
  m.nf = a.hc * d;
  const int64_t j = static_cast<int64_t>(m.sl) * kHcSliceCols + (threadIdx.x & 31) * 4;
  m.e = (threadIdx.x >> 5) * d + j;
  m.inb = j < d;
  const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < 8; ++r)
    f[r] = (m.inb && m.rb + r < nmix) ? __ldg(reinterpret_cast<const float4*>(a.fn + (m.rb + r) * m.nf + m.e)) : z4;
  return m;
}

__global__ void __launch_bounds__(128) hc_mix_kernel(HcPreArgs a, int nmix, int nslices, float* partial, int tpb) {
  // pdl_wait() after the loads of fn (constant weights): they overlap the previous kernel's tail.
  // grid (mix-row groups of 8, slices, token groups): the 1.5 MB of fn is streamed by 3x more blocks than slices alone would
  // give, each thread with its 8 float4 loads in flight (the v2 kernel was latency-bound at 32 blocks).
  __shared__ float red[4][9];
  float4 f[8];
  const HcMixSlice m = hc_mix_slice(a, nmix, f);
  const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  pdl_wait();
  const int t0 = blockIdx.z * tpb, t1 = min(a.n, static_cast<int>(blockIdx.z + 1) * tpb);
  // The next token's columns are requested before this token's partials are formed (one load in flight across the
  // shuffles and barriers instead of a round trip per token: the loop was latency-bound, ~1.8 TB/s at 8K prefill).
  float4 xn = (m.inb && t0 < t1) ? *reinterpret_cast<const float4*>(a.X + t0 * m.nf + m.e) : z4;
  for (int t = t0; t < t1; ++t) {
    const float4 xv = xn;
    if (m.inb && t + 1 < t1) xn = *reinterpret_cast<const float4*>(a.X + (t + 1) * m.nf + m.e);
    float* out = partial + (static_cast<int64_t>(t) * nslices + m.sl) * (kHcMaxMix + 1);
    hc_slice_partials<8>(f, xv, m.rb, nmix, blockIdx.x == 0, red, out);
    __syncthreads();  // red is rewritten by the next token
  }
}


// hc_mix_kernel with kHcMixT tokens per block step (default; DSV4_HC_MIX_T=0 keeps hc_mix_kernel): every warp
// forms its partials of kHcMixT tokens, then ONE block barrier and the block's threads sum them over the warps (the
// per-token kernel meets at two barriers per token; ncu at an 8K prompt: ~0.6 ms per call for 0.5 GB of streams,
// latency-bound), with the next step's kHcMixT tokens already requested. The same sums in the same order as
// hc_slice_partials: the same bits.
constexpr int kHcMixT = 4;
__global__ void __launch_bounds__(128) hc_mix_t_kernel(HcPreArgs a, int nmix, int nslices, float* partial, int tpb) {
  __shared__ float red[kHcMixT][4][9];
  const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  float4 f[8];
  const HcMixSlice m = hc_mix_slice(a, nmix, f);
  const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  pdl_wait();
  const int t0 = blockIdx.z * tpb, t1 = min(a.n, static_cast<int>(blockIdx.z + 1) * tpb);
  const bool with_ss = blockIdx.x == 0;
  float4 xn[kHcMixT];
#pragma unroll
  for (int u = 0; u < kHcMixT; ++u) xn[u] = (m.inb && t0 + u < t1) ? *reinterpret_cast<const float4*>(a.X + (t0 + u) * m.nf + m.e) : z4;
  for (int t = t0; t < t1; t += kHcMixT) {
    float4 xv[kHcMixT];
#pragma unroll
    for (int u = 0; u < kHcMixT; ++u) {
      xv[u] = xn[u];
      const int tn = t + kHcMixT + u;
      if (m.inb && tn < t1) xn[u] = *reinterpret_cast<const float4*>(a.X + tn * m.nf + m.e);
    }
    const int nt = min(kHcMixT, t1 - t);
#pragma unroll
    for (int u = 0; u < kHcMixT; ++u)
      if (u < nt) hc_warp_partials<8>(f, xv[u], red[u][warp]);
    __syncthreads();
    // Thread i: token u = i / 9, value r = i % 9 (8 mix rows, then the sum of squares), summed over warps in order.
    if (threadIdx.x < nt * 9) {
      const int u = threadIdx.x / 9, r = threadIdx.x % 9;
      float v = red[u][0][r];
      for (int w = 1; w < nwarps; ++w) v += red[u][w][r];
      float* out = partial + (static_cast<int64_t>(t + u) * nslices + m.sl) * (kHcMaxMix + 1);
      if (r < 8 && m.rb + r < nmix) out[m.rb + r] = v;
      if (r == 8 && with_ss) out[kHcMaxMix] = v;
    }
    __syncthreads();  // red is rewritten by the next step
  }
}

// The prefill mix with a thread per (token, group of 8 mix rows) (default from kHcMixTokMin tokens at hc 4 and 24 mix
// rows; DSV4_HC_MIX_TOK=0 / set_hc_mix_tok(false): hc_mix_t_kernel). hc_mix_t_kernel spreads a token's slice over a
// block's 128 lanes, so every 36 FMAs of a lane cost a butterfly of 31 shuffles plus a barrier (ncu at an 8K prompt:
// 0.58 ms per call for 0.55 GB of streams, 950 GB/s, 40 calls in 20 layers). Here a warp is 32 tokens of one row
// group, the slice's fn values (24 rows x 512, padded) sit in shared memory and are read as broadcasts, and a thread
// forms its token's partials alone -- in exactly hc_slice_partials' order, hence the same bits: each stream's 32
// lane dot products (hc_dot4, lane l = columns 4l .. 4l + 3) are visited in bit-reversed lane order, which turns the
// xor butterfly (offsets 16, 8, 4, 2, 1) into a left-complete binary tree over the visit order, summed with one
// pending value per tree level (a binary counter); the streams' sums are then added in stream order (over_warps).
constexpr int kHcMixTokMin = 32;
// hc_finish_kernel<true> (streams through shared memory) for prefill-sized calls (default; DSV4_HC_FINISH_SX=0 /
// set_hc_finish_sx(false): the register-prefetch kernel). The same bits.
std::atomic<int> g_hc_finish_sx{[] {
  const char* e = std::getenv("DSV4_HC_FINISH_SX");
  return e && std::string(e) == "0" ? 0 : 1;
}()};
constexpr int kHcTokPad = 25;  // float4s per (stream, lane) in shared memory: 24 rows + 1 (conflict-free stores)
std::atomic<int> g_hc_mix_tok{[] {
  const char* e = std::getenv("DSV4_HC_MIX_TOK");
  return e && std::string(e) == "0" ? 0 : 1;
}()};
__host__ __device__ constexpr int hc_brev5(int p) {
  return ((p & 1) << 4) | ((p & 2) << 2) | (p & 4) | ((p & 8) >> 2) | ((p & 16) >> 4);
}
// One stream's 32 lane dot products of 8 fn rows (and with SS the sum of squares, value 8) for the token in this
// thread's smem row xr, summed over the bit-reversed visit order's tree into tot.
template <bool SS>
__device__ __forceinline__ void hc_tok_stream(const float4* fsl, const float4* xr, float (&tot)[9]) {
  constexpr int V = SS ? 9 : 8;
  float lvl[5][V];
#pragma unroll
  for (int p = 0; p < 32; ++p) {
    const int l = hc_brev5(p);
    const float4 xv = xr[l];
    float v[V];
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = hc_dot4(fsl[l * kHcTokPad + r], xv);
    if constexpr (SS) v[8] = hc_dot4(xv, xv);
    int k = 0;
#pragma unroll
    for (; k < 5 && ((p >> k) & 1); ++k)
#pragma unroll
      for (int r = 0; r < V; ++r) v[r] = lvl[k][r] + v[r];
    if (k < 5) {
#pragma unroll
      for (int r = 0; r < V; ++r) lvl[k][r] = v[r];
    } else {
#pragma unroll
      for (int r = 0; r < V; ++r) tot[r] = v[r];
    }
  }
}
// grid (slices, token groups of tpb), kHcTokTiles x 96 threads: warp w = mix rows 8g .. 8g + 7 (g = w % 3; warp
// g 0 also the sum of squares) for the tokens of tile w / 3, a token per lane. The streams reach shared memory
// through cp.async, one stage (kHcTokTiles x 32 tokens of one stream's 128-column slice) at a time, the next stage in
// flight while this one is summed (coalesced; reading them straight from global memory, a lane per token, ran at
// ~1 ms per call: 32 lines per load, the row-group warps thrashing L1). One block per SM (186 KB of shared memory):
// with 2 blocks of 3 warps (9 % occupancy, ncu) the FMA chains' and shared loads' latency left ~66 % of issue slots
// empty at 1.34 IPC (0.60 ms per call). Requires hc 4, 24 mix rows, d % 128 == 0 (hc_pre checks).
constexpr int kHcTokTiles = 4;
constexpr int kHcTokRow = 33;  // float4s per token row in a stage: 32 + 1 (lane i reads bank group 4i: no conflicts)
constexpr int kHcTokStage = kHcTokTiles * 32 * kHcTokRow;  // float4s
constexpr size_t kHcTokSmem = (4 * 32 * kHcTokPad + 2 * kHcTokStage) * sizeof(float4);
__global__ void __launch_bounds__(96 * kHcTokTiles, 1) hc_mix_tok_kernel(HcPreArgs a, int nslices, float* partial, int tpb) {
  extern __shared__ float4 hc_fs[];  // [stream][lane][kHcTokPad]: fn rows' columns 4 lane .. of this slice; then stages
  float4* xbuf = hc_fs + 4 * 32 * kHcTokPad;
  const int sl = blockIdx.x;
  const int64_t d = a.d, nf = 4 * d, col0 = static_cast<int64_t>(sl) * kHcSliceCols;
  // fn is a constant weight: staged before griddepcontrol.wait. Coalesced: consecutive threads take consecutive lanes.
  for (int i = threadIdx.x; i < 4 * 32 * 24; i += blockDim.x) {
    const int l = i & 31, st = (i >> 5) & 3, r = i >> 7;
    hc_fs[(st * 32 + l) * kHcTokPad + r] = __ldg(reinterpret_cast<const float4*>(a.fn + r * nf + st * d + col0) + l);
  }
  pdl_wait();
  const int warp = threadIdx.x >> 5, g = warp % 3, tile = warp / 3, lane = threadIdx.x & 31;
  constexpr int kStageTokens = kHcTokTiles * 32;
  const int tb = static_cast<int>(blockIdx.y) * tpb, te = min(a.n, tb + tpb);
  const int nstages = (te - tb + kStageTokens - 1) / kStageTokens * 4;  // (token group, stream), stream fastest
  auto issue = [&](int q) {
    if (q < nstages) {
      const int t0 = tb + (q >> 2) * kStageTokens, st = q & 3;
      float4* dst = xbuf + (q & 1) * kHcTokStage;
      for (int i = threadIdx.x; i < kStageTokens * 32; i += blockDim.x) {
        const int row = i >> 5, c = i & 31, t = t0 + row;
        const float* src = a.X + static_cast<int64_t>(t < te ? t : tb) * nf + st * d + col0 + 4 * c;
        cp_async16_zfill(dst + row * kHcTokRow + c, src, t < te);
      }
    }
    cp_async_commit();  // empty groups keep the count uniform
  };
  issue(0);
  float acc[9];
  for (int q = 0; q < nstages; ++q) {
    cp_async_wait<0>();  // this thread's copies of stage q
    __syncthreads();     // everyone's copies of q; everyone done with stage q - 1's buffer
    issue(q + 1);
    const int st = q & 3;
    const float4* xr = xbuf + (q & 1) * kHcTokStage + (tile * 32 + lane) * kHcTokRow;
    const float4* fsl = hc_fs + st * 32 * kHcTokPad + g * 8;
    float tot[9];
    tot[8] = 0.0f;  // SS = false leaves the sum of squares out (only the g 0 warps write it)
    if (g == 0) hc_tok_stream<true>(fsl, xr, tot);
    else hc_tok_stream<false>(fsl, xr, tot);
#pragma unroll
    for (int r = 0; r < 9; ++r) acc[r] = st == 0 ? tot[r] : acc[r] + tot[r];
    const int t = tb + (q >> 2) * kStageTokens + tile * 32 + lane;
    if (st == 3 && t < te) {
      float* out = partial + (static_cast<int64_t>(t) * nslices + sl) * (kHcMaxMix + 1);
#pragma unroll
      for (int r = 0; r < 8; ++r) out[g * 8 + r] = acc[r];
      if (g == 0) out[kHcMaxMix] = acc[8];
    }
  }
}

// x / y from y's approximate reciprocal r (rcp.approx) and one FMA correction (Markstein): correctly rounded in all
// but rare cases. An IEEE division costs ~64 cycles of dependent latency on one warp (tools/gpu/probes/hc_finish_probe.cu).
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float div_corrected(float x, float y, float r) {
  const float q = x * r;
  return fmaf(fmaf(-q, y, x), r, q);
}

// comb's logits c[j][k] = mix[2 HC + j HC + k] * sc_comb + base (warp-collective: lane l holds base element l in
// b_comb, read before griddepcontrol.wait; every lane gathers them all). One explicit FMA, so that the Sinkhorn gets
// the same inputs whether it runs here or in the post that consumes comb (deferred: HcPreArgs::comb_logits).
template <int HC>
__device__ __forceinline__ void hc_comb_logits(const float* mix, float sc_comb, float b_comb, float (&c)[HC][HC]) {
#pragma unroll
  for (int j = 0; j < HC; ++j)
#pragma unroll
    for (int k = 0; k < HC; ++k) c[j][k] = __fmaf_rn(mix[2 * HC + j * HC + k], sc_comb, __shfl_sync(0xffffffffu, b_comb, j * HC + k));
}
// Row softmax, then `iters` rounds of (row, column) normalisation of the whole matrix in this thread's registers.
template <int HC>
__device__ __forceinline__ void hc_sinkhorn_core(float (&c)[HC][HC], float eps, int iters) {
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    float mx = c[j][0], sum = 0.0f;
#pragma unroll
    for (int k = 1; k < HC; ++k) mx = fmaxf(mx, c[j][k]);
#pragma unroll
    for (int k = 0; k < HC; ++k) sum += (c[j][k] = expf(c[j][k] - mx));
    const float r = rcp_approx(sum);
#pragma unroll
    for (int k = 0; k < HC; ++k) c[j][k] = div_corrected(c[j][k], sum, r) + eps;
  }
  // One row or column (at(i): its element i) divided by its sum + eps.
  auto normalise = [&](auto at) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < HC; ++i) s += at(i);
    s += eps;
    const float r = rcp_approx(s);
#pragma unroll
    for (int i = 0; i < HC; ++i) at(i) = div_corrected(at(i), s, r);
  };
  for (int it = 0; it < iters; ++it) {
    if (it > 0)
#pragma unroll
      for (int j = 0; j < HC; ++j) normalise([&](int k) -> float& { return c[j][k]; });
#pragma unroll
    for (int k = 0; k < HC; ++k) normalise([&](int j) -> float& { return c[j][k]; });
  }
}
// comb of token t from the logits a consuming post finds in comb_in (deferred Sinkhorn; HC 4): every thread of the
// caller computes the whole matrix (no shuffles; the caller runs it before griddepcontrol.wait, where the logits --
// written by a pre at least two kernels earlier -- are complete). Read through L2 (the buffer is rewritten every step).
__device__ __forceinline__ void hc_comb_from_logits(const float* comb_in, int t, float eps, int iters, float (&c)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) c[j][k] = __ldcg(comb_in + t * 16 + j * 4 + k);
  hc_sinkhorn_core<4>(c, eps, iters);
}
// A DeferredComb's (ops.h) one-token comb: its Sinkhorn in place, by thread 0 of the calling block.
__device__ __forceinline__ void sinkhorn_comb_in_place(const DeferredComb& dc) {
  if (threadIdx.x != 0) return;
  float c[4][4];
  hc_comb_from_logits(dc.comb, 0, dc.eps, dc.iters, c);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) dc.comb[j * 4 + k] = c[j][k];
}
// The extra block of a launch given a DeferredComb whose logits were written by a kernel at least two back in the
// stream: read before any wait; the block never waits and releases the dependents at once, so it only runs beside
// the launch's other blocks. (The fused router GEMV's block, one kernel after the pre, waits and then calls
// sinkhorn_comb_in_place.)
__device__ __forceinline__ void finish_deferred_comb(const DeferredComb& dc) {
  // (DSV4_PHASE_STAMPS builds) this block's thread 0: 0 entry, 1 done; tag: the launch's blocks.
  PHASE_DECL_ANY(ph);
  PHASE_BLOCK(ph, true);
  PHASE_MARK2(ph, 0);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  sinkhorn_comb_in_place(dc);
  PHASE_MARK2(ph, 1);
  PHASE_RECORD2(ph, "deferred_comb", gridDim.x);
}

// The Sinkhorn of n tokens' comb logits in place, one thread per token (hc 4): the prefill form of the deferred
// Sinkhorn. hc_finish_kernel ran it in warp 0 of each token's block, ~6,000 dependent cycles that kept the block
// (128 registers x 512 threads: one per SM) resident long after its collapse was done: at an 8K prompt the kernel
// took ~390 us for ~670 MB of traffic. The same function as in hc_finish / the consuming post (hc_sinkhorn_core).
__global__ void hc_sinkhorn_rows_kernel(float* comb, int n, float eps, int iters) {
  pdl_wait();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float c[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) c[j][k] = comb[t * 16 + j * 4 + k];
  hc_sinkhorn_core<4>(c, eps, iters);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) comb[t * 16 + j * 4 + k] = c[j][k];
}

constexpr int kMoeReduceBatch = 8;  // slots whose loads moe_sum4 issues together (Flash 6, Pro 6)
// One float4 column j of the MoE sum: y's k slot rows (row stride d4 float4s) in order, then the shared expert's row
// ys (null: none), summed in double, [official] BF16-rounded -- the CPU's order.
__device__ __forceinline__ float4 moe_sum4(const float4* y, int64_t d4, int k, const float4* ys, int64_t j, bool official) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  if (k <= kMoeReduceBatch) {
    // Every slot's load (and the shared expert's) first, then the sums in the same order: the runtime-k loop issued
    // one load per iteration behind the previous one's add.
    float4 v[kMoeReduceBatch + 1];
#pragma unroll
    for (int sl = 0; sl < kMoeReduceBatch; ++sl)
      if (sl < k) v[sl] = y[static_cast<int64_t>(sl) * d4 + j];
    if (ys) v[kMoeReduceBatch] = ys[j];
#pragma unroll
    for (int sl = 0; sl < kMoeReduceBatch; ++sl)
      if (sl < k) acc[0] += v[sl].x, acc[1] += v[sl].y, acc[2] += v[sl].z, acc[3] += v[sl].w;
    if (ys) {
      const float4 w = v[kMoeReduceBatch];
      acc[0] += w.x, acc[1] += w.y, acc[2] += w.z, acc[3] += w.w;
    }
  } else {
    for (int sl = 0; sl < k; ++sl) {
      const float4 w = y[static_cast<int64_t>(sl) * d4 + j];
      acc[0] += w.x, acc[1] += w.y, acc[2] += w.z, acc[3] += w.w;
    }
    if (ys) {
      const float4 w = ys[j];
      acc[0] += w.x, acc[1] += w.y, acc[2] += w.z, acc[3] += w.w;
    }
  }
  float o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    o[e] = static_cast<float>(acc[e]);
    if (official) o[e] = bf16r(o[e]);
  }
  return make_float4(o[0], o[1], o[2], o[3]);
}
// One output of the mHC post: post_k * y + sum_s comb[s][k] * X_s in stream order ([official] BF16), with explicit
// roundings; hc_post_kernel and hc_post_mix_kernel share it so that both write bit-identical streams.
template <int M>
__device__ __forceinline__ float hc_post_value(float post_k, float y, const float (&comb_k)[M], const float (&xs)[M],
                                               int hc, bool official) {
  float v = __fmul_rn(post_k, y);
#pragma unroll
  for (int s = 0; s < M; ++s)
    if (s < hc) v = __fmaf_rn(comb_k[s], xs[s], v);
  return official ? bf16r(v) : v;
}

// hc_post_pre: the mHC post, then the next pre's mix over the new streams. Grid (slices, token groups): the block owns its
// slice's columns of every stream, so warp s computes the new stream s there from the old streams (as
// hc_post_kernel), stores it, and feeds it from registers into the partials of all nmix rows (as hc_mix_kernel).
// All rows in one block, not hc_mix_kernel's three row groups: blocks sharing a slice would read columns that one of
// them overwrites, in no guaranteed order. Each thread keeps its 24 fn loads in flight across pdl_wait instead.
// slots.y (MoeSlots, decode): y is the MoE's sum of those expert rows, formed here by moe_reduce's function (moe_sum4).
__global__ void __launch_bounds__(128) hc_post_mix_kernel(const float* y, const float* post, const float* comb, float* X,
                                                           HcPreArgs a, int nmix, int nslices, float* partial, HcCombIn ci,
                                                           int tpb, MoeSlots slots) {
  __shared__ float red[4][kHcPostMix + 1];
  PHASE_DECL;  // (DSV4_PHASE_STAMPS builds) 0 entry, 1 comb ready (before the wait), 2 past the wait, 3 done
  PHASE_MARK(0);
  const int sl = blockIdx.x, hc = a.hc, k = threadIdx.x >> 5;
  const int64_t d = a.d, nf = hc * d;
  const int64_t j = static_cast<int64_t>(sl) * kHcSliceCols + (threadIdx.x & 31) * 4;
  const bool inb = j < d;
  const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 f[kHcPostMix];
#pragma unroll
  for (int r = 0; r < kHcPostMix; ++r)
    f[r] = (inb && r < nmix) ? __ldg(reinterpret_cast<const float4*>(a.fn + r * nf + k * d + j)) : z4;
  // Deferred Sinkhorn (one token): comb from its logits, overlapping the previous kernel.
  const bool deferred = ci.sinkhorn_iters >= 0;
  float cl[4][4];
  if (deferred) hc_comb_from_logits(comb, 0, ci.eps, ci.sinkhorn_iters, cl);
  PHASE_MARK(1);
  pdl_wait();
  PHASE_MARK(2);
  const int t1 = min(a.n, static_cast<int>(blockIdx.y + 1) * tpb);
  for (int t = blockIdx.y * tpb; t < t1; ++t) {
    float* Xt = X + t * nf;
    float4 xs[4];
    float comb_k[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      xs[s] = (inb && s < hc) ? *reinterpret_cast<const float4*>(Xt + s * d + j) : z4;
      if (deferred) {
        comb_k[s] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          if (kk == k) comb_k[s] = cl[s][kk];  // (a register array indexed at run time would go to local memory)
      } else {
        comb_k[s] = s < hc ? comb[(static_cast<int64_t>(t) * hc + s) * hc + k] : 0.0f;
      }
    }
    const float post_k = post[t * hc + k];
    float4 yv = z4;
    if (inb && slots.y) {
      yv = moe_sum4(reinterpret_cast<const float4*>(slots.y + static_cast<int64_t>(t) * slots.k * d), d / 4, slots.k,
                    slots.ys ? reinterpret_cast<const float4*>(slots.ys + t * d) : nullptr, j / 4, a.official);
    } else if (inb) {
      yv = *reinterpret_cast<const float4*>(y + t * d + j);
    }
    // old[c][s]: column j + c of stream s.
    const float old[4][4] = {{xs[0].x, xs[1].x, xs[2].x, xs[3].x},
                             {xs[0].y, xs[1].y, xs[2].y, xs[3].y},
                             {xs[0].z, xs[1].z, xs[2].z, xs[3].z},
                             {xs[0].w, xs[1].w, xs[2].w, xs[3].w}};
    const float4 xv = inb ? make_float4(hc_post_value<4>(post_k, yv.x, comb_k, old[0], hc, a.official),
                                        hc_post_value<4>(post_k, yv.y, comb_k, old[1], hc, a.official),
                                        hc_post_value<4>(post_k, yv.z, comb_k, old[2], hc, a.official),
                                        hc_post_value<4>(post_k, yv.w, comb_k, old[3], hc, a.official))
                          : z4;
    __syncthreads();  // every warp has read the old streams of these columns before any of them is overwritten
    if (inb) *reinterpret_cast<float4*>(Xt + k * d + j) = xv;
    float* out = partial + (static_cast<int64_t>(t) * nslices + sl) * (kHcMaxMix + 1);
    hc_slice_partials<kHcPostMix>(f, xv, 0, nmix, true, red, out);
    __syncthreads();  // red is rewritten by the next token
  }
  PHASE_MARK(3);
  PHASE_RECORD("hc_post_mix", deferred ? 1 : 0);
}

// The Sinkhorn of comb (hc_finish_kernel's warp 0), HC = hc_mult as a constant: every lane holds the whole HC x HC
// matrix in registers (no shuffles), row softmax, then iterations of (row, column) normalisation, sums in the CPU
// reference's order; the divisions by div_corrected. Probe on an H200 (one warp, hc 4, 20 iterations): 14,300 cycles
// with shuffles and IEEE divisions (~7 us, the critical path of every hc_pre), 6,000 like this, with the same results
// on its input. A run-time hc (guarded loops) compiled to a branch per element and was slower than the shuffles.
// With a.comb_logits the warp stores the logits instead and the consuming post runs the Sinkhorn (see hc_finish_kernel).
template <int HC>
__device__ __forceinline__ void hc_sinkhorn_warp(const HcPreArgs& a, int t, const float* mix, float sc_comb, float b_comb) {
  const int lane = threadIdx.x & 31;
  float c[HC][HC];
  hc_comb_logits<HC>(mix, sc_comb, b_comb, c);
  if (!a.comb_logits) hc_sinkhorn_core<HC>(c, a.hc_eps, a.sinkhorn_iters);
  float mine = 0.0f;
#pragma unroll
  for (int j = 0; j < HC; ++j)
#pragma unroll
    for (int k = 0; k < HC; ++k)
      if (lane == j * HC + k) mine = c[j][k];
  if (lane < HC * HC) a.comb[t * HC * HC + lane] = mine;
}
__device__ __forceinline__ void hc_sinkhorn(const HcPreArgs& a, int t, const float* mix, float sc_comb, float b_comb) {
  switch (a.hc) {  // 1..4 (hc_slices checks)
    case 4: hc_sinkhorn_warp<4>(a, t, mix, sc_comb, b_comb); break;
    case 3: hc_sinkhorn_warp<3>(a, t, mix, sc_comb, b_comb); break;
    case 2: hc_sinkhorn_warp<2>(a, t, mix, sc_comb, b_comb); break;
    default: hc_sinkhorn_warp<1>(a, t, mix, sc_comb, b_comb); break;
  }
}

// SX (prefill, hc_finish_sx_on): the token's streams go to shared memory by cp.async (hc_finish_smem_floats) instead
// of the collapse threads' registers (64 of their 128): at 64 registers two blocks fit an SM, so one token's loads
// are in flight while the other's coefficients and norm run (ncu, 8K prompt: one 512-thread block per SM, 1.06 IPC,
// ~0.33 ms per call for ~0.55 GB). The same arithmetic in the same order: the same bits. Requires the split path's
// conditions (pf below) and X 16-byte aligned with hc * d % 4 == 0 (the host checks).
template <bool SX>
__global__ void __launch_bounds__(512, SX ? 2 : 1) hc_finish_kernel(HcPreArgs a, int nmix, int nslices, const float* partial) {
  // pdl_wait() after the norm weight's prefetch (a constant), before the streams and partials are read.
  extern __shared__ float xin[];  // max(d, nslices * (kHcMaxMix + 1)) floats (rounded up to 4); SX: then hc * d
  __shared__ double red[32];
  __shared__ float mix[kHcMaxMix], pre[16];
  const int t = blockIdx.x, hc = a.hc;
  const int64_t d = a.d, nf = hc * d;
  const float* Xt = a.X + t * nf;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // (DSV4_PHASE_STAMPS builds, decode's split path) warp 0 (ph0) and the first collapse warp (ph1): 0 entry, 1 past
  // the wait, 2 partials staged, 3 pre out, 4 done
  PHASE_DECL2(ph0, 0);
  PHASE_DECL2(ph1, 32);
  PHASE_MARK2(ph0, 0);
  PHASE_MARK2(ph1, 0);
  // Split path (hc <= 4, d % 4 == 0, d <= 16 * (threads - 32)): warp 0 computes the mHC coefficients; the collapse
  // needs only `pre`, so once that is out warps 1.. collapse the streams and apply the RMSNorm while warp 0 runs the
  // ~20 serial Sinkhorn iterations for comb (read only by the next hc_post): the two chains overlap instead of adding
  // up (the trace measured ~11 us per call when they ran one after the other). The collapse threads load the streams
  // and the norm weight into registers first, so that their latency overlaps the partial sums.
  const int64_t ng = d / 4;
  const int ct = static_cast<int>(threadIdx.x) - 32, nct = static_cast<int>(blockDim.x) - 32;  // collapse threads
  const bool pf = hc <= 4 && d % 4 == 0 && ng <= 4 * static_cast<int64_t>(nct);
  float4 xr[SX ? 1 : 4][4], wr[4];
  if (pf && warp > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t g = ct + static_cast<int64_t>(i) * nct;
      if (g < ng) wr[i] = a.norm_w ? __ldg(reinterpret_cast<const float4*>(a.norm_w) + g) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    }
  }
  // Warp 0's mHC parameters (scales and biases of pre / post / comb), also constants: in its serial chain below they
  // were up to three dependent global round trips.
  float sc_pre = 0.0f, sc_post = 0.0f, sc_comb = 0.0f, b_pre = 0.0f, b_post = 0.0f, b_comb = 0.0f;
  if (warp == 0) {
    sc_pre = a.scale[0];
    if (lane < hc) b_pre = a.base[lane];
    if (!a.head) {
      sc_post = a.scale[1], sc_comb = a.scale[2];
      if (lane < hc) b_post = a.base[hc + lane];
      if (lane < hc * hc) b_comb = a.base[2 * hc + lane];
    }
  }
  pdl_wait();
  PHASE_MARK2(ph0, 1);
  PHASE_MARK2(ph1, 1);
  const int npart = nslices * (kHcMaxMix + 1);
  float* xs = xin + ((std::max<int64_t>(d, npart) + 3) & ~int64_t{3});  // SX: the streams [hc][d]
  if constexpr (SX) {
    // Partials first (group 0), then the streams (group 1): warp 0 sums the partials while the streams arrive.
    for (int i = threadIdx.x; i < npart; i += blockDim.x) cp_async4(xin + i, partial + static_cast<int64_t>(t) * npart + i);
    cp_async_commit();
    for (int64_t i = threadIdx.x; i < nf / 4; i += blockDim.x) cp_async16(xs + 4 * i, Xt + 4 * i);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    if (pf && warp > 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t g = ct + static_cast<int64_t>(i) * nct;
        if (g >= ng) continue;
#pragma unroll
        for (int s = 0; s < 4; ++s)
          if (s < hc) xr[s][i] = __ldg(reinterpret_cast<const float4*>(Xt + s * d) + g);
      }
    }
    // The block stages this token's partials in shared memory with all its threads (one memory round trip instead of
    // one per slice), then warp 0 sums them.
    for (int i = threadIdx.x; i < npart; i += blockDim.x) xin[i] = partial[static_cast<int64_t>(t) * npart + i];
  }
  __syncthreads();
  PHASE_MARK2(ph0, 2);
  PHASE_MARK2(ph1, 2);
  if (warp == 0) {
    // Lane r < nmix: mix row r; every lane also sums the squares. Slices summed in double in four interleaved chains
    // (slice % 4), then the chains in a fixed order: a dependent double add costs ~35 cycles here (probe), and the
    // float partials' sum is exact in double in practice whatever the order. (Eight chains spilled registers: the
    // collapse threads' streams and norm weights share the kernel's 128.)
    const float* pp = xin;
    double ssq[4] = {0.0, 0.0, 0.0, 0.0}, mq[4] = {0.0, 0.0, 0.0, 0.0};
    const int mrow = lane < nmix ? lane : kHcMaxMix;  // spare lanes re-sum the squares (not kept)
    int sl = 0;
    for (; sl + 4 <= nslices; sl += 4) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        ssq[u] += pp[(sl + u) * (kHcMaxMix + 1) + kHcMaxMix];
        mq[u] += pp[(sl + u) * (kHcMaxMix + 1) + mrow];
      }
    }
    for (; sl < nslices; ++sl) {  // the last nslices % 4 slices: chain 0
      ssq[0] += pp[sl * (kHcMaxMix + 1) + kHcMaxMix];
      mq[0] += pp[sl * (kHcMaxMix + 1) + mrow];
    }
    const double ssd = (ssq[0] + ssq[1]) + (ssq[2] + ssq[3]), md = (mq[0] + mq[1]) + (mq[2] + mq[3]);
    const float rs = static_cast<float>(1.0 / sqrt(ssd / static_cast<double>(nf) + a.rms_eps));
    const float mv = lane < nmix ? static_cast<float>(md) * rs : 0.0f;
    if (lane < nmix) mix[lane] = mv;
    __syncwarp();
    if (lane < hc) pre[lane] = sigm(mix[lane] * sc_pre + b_pre) + a.hc_eps;
    if (!a.head && lane < hc) a.post[t * hc + lane] = 2.0f * sigm(mix[hc + lane] * sc_post + b_post);
    if (!a.head && !pf) hc_sinkhorn(a, t, mix, sc_comb, b_comb);
  }
  if constexpr (SX) cp_async_wait<0>();  // this thread's stream copies; the barrier publishes everyone's
  __syncthreads();  // pre is out; warp 0 is done with the staged partials before xin is reused below
  PHASE_MARK2(ph0, 3);
  PHASE_MARK2(ph1, 3);
  if (pf) {
    if (warp == 0) {
      if (!a.head) hc_sinkhorn(a, t, mix, sc_comb, b_comb);
      PHASE_MARK2(ph0, 4);
      PHASE_RECORD2(ph0, "hc_finish_w0", a.head ? 1 : 0);
      return;  // no block-wide barrier follows: the collapse threads synchronise on named barrier 1 among themselves
    }
    // Same arithmetic as the loops below (collapse in stream order, [official] BF16, x * r * w), from registers.
    float4 v[4];
    // The sum of squares as a tree per group, then over the groups (a serial chain of 12 dependent double FMAs
    // before session 29), and the warps' sums below as a butterfly over 16 lanes (15 dependent adds before).
    double ss = 0.0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t g = ct + static_cast<int64_t>(i) * nct;
      if (g >= ng) continue;
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int s = 0; s < 4; ++s)
        if (s < hc) {
          float4 x4;
          if constexpr (SX) x4 = reinterpret_cast<const float4*>(xs + s * d)[g];
          else x4 = xr[s][i];
          c[0] += pre[s] * x4.x;
          c[1] += pre[s] * x4.y;
          c[2] += pre[s] * x4.z;
          c[3] += pre[s] * x4.w;
        }
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (a.official) c[e] = bf16r(c[e]);
      ss += (static_cast<double>(c[0]) * c[0] + static_cast<double>(c[1]) * c[1]) +
            (static_cast<double>(c[2]) * c[2] + static_cast<double>(c[3]) * c[3]);
      v[i] = make_float4(c[0], c[1], c[2], c[3]);
    }
    ss = warp_sum_d(ss);
    if (lane == 0) red[warp - 1] = ss;
    asm volatile("bar.sync 1, %0;" ::"r"(nct) : "memory");
    // Lanes 0..15 of every collapse warp hold the warps' sums (zero past the last; at most 15 warps: 512-thread
    // blocks), summed by an xor butterfly: every lane ends with the same bits (each step adds commutatively).
    ss = (lane & 15) < nct / 32 ? red[lane & 15] : 0.0;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rs = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + a.rms_eps));
    const bool rnd = a.official && !a.head, has_w = a.norm_w != nullptr;
    float* x = a.x + t * d;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t g = ct + static_cast<int64_t>(i) * nct;
      if (g >= ng) continue;
      const float in[4] = {v[i].x, v[i].y, v[i].z, v[i].w}, w[4] = {wr[i].x, wr[i].y, wr[i].z, wr[i].w};
      float o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float y = has_w ? in[e] * rs * w[e] : in[e] * rs;
        o[e] = rnd ? bf16r(y) : y;
      }
      reinterpret_cast<float4*>(x)[g] = make_float4(o[0], o[1], o[2], o[3]);
    }
    PHASE_MARK2(ph1, 4);
    PHASE_RECORD2(ph1, "hc_finish_collapse", a.head ? 1 : 0);
    return;
  }
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < hc; ++s) v += pre[s] * Xt[s * d + j];
    xin[j] = a.official ? bf16r(v) : v;
  }
  __syncthreads();
  block_rms(xin, static_cast<int>(d), a.norm_w, a.rms_eps, red);
  float* x = a.x + t * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) x[j] = (a.official && !a.head) ? bf16r(xin[j]) : xin[j];
}

// HC > 0: the stream count as a constant (the models' 4), so xs / out live in registers; HC = 0: any hc <= 16 (the
// runtime-sized arrays went to local memory: 10K spill sectors per launch in ncu).
template <int HC>
__global__ void hc_post_kernel(const float* y, const float* post, const float* comb, int n, int hc_rt, int64_t d,
                               bool official, float* X, HcCombIn ci) {
  // Deferred Sinkhorn (HC 4, one token): every thread forms comb from the logits before griddepcontrol.wait.
  float cl[4][4];
  if constexpr (HC == 4)
    if (ci.sinkhorn_iters >= 0) hc_comb_from_logits(comb, 0, ci.eps, ci.sinkhorn_iters, cl);
  pdl_wait();
  constexpr int M = HC > 0 ? HC : 16;
  const int hc = HC > 0 ? HC : hc_rt;
  const int64_t total = static_cast<int64_t>(n) * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, j = i % d;
    float* Xt = X + t * hc * d;
    const float* C = comb + t * hc * hc;
    float xs[M], out[M];
#pragma unroll
    for (int s = 0; s < M; ++s)
      if (s < hc) xs[s] = Xt[s * d + j];
#pragma unroll
    for (int k = 0; k < M; ++k) {
      if (k >= hc) continue;
      float comb_k[M];
#pragma unroll
      for (int s = 0; s < M; ++s) {
        if constexpr (HC == 4) {
          if (ci.sinkhorn_iters >= 0) {
            comb_k[s] = cl[s][k];
            continue;
          }
        }
        if (s < hc) comb_k[s] = C[s * hc + k];
      }
      out[k] = hc_post_value<M>(post[t * hc + k], y[t * d + j], comb_k, xs, hc, official);
    }
#pragma unroll
    for (int k = 0; k < M; ++k)
      if (k < hc) Xt[k * d + j] = out[k];
  }
}
