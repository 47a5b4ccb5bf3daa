// Decode GEMV v3 and the routed-expert kernels built on it (included by kernels.cu after the v2 helpers it uses:
// Chunk, ldg_stream, e2m1_pair, fp4/fp8 scale decoding, scale_row, row_bytes, swiglu1).
//
// Why v3: in v2 every lane of a warp streams its own 16-byte weight chunk (consecutive chunks across lanes) and reads
// the matching 16..32 activation floats straight from global memory. Those activation reads are 4-8x the weight bytes
// and, lanes being 64-128 B apart, each 16-byte load instruction touches up to 32 different L1 lines, so the kernels
// were bound by L1 wavefronts, not by DRAM (21-33 % of the bandwidth in `dsv4 bench-ops`). v3 stages the activation
// row in shared memory once per block, in a rotated layout (the float4 groups of chunk c are rotated by c / chunks-per-
// 128-bytes), so that the 8 lanes of each shared-memory phase hit 8 different bank groups: conflict-free 16-byte
// reads. Block scales are loaded together with their weight chunk (not after it arrives), and the loads of the next
// chunk-steps are issued before the current ones are consumed (two register buffers).
// Included INSIDE kernels.cu's anonymous namespace in dsv4::cuda (it is part of that translation unit).
#pragma once

template <int F>
struct XRot {
  static constexpr int CW = Chunk<F>::CW;                   // floats per 16-byte weight chunk
  static constexpr int G = CW / 4;                          // float4 groups per chunk (1, 2, 4 or 8)
  static constexpr int CPL = CW >= 32 ? 1 : 32 / CW;        // chunks per 128-byte shared-memory row
  __device__ static __forceinline__ const float4& at(const float* xs, int64_t c, int g) {
    const int rot = G == 1 ? 0 : ((g + static_cast<int>(c / CPL)) & (G - 1));
    return *reinterpret_cast<const float4*>(xs + c * CW + rot * 4);
  }
};

// Copies x[0, len) (len a multiple of 4, x 16-byte aligned) into xs in the rotated layout, with all threads.
// qa8: applies official numerics' activation quantization on the way (1x128 blocks, the arithmetic of
// warp_fake_quant / qa8_rows, bit for bit), one warp per 128-block: the decode step needs no separate QA8 kernel
// (and its launch) before each FP8/FP4 GEMV.
template <int F>
__device__ __forceinline__ void stage_x(const float* __restrict__ x, int64_t len, float* xs, bool qa8 = false) {
  constexpr int CW = XRot<F>::CW, G = XRot<F>::G, CPL = XRot<F>::CPL;
  if (qa8) {
    // Warp w quantizes 128-blocks w, w + nw, ...; the loads of up to 4 of its blocks are issued before the first is
    // reduced (one memory round trip per 4 blocks instead of per block: the 6 x 2048 act rows of the decode experts
    // are 6 blocks per warp of a 512-thread block).
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int64_t nb = (len + 127) / 128;
    for (int64_t b0 = threadIdx.x >> 5; b0 < nb; b0 += 4 * nw) {
      float4 pre[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = (b0 + u * nw) * 32 + lane;
        pre[u] = (b0 + u * nw < nb && i * 4 < len) ? __ldg(reinterpret_cast<const float4*>(x) + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t b = b0 + u * nw;
        if (b >= nb) break;  // warp-uniform
        const int64_t i = b * 32 + lane;  // float4 index
        const bool in = i * 4 < len;
        float4 v = pre[u];
        const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        const float s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f), inv = 1.0f / s;  // s a power of two: p * inv == p / s
        // E4M3 round-to-nearest-even with saturation in hardware (cvt.rn.satfinite), the same grid as e4m3_rt, whose
        // frexp/ldexp/division made every block's staging cost more than the QA8 kernel it replaces.
        auto q2 = [s, inv](float a, float b) {
          const __nv_fp8x2_storage_t e = __nv_cvt_float2_to_fp8x2(make_float2(fminf(fmaxf(a * inv, -448.0f), 448.0f),
                                                                                fminf(fmaxf(b * inv, -448.0f), 448.0f)),
                                                                    __NV_SATFINITE, __NV_E4M3);
          const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(e, __NV_E4M3);
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
          return make_float2(f.x * s, f.y * s);
        };
        const float2 lo = q2(v.x, v.y), hi = q2(v.z, v.w);
        v = make_float4(lo.x, lo.y, hi.x, hi.y);
        if (in) {
          const int64_t c = (i * 4) / CW;
          const int g = static_cast<int>(i % G);
          const int rot = G == 1 ? 0 : ((g + static_cast<int>(c / CPL)) & (G - 1));
          *reinterpret_cast<float4*>(xs + c * CW + rot * 4) = v;
        }
      }
    }
    return;
  }
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < len / 4; i += blockDim.x) {
    const int64_t c = (i * 4) / CW;
    const int g = static_cast<int>(i % G);
    const int rot = G == 1 ? 0 : ((g + static_cast<int>(c / CPL)) & (G - 1));
    *reinterpret_cast<float4*>(xs + c * CW + rot * 4) = __ldg(reinterpret_cast<const float4*>(x) + i);
  }
}

// The block scale(s) of chunk c as raw bits: fp32 bits (FP8, one per 8 chunks), one byte (MXFP4) or two (NVFP4).
template <int F>
__device__ __forceinline__ uint32_t raw_scale(const void* sp, int64_t c, int blk) {
  if constexpr (F == kFP8) return __float_as_uint(__ldg(static_cast<const float*>(sp) + (c >> 3)));
  else if constexpr (F == kFP4) {
    if (blk == 16) return __ldg(static_cast<const unsigned short*>(sp) + c);
    return __ldg(static_cast<const unsigned char*>(sp) + c);
  } else return 0u;
}

// chunk_math with x from the rotated shared copy and the scale(s) already loaded as raw bits (raw_scale).
template <int F>
__device__ __forceinline__ float chunk_dot_s(const uint4& q, const float* xs, int64_t c, uint32_t sraw, int blk, float g) {
  return chunk_math<F>(q, [xs, c](int i) { return XRot<F>::at(xs, c, i); }, blk, [sraw, blk, g](int i) {
    if constexpr (F == kFP8) return __uint_as_float(sraw);
    else return fp4_scale_dec(blk == 16 ? (sraw >> (8 * i)) & 0xFFu : sraw, blk, g);
  });
}

// U chunk-steps of R rows held in registers: weights and their scales.
template <int F, int R, int U>
struct RowPipe {
  uint4 q[U][R];
  uint32_t s[U][R];
  __device__ __forceinline__ void load(const uint8_t* const* wp, const void* const* sp, int blk, int64_t c0, int64_t ce) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t c = c0 + 32 * u;
        if (c < ce) {
          q[u][r] = ldg_stream(wp[r] + c * 16);
          s[u][r] = raw_scale<F>(sp[r], c, blk);
        }
      }
  }
  __device__ __forceinline__ void dot(const float* xs, const float* gs, int blk, int64_t c0, int64_t ce, float (&acc)[R]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c < ce)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += chunk_dot_s<F>(q[u][r], xs, c, s[u][r], blk, gs[r]);
    }
  }
};

// One warp: acc[r] (this lane's partial; not warp-reduced) = W_r[chunks cb..ce) . x, x staged in xs by the block.
// The first chunk-steps are loaded BEFORE the block stages x (`stage` runs between, then __syncthreads), so the weight
// stream is already in flight while the activation is copied. Every thread of the block must call this (barrier).
template <int F, int R, int U, typename Stage>
__device__ __forceinline__ void rows_dot_xs(const uint8_t* const* wp, const void* const* sp, const float* gs, int blk,
                                            int64_t cb, int64_t ce, const float* xs, Stage stage, float (&acc)[R]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const int64_t step = 32 * U, iters = ce > cb ? (ce - cb + step - 1) / step : 0;
  RowPipe<F, R, U> a, b;
  if (iters > 0) a.load(wp, sp, blk, cb + lane, ce);
  stage();
  __syncthreads();
  for (int64_t i = 0; i < iters; i += 2) {
    const int64_t ca = cb + lane + step * i, cbb = ca + step;
    if (i + 1 < iters) b.load(wp, sp, blk, cbb, ce);
    a.dot(xs, gs, blk, ca, ce, acc);
    if (i + 1 >= iters) break;
    if (i + 2 < iters) a.load(wp, sp, blk, cbb + step, ce);
    b.dot(xs, gs, blk, cbb, ce, acc);
  }
}

// Single-token GEMV (n == 1): grid ceil(out / rows per block); 8 warps = ks K-slices x (8/ks) row groups of 2 rows.
// Grouped mode: the block's rows lie in one group (the launcher checks), whose x slice is staged.
template <int F>
__global__ void __launch_bounds__(256, 2) gemv_xs_kernel(WRow W, int64_t out, LinearArgs a, int ks) {
  // pdl_wait() inside the staging lambda: the first weight loads (rows_dot_xs issues them before staging) do not
  // depend on the previous kernel and overlap its tail under programmatic dependent launch.
  // (DSV4_PHASE_STAMPS builds) 0 entry, 1 past the wait, 2 x staged, 3 stored; tag: the rows.
  PHASE_DECL;
  PHASE_MARK(0);
  constexpr int R = 2, U = 2, CW = Chunk<F>::CW;
  extern __shared__ float4 xs_raw[];
  float* xs = reinterpret_cast<float*>(xs_raw);
  __shared__ float red[8][R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kslice = warp % ks, rg = warp / ks, rgs = 8 / ks;
  const int64_t block_row0 = static_cast<int64_t>(blockIdx.x) * rgs * R;
  const int64_t row0 = block_row0 + rg * R;
  const int64_t nch = W.in / CW, per = (nch + ks - 1) / ks;
  const int64_t cb = kslice * per, ce = min(nch, cb + per);
  const uint8_t* wp[R];
  const void* sp[R];
  float gs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t rr = min(row0 + r, out - 1);  // rows past the end recompute the last row; never stored
    wp[r] = static_cast<const uint8_t*>(W.w) + rr * row_bytes<F>(W.in);
    sp[r] = scale_row<F>(W, rr);
    gs[r] = W.g;
  }
  const float* x = a.x + (a.group_rows ? (block_row0 / a.group_rows) * a.group_x_off : 0);
  float acc[R];
  rows_dot_xs<F, R, U>(wp, sp, gs, W.blk, cb, ce, xs, [&] {
    pdl_wait();
    PHASE_MARK(1);
    stage_x<F>(x, W.in, xs, a.qa8_x);
    PHASE_MARK(2);
  }, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
  if (ks > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) red[warp][r] = acc[r];
    __syncthreads();
    if (kslice != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float s = red[warp][r];
      for (int j = 1; j < ks; ++j) s += red[warp + j][r];
      acc[r] = s;
    }
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < out) a.y[row0 + r] = a.round_bf16 ? bf16r(acc[r]) : acc[r];
  PHASE_MARK(3);
  PHASE_RECORD("gemv_xs", out);
}

// Routed experts v3. gate/up: grid (ceil(I / 16), n * k); warp w of a block takes intermediate rows r = 16 * bx + 2w
// and r + 1, i.e. 4 weight rows (w1 r, w3 r, w1 r+1, w3 r+1) sharing the staged token row; SwiGLU + clamp + routing
// weight in the epilogue. down: grid (ceil(d / 32), n * k); 4 output rows per warp over the staged act_q row.
template <int F>
__global__ void __launch_bounds__(256, 2) expert_gate_up_xs(ExpertArgs a, int blk) {
  pdl_wait();
  constexpr int R = 4, U = 1, CW = Chunk<F>::CW;
  extern __shared__ float4 xs_raw[];
  float* xs = reinterpret_cast<float*>(xs_raw);
  const int lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16 + 2 * (threadIdx.x >> 5);
  const int slot = blockIdx.y, t = slot / a.k;
  const DevExpert E = a.table[a.sel[slot]];
  const WRow W1{E.w1, E.s1, E.g1, a.d, a.sb1, blk}, W3{E.w3, E.s3, E.g3, a.d, a.sb1, blk};
  const uint8_t* wp[R];
  const void* sp[R];
  float gs[R];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int64_t r = min(r0 + j, a.I - 1), rb = r * row_bytes<F>(a.d);
    wp[2 * j] = static_cast<const uint8_t*>(E.w1) + rb, wp[2 * j + 1] = static_cast<const uint8_t*>(E.w3) + rb;
    sp[2 * j] = scale_row<F>(W1, r), sp[2 * j + 1] = scale_row<F>(W3, r);
    gs[2 * j] = E.g1, gs[2 * j + 1] = E.g3;
  }
  const float* x = a.x + static_cast<int64_t>(t) * a.d;
  float acc[R];
  rows_dot_xs<F, R, U>(wp, sp, gs, blk, 0, a.d / CW, xs, [&] { stage_x<F>(x, a.d, xs, a.qa8_x); }, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
  if (lane == 0)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (r0 + j >= a.I) continue;
      float g = acc[2 * j], u = acc[2 * j + 1];
      if (a.official) g = bf16r(g), u = bf16r(u);
      a.act[static_cast<int64_t>(slot) * a.I + r0 + j] = swiglu1(g, u, a.limit, a.wts ? a.wts[slot] : 1.0f, a.official);
    }
}

template <int F>
__global__ void __launch_bounds__(256, 2) expert_down_xs(ExpertArgs a, int blk) {
  pdl_wait();
  constexpr int R = 4, U = 1, CW = Chunk<F>::CW;
  extern __shared__ float4 xs_raw[];
  float* xs = reinterpret_cast<float*>(xs_raw);
  const int lane = threadIdx.x & 31;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 32 + R * (threadIdx.x >> 5);
  const int slot = blockIdx.y;
  const DevExpert E = a.table[a.sel[slot]];
  const WRow W2{E.w2, E.s2, E.g2, a.I, a.sb2, blk};
  const uint8_t* wp[R];
  const void* sp[R];
  float gs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t rr = min(row0 + r, a.d - 1);
    wp[r] = static_cast<const uint8_t*>(E.w2) + rr * row_bytes<F>(a.I);
    sp[r] = scale_row<F>(W2, rr);
    gs[r] = E.g2;
  }
  const float* x = a.act_q + static_cast<int64_t>(slot) * a.I;
  float acc[R];
  rows_dot_xs<F, R, U>(wp, sp, gs, blk, 0, a.I / CW, xs, [&] { stage_x<F>(x, a.I, xs, a.qa8_act); }, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float y = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < a.d) a.y[static_cast<int64_t>(slot) * a.d + row0 + r] = a.official ? bf16r(y) : y;
  }
}

// Tall matrices (many more 2-row tiles than warps resident at once, e.g. wq_b 32768 x 1024): a persistent grid of
// 2 blocks per SM whose warps walk row tiles gw, gw + total warps, ... as one sequence of (tile, chunk-step) steps,
// the next step's weights in flight while the current one is reduced. The one-tile-per-warp kernel paid a DRAM round
// trip (and the activation staging) per wave of blocks: ~8 waves for wq_b.
template <int F>
__global__ void __launch_bounds__(256, 2) gemv_xs_tiles_kernel(WRow W, int64_t out, LinearArgs a) {
  // pdl_wait() after the first weight loads (see gemv_xs_kernel).
  constexpr int R = 2, U = 2, CW = Chunk<F>::CW;
  extern __shared__ float4 xs_raw[];
  float* xs = reinterpret_cast<float*>(xs_raw);
  const int lane = threadIdx.x & 31;
  const int64_t ntiles = (out + R - 1) / R;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5), nw = static_cast<int64_t>(gridDim.x) * 8;
  const int64_t nch = W.in / CW, ks = (nch + 32 * U - 1) / (32 * U);
  const int64_t steps = gw < ntiles ? ((ntiles - gw + nw - 1) / nw) * ks : 0;
  const float gs[R] = {W.g, W.g};
  // Step s: tile gw + (s / ks) * nw, chunk-step s % ks.
  auto at = [&](int64_t s, const uint8_t* (&wp)[R], const void* (&sp)[R], int64_t& row0, int64_t& c0) {
    row0 = (gw + (s / ks) * nw) * R;
    c0 = (s % ks) * 32 * U + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t rr = min(row0 + r, out - 1);
      wp[r] = static_cast<const uint8_t*>(W.w) + rr * row_bytes<F>(W.in);
      sp[r] = scale_row<F>(W, rr);
    }
  };
  float acc[R] = {0.0f, 0.0f};
  auto flush = [&](int64_t row0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[r]);
      if (lane == 0 && row0 + r < out) a.y[row0 + r] = a.round_bf16 ? bf16r(v) : v;
      acc[r] = 0.0f;
    }
  };
  RowPipe<F, R, U> pa, pb;
  const uint8_t* wpa[R];
  const uint8_t* wpb[R];
  const void* spa[R];
  const void* spb[R];
  int64_t rowa = 0, rowb = 0, ca = 0, cb = 0;
  if (steps > 0) at(0, wpa, spa, rowa, ca), pa.load(wpa, spa, W.blk, ca, nch);
  pdl_wait();
  stage_x<F>(a.x, W.in, xs, a.qa8_x);
  __syncthreads();
  for (int64_t s = 0; s < steps; s += 2) {
    if (s + 1 < steps) at(s + 1, wpb, spb, rowb, cb), pb.load(wpb, spb, W.blk, cb, nch);
    pa.dot(xs, gs, W.blk, ca, nch, acc);
    if (s % ks == ks - 1) flush(rowa);
    if (s + 1 >= steps) break;
    if (s + 2 < steps) at(s + 2, wpa, spa, rowa, ca), pa.load(wpa, spa, W.blk, ca, nch);
    pb.dot(xs, gs, W.blk, cb, nch, acc);
    if ((s + 1) % ks == ks - 1) flush(rowb);
  }
}

// Decode (one token) routed experts as one persistent pass per matrix kind, like gemv_xs_tiles_kernel: 2 blocks per
// SM whose warps walk (slot, row tile) steps over all k selected experts with the next step's weights in flight.
// The per-(row block, slot) kernels above ran 768 blocks for gate/up (~3 waves of 2 per SM), each paying the
// activation staging and a DRAM round trip before its first FMA. Here each block stages once: the token's row
// (gate/up; shared by every slot) or all k act rows (down), QA8 applied on the way when asked.
// GATE_UP: tile = intermediate rows r, r + 1 of slot j (4 weight rows: w1 r, w3 r, w1 r+1, w3 r+1); epilogue SwiGLU.
// down: tile = 4 output rows of slot j.
constexpr int kTilesMaxK = 16;
template <int F, bool GATE_UP>
__global__ void __launch_bounds__(256, 2) expert_tiles_kernel(ExpertArgs a, int blk) {
  pdl_wait();
  constexpr int R = 4, U = 1, CW = Chunk<F>::CW;
  extern __shared__ float4 xs_raw[];
  float* xs = reinterpret_cast<float*>(xs_raw);
  __shared__ DevExpert ex[kTilesMaxK];
  const int lane = threadIdx.x & 31, k = a.k;
  if (threadIdx.x < k) ex[threadIdx.x] = a.table[a.sel[threadIdx.x]];  // one token: slots 0..k-1
  __syncthreads();
  const int64_t K = GATE_UP ? a.d : a.I, rows = GATE_UP ? a.I : a.d;
  const int64_t per_slot = GATE_UP ? (a.I + 1) / 2 : (a.d + R - 1) / R, ntiles = per_slot * k;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5), nw = static_cast<int64_t>(gridDim.x) * 8;
  const int64_t nch = K / CW, ks = (nch + 32 * U - 1) / (32 * U);
  const int64_t steps = gw < ntiles ? ((ntiles - gw + nw - 1) / nw) * ks : 0;
  struct Step {
    const uint8_t* wp[R];
    const void* sp[R];
    float gs[R];
    const float* xsj;
    int64_t tile, c0;
  };
  auto at = [&](int64_t s, Step& st) {
    st.tile = gw + (s / ks) * nw;
    st.c0 = (s % ks) * 32 * U + lane;
    const int j = static_cast<int>(st.tile / per_slot);
    const int64_t rt = st.tile % per_slot;
    const DevExpert& E = ex[j];
    if (GATE_UP) {
      const WRow W1{E.w1, E.s1, E.g1, a.d, a.sb1, blk}, W3{E.w3, E.s3, E.g3, a.d, a.sb1, blk};
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int64_t r = min(2 * rt + jj, rows - 1), rb = r * row_bytes<F>(a.d);
        st.wp[2 * jj] = static_cast<const uint8_t*>(E.w1) + rb, st.wp[2 * jj + 1] = static_cast<const uint8_t*>(E.w3) + rb;
        st.sp[2 * jj] = scale_row<F>(W1, r), st.sp[2 * jj + 1] = scale_row<F>(W3, r);
        st.gs[2 * jj] = E.g1, st.gs[2 * jj + 1] = E.g3;
      }
      st.xsj = xs;
    } else {
      const WRow W2{E.w2, E.s2, E.g2, a.I, a.sb2, blk};
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t rr = min(rt * R + r, rows - 1);
        st.wp[r] = static_cast<const uint8_t*>(E.w2) + rr * row_bytes<F>(a.I);
        st.sp[r] = scale_row<F>(W2, rr);
        st.gs[r] = E.g2;
      }
      st.xsj = xs + static_cast<int64_t>(j) * a.I;
    }
  };
  float acc[R] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto flush = [&](int64_t tile) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
      const int j = static_cast<int>(tile / per_slot);
      const int64_t rt = tile % per_slot;
      if (GATE_UP) {
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int64_t r = 2 * rt + jj;
          if (r >= rows) continue;
          float g = acc[2 * jj], u = acc[2 * jj + 1];
          if (a.official) g = bf16r(g), u = bf16r(u);
          a.act[static_cast<int64_t>(j) * a.I + r] = swiglu1(g, u, a.limit, a.wts ? a.wts[j] : 1.0f, a.official);
        }
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (rt * R + r < rows) a.y[static_cast<int64_t>(j) * a.d + rt * R + r] = a.official ? bf16r(acc[r]) : acc[r];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  };
  RowPipe<F, R, U> pa, pb;
  Step sa, sb;
  if (steps > 0) at(0, sa), pa.load(sa.wp, sa.sp, blk, sa.c0, nch);
  if (GATE_UP) {
    stage_x<F>(a.x, a.d, xs, a.qa8_x);
  } else {
    for (int j = 0; j < k; ++j) stage_x<F>(a.act_q + static_cast<int64_t>(j) * a.I, a.I, xs + static_cast<int64_t>(j) * a.I, a.qa8_act);
  }
  __syncthreads();
  for (int64_t s = 0; s < steps; s += 2) {
    if (s + 1 < steps) at(s + 1, sb), pb.load(sb.wp, sb.sp, blk, sb.c0, nch);
    pa.dot(sa.xsj, sa.gs, blk, sa.c0, nch, acc);
    if (s % ks == ks - 1) flush(sa.tile);
    if (s + 1 >= steps) break;
    if (s + 2 < steps) at(s + 2, sa), pa.load(sa.wp, sa.sp, blk, sa.c0, nch);
    pb.dot(sb.xsj, sb.gs, blk, sb.c0, nch, acc);
    if ((s + 1) % ks == ks - 1) flush(sb.tile);
  }
}
