// Prefill attention on the tensor cores (official numerics), included INSIDE kernels.cu's anonymous namespace after
// the split-KV attention (attend_row, att_geom) and moe_grouped.cuh (pack_bf16x2, mma_bf16_16816).
//
// Why: the split-KV kernels give one block to (query, group of 16 heads) and read every candidate KV row once for the
// scores and once for p.v, so a 2,048-token chunk streamed each query's ~640 rows of 2 KB 8 times (4 head groups x 2
// passes) and did fp32 FMAs: 32 ms per layer for 8K tokens. All heads share the single latent KV head, so here one
// block holds all heads of a query and each row is read once per pass, and both products run as BF16 mma.sync with
// fp32 accumulation.
// Exact under official numerics: q (norm_rope rounds every dim to BF16), the KV rows (SIM8 nope dims = E4M3 x a power
// of two, BF16 RoPE dims) and the probabilities (BF16-rounded after the global normalisation, as the CPU does) are
// BF16 values, so every product is exact and only the fp32 summation (order, and the tensor cores' accumulation,
// which is not round-to-nearest) differs from the split-KV kernels.
// Softmax statistics (max, then sum of exp in double, then the sink) follow the split-KV kernels with one chunk.
//   1. attend_tc_scores: grid n queries; S[i, h, j] = q_h . k_j / sqrt(D) (-inf for skipped rows) into the scratch,
//      then per head (max_j S, sum_j exp(S - max)) into stats, as attend_scores_kernel does for a single chunk.
//   2. attend_tc_pv: grid (n queries, D / 256 halves); (M, Z) per head with the sink, p = BF16(exp(S - M) / Z), and
//      o[:, d0 .. d0 + 256) = P . V, BF16-rounded.
constexpr int kTcAttRows = 32;                 // KV rows per shared-memory tile
constexpr int kTcAttD = 512;                   // head dim
constexpr int kTcAttH = 64;                    // heads per block (all of a query's)
constexpr int kTcAttQLd = kTcAttD / 2 + 4;     // words per Q/K row: conflict-free fragment loads
constexpr int kTcAttDv = 256;                  // output dims per p.v block
constexpr int kTcAttPLd = kTcAttRows / 2 + 4;  // words per P row / transposed V row

__device__ __forceinline__ void att_tc_rows(const AttendArgs& a, int i, const AttGeom& g, int j0, int nr,
                                            const float** rp, int* valid) {
  if (threadIdx.x < kTcAttRows) {
    bool skip = true;
    const float* p = nullptr;
    if (static_cast<int>(threadIdx.x) < nr) p = attend_row(a, i, g.t, g.wstart, g.nwin, j0 + threadIdx.x, &skip);
    rp[threadIdx.x] = p;
    valid[threadIdx.x] = !skip && p != nullptr;
  }
}

__global__ void __launch_bounds__(256) attend_tc_scores(AttendArgs a, float* stats) {
  pdl_wait();
  extern __shared__ uint32_t smw[];
  uint32_t* Qs = smw;                          // [kTcAttH][kTcAttQLd]: BF16 pairs
  uint32_t* Ks = smw + kTcAttH * kTcAttQLd;    // [kTcAttRows][kTcAttQLd]
  __shared__ const float* rp[kTcAttRows];
  __shared__ int valid[kTcAttRows];
  const int i = blockIdx.x, H = a.H;
  const AttGeom g = att_geom(a, i);
  constexpr int D4 = kTcAttD / 4;
  for (int x = threadIdx.x; x < kTcAttH * D4; x += blockDim.x) {
    const int h = x / D4, e4 = x % D4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (h < H) v = __ldg(reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(i) * H + h) * kTcAttD) + e4);
    *reinterpret_cast<uint2*>(&Qs[h * kTcAttQLd + 2 * e4]) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int mt = warp >> 1, nt0 = (warp & 1) * 2;  // heads 16 mt .. + 16, rows 8 nt0 .. + 16 of the tile
  const float scale = 1.0f / sqrtf(static_cast<float>(kTcAttD));
  float* S = a.scratch + static_cast<int64_t>(i) * H * a.max_rows;
  for (int j0 = 0; j0 < g.nrows; j0 += kTcAttRows) {
    const int nr = min(kTcAttRows, g.nrows - j0);
    __syncthreads();  // the previous tile is consumed (and Q staged, the first time)
    att_tc_rows(a, i, g, j0, nr, rp, valid);
    __syncthreads();
    for (int x = threadIdx.x; x < kTcAttRows * D4; x += blockDim.x) {
      const int r = x / D4, e4 = x % D4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (valid[r]) v = __ldg(reinterpret_cast<const float4*>(rp[r]) + e4);
      *reinterpret_cast<uint2*>(&Ks[r * kTcAttQLd + 2 * e4]) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
    __syncthreads();
    if (mt * 16 < H) {
      float acc[2][4] = {};
      const int hb = mt * 16;
#pragma unroll 4
      for (int kw = 0; kw < kTcAttD / 2; kw += 8) {
        uint32_t af[4];
        af[0] = Qs[(hb + gid) * kTcAttQLd + kw + tig];
        af[1] = Qs[(hb + gid + 8) * kTcAttQLd + kw + tig];
        af[2] = Qs[(hb + gid) * kTcAttQLd + kw + 4 + tig];
        af[3] = Qs[(hb + gid + 8) * kTcAttQLd + kw + 4 + tig];
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          const int rb = (nt0 + nn) * 8 + gid;
          mma_bf16_16816(acc[nn], af, Ks[rb * kTcAttQLd + kw + tig], Ks[rb * kTcAttQLd + kw + 4 + tig]);
        }
      }
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int head = hb + gid + 8 * h2, r = (nt0 + nn) * 8 + 2 * tig + q;
            if (head < H && r < nr) S[static_cast<int64_t>(head) * a.max_rows + j0 + r] = valid[r] ? acc[nn][2 * h2 + q] * scale : -INFINITY;
          }
    }
  }
  __syncthreads();  // this block's S writes are visible to its own threads
  for (int h = warp; h < H; h += 8) {  // as attend_scores_kernel with one chunk
    const float* Sh = S + static_cast<int64_t>(h) * a.max_rows;
    float mx = -INFINITY;
    for (int j = lane; j < g.nrows; j += 32) mx = fmaxf(mx, Sh[j]);
    mx = warp_max(mx);
    double z = 0.0;
    if (mx != -INFINITY)
      for (int j = lane; j < g.nrows; j += 32)
        if (Sh[j] != -INFINITY) z += exp(static_cast<double>(Sh[j] - mx));
    z = warp_sum_d(z);
    if (lane == 0) {
      float* st = stats + (static_cast<int64_t>(i) * H + h) * 2;
      st[0] = mx;
      st[1] = static_cast<float>(z);
    }
  }
}

__global__ void __launch_bounds__(256) attend_tc_pv(AttendArgs a, const float* stats) {
  pdl_wait();
  __shared__ uint32_t Pw[kTcAttH * kTcAttPLd];   // [head][row pair]
  __shared__ uint32_t Vw[kTcAttDv * kTcAttPLd];  // [dim][row pair]: V transposed, so p.v's B fragments are words
  __shared__ const float* rp[kTcAttRows];
  __shared__ int valid[kTcAttRows];
  __shared__ float Ms[kTcAttH];
  __shared__ double Zs[kTcAttH];
  const int i = blockIdx.x, H = a.H, d0 = blockIdx.y * kTcAttDv;
  const AttGeom g = att_geom(a, i);
  if (threadIdx.x < H) {  // as attend_pv_kernel with one chunk: the sink once, then the chunk's (max, sum)
    const int h = threadIdx.x;
    const float* st = stats + (static_cast<int64_t>(i) * H + h) * 2;
    const float M = fmaxf(a.sink[h], st[0]);
    double Z = exp(static_cast<double>(a.sink[h] - M));
    if (st[0] != -INFINITY) Z += static_cast<double>(st[1]) * exp(static_cast<double>(st[0] - M));
    Ms[h] = M;
    Zs[h] = Z;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int mt = warp & 3, nb = (warp >> 2) * 16;  // heads 16 mt .. + 16; dim tiles nb .. nb + 16 (8 dims each)
  float acc[16][4] = {};
  const float* S = a.scratch + static_cast<int64_t>(i) * H * a.max_rows;
  __nv_bfloat16* Ph = reinterpret_cast<__nv_bfloat16*>(Pw);
  for (int j0 = 0; j0 < g.nrows; j0 += kTcAttRows) {
    const int nr = min(kTcAttRows, g.nrows - j0);
    __syncthreads();  // the previous tile is consumed (and Ms/Zs written, the first time)
    att_tc_rows(a, i, g, j0, nr, rp, valid);
    __syncthreads();
    // Transposed V: a thread takes rows 2 rp2, 2 rp2 + 1 and 4 dims and stores 4 words (row pairs); the 32 lanes of a
    // warp (16 row pairs x 2 dim groups) hit 32 different banks.
    for (int x = threadIdx.x; x < (kTcAttRows / 2) * (kTcAttDv / 4); x += blockDim.x) {
      const int rp2 = x % (kTcAttRows / 2), e4 = x / (kTcAttRows / 2);
      const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 v0 = valid[2 * rp2] ? __ldg(reinterpret_cast<const float4*>(rp[2 * rp2] + d0) + e4) : z4;
      const float4 v1 = valid[2 * rp2 + 1] ? __ldg(reinterpret_cast<const float4*>(rp[2 * rp2 + 1] + d0) + e4) : z4;
      Vw[(4 * e4 + 0) * kTcAttPLd + rp2] = pack_bf16x2(v0.x, v1.x);
      Vw[(4 * e4 + 1) * kTcAttPLd + rp2] = pack_bf16x2(v0.y, v1.y);
      Vw[(4 * e4 + 2) * kTcAttPLd + rp2] = pack_bf16x2(v0.z, v1.z);
      Vw[(4 * e4 + 3) * kTcAttPLd + rp2] = pack_bf16x2(v0.w, v1.w);
    }
    for (int x = threadIdx.x; x < kTcAttH * kTcAttRows; x += blockDim.x) {
      const int h = x / kTcAttRows, r = x % kTcAttRows;
      float p = 0.0f;
      if (h < H && r < nr) {
        const float s = S[static_cast<int64_t>(h) * a.max_rows + j0 + r];
        if (s != -INFINITY) p = static_cast<float>(exp(static_cast<double>(s - Ms[h])) / Zs[h]);  // BF16 below
      }
      Ph[h * (2 * kTcAttPLd) + r] = __float2bfloat16_rn(p);
    }
    __syncthreads();
    if (mt * 16 < H) {
      const int hb = mt * 16;
#pragma unroll
      for (int kw = 0; kw < kTcAttRows / 2; kw += 8) {
        uint32_t af[4];
        af[0] = Pw[(hb + gid) * kTcAttPLd + kw + tig];
        af[1] = Pw[(hb + gid + 8) * kTcAttPLd + kw + tig];
        af[2] = Pw[(hb + gid) * kTcAttPLd + kw + 4 + tig];
        af[3] = Pw[(hb + gid + 8) * kTcAttPLd + kw + 4 + tig];
#pragma unroll
        for (int t = 0; t < 16; ++t) {
          const int dn = (nb + t) * 8 + gid;
          mma_bf16_16816(acc[t], af, Vw[dn * kTcAttPLd + kw + tig], Vw[dn * kTcAttPLd + kw + 4 + tig]);
        }
      }
    }
  }
  if (mt * 16 >= H) return;
#pragma unroll
  for (int t = 0; t < 16; ++t)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int head = mt * 16 + gid + 8 * h2;
      if (head >= H) continue;
      const int dim = d0 + (nb + t) * 8 + 2 * tig;
      float* o = a.o + (static_cast<int64_t>(i) * H + head) * kTcAttD + dim;
      o[0] = a.official ? bf16r(acc[t][2 * h2]) : acc[t][2 * h2];
      o[1] = a.official ? bf16r(acc[t][2 * h2 + 1]) : acc[t][2 * h2 + 1];
    }
}
