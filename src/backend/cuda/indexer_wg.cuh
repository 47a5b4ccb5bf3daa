// Prefill indexer scores on warpgroup MMAs (wgmma, BF16 operands from shared memory, fp32 accumulation): official
// prefill chunks with 64 index heads of 128 dims (indexer_uses_wg) unless DSV4_INDEXER_WG=0 / set_indexer_wg(false),
// which keep indexer_scores_v2. Included INSIDE kernels.cu's anonymous namespace after attend_wg.cuh (wga_off,
// wga_desc, wga_at) and indexer_scores_v2 (kIdxParts: the association of the head sum).
//
// Why: indexer_scores_v2 gives a block 64 keys of ONE query, so every block re-stages that query's 32 KB of fp32
// queries and its 64 keys (an 8K chunk's CSA layer: 8,192 x 32 blocks x 64 KB = 17 GB through L2) and does the dot
// products on the FMA pipe: 84.6 ms of a 20-layer 8K prefill (session 15), ~9.4 ms per CSA layer for ~0.14 TFLOP.
// Here a block holds 4 queries (64 KB of BF16 queries, staged once) and walks all their visible keys in 64-key tiles;
// warpgroup w computes S^T = keys . q^T for its queries w and w + 2 (m64n64k16: M = 64 keys, N = 64 heads, K = 128).
//
// Exact under official numerics, i.e. the same bits as indexer_scores_v2 (the op test compares them with memcmp, and
// decode keeps v2): the queries and the cached keys are FP4-grid values (Hadamard + MXFP4 simulation), exact in
// BF16; a product of two is a small integer times a power of two and a 128-term dot of them is exact in fp32 while
// the blocks' scales span < ~11 binades, so the dot is the same number in any summation order. The head sum is then
// formed with v2's association: relu(d) x qscale x (w x wscale) in double, partial q = the 4 heads 4q .. 4q + 3 in
// order, then the 16 partials in order; float, BF16.
// Accumulator of query j, thread (warp wq of its warpgroup, lane 4 g + t): acc[4 j8 + 2 r + c] = key 16 wq + g + 8 r of
// the tile, head 8 j8 + 2 t + c. Heads 4q .. 4q + 3 (q = 2 j8 + t / 2) sit in lanes t = 2u, 2u + 1 (u = t / 2): lane
// 2u sums its two and its neighbour's two; lane 0 then takes the odd partials from lane 2 and sums all 16 in order.
constexpr int kIwQueries = 4;  // queries per block
constexpr int kIwKeys = 64;    // keys per tile
constexpr int kIwDi = 128;
constexpr int kIwHeads = 64;
constexpr int kIwQBytes = kIwHeads * kIwDi * 2;  // 16 KB per query
constexpr int kIwKBytes = kIwKeys * kIwDi * 2;   // 16 KB per key tile
constexpr size_t kIwSmem = kIwQueries * kIwQBytes + kIwKBytes * 2;
static_assert(kIdxParts == 16 && kIwHeads == 4 * kIdxParts, "the head sum's association: 16 partials of 4 heads");

// D = A x B, m64n64k16, BF16 A and B from shared memory (both K-major), fp32 accumulators (scale-d 0 at acc == 0).
__device__ __forceinline__ void wgmma_bf16_n64(float (&d)[32], uint64_t ad, uint64_t bd, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DSV4_WGA_D32_REGS ", %32, %33, p, 1, 1, 0, 0;\n}"
      : DSV4_WGA_D32_RW
      : "l"(ad), "l"(bd), "r"(acc));
}

// grid ceil(n / kIwQueries), 256 threads, kIwSmem dynamic shared memory. scores [n][ld]: every entry written (-inf
// past a query's visible keys), as indexer_scores_v2 does.
__global__ void __launch_bounds__(256, 2) indexer_wg_kernel(const float* q, const float* wts, const float* keys, int n,
                                                             int64_t pos0, int ratio, int64_t n_keys, bool official,
                                                             float* scores, int64_t ld) {
  pdl_wait();
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* Qs = smem;                           // [query][64 heads x 128 dims], core matrices (wga_off)
  uint8_t* Ks = smem + kIwQueries * kIwQBytes;  // [buffer][64 keys x 128 dims]
  __shared__ float ws[kIwQueries][kIwHeads];
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3, wg = tid >> 7, wq = (tid >> 5) & 3;
  const int t0 = blockIdx.x * kIwQueries, nq = min(kIwQueries, n - t0);
  auto key_end = [&](int qi) { return min(min(ld, (pos0 + t0 + qi + 1) / ratio), n_keys); };
  const int64_t kend = key_end(nq - 1);  // the block's last query sees the most keys
  const int ntiles = static_cast<int>((kend + kIwKeys - 1) / kIwKeys);
  // Copy mapping: row 8 ((tid >> 4) & 7) + ((tid >> 1) & 7) of a 64-row operand, 16-byte column blocks
  // 2 ((tid >> 7) + 2 u) + (tid & 1): a warp covers 16 rows x 32 bytes.
  const int cr = 8 * ((tid >> 4) & 7) + ((tid >> 1) & 7);
  {
#pragma unroll 4
    for (int u = 0; u < 4 * kIwQueries; ++u) {  // 4 queries x 16 column blocks
      const int x = (tid >> 7) + 2 * u, qi = x >> 3, cb = 2 * (x & 7) + (tid & 1);
      float4 v0 = make_float4(0.f, 0.f, 0.f, 0.f), v1 = v0;
      if (qi < nq) {
        const float4* src = reinterpret_cast<const float4*>(q + ((static_cast<int64_t>(t0) + qi) * kIwHeads + cr) * kIwDi + 8 * cb);
        v0 = __ldg(src), v1 = __ldg(src + 1);
      }
      *reinterpret_cast<uint4*>(Qs + qi * kIwQBytes + wga_off(cr, 8 * cb)) = pack_bf16x8(v0, v1);
    }
    const int qi = tid / kIwHeads, h = tid % kIwHeads;
    ws[qi][h] = qi < nq ? wts[(static_cast<int64_t>(t0) + qi) * kIwHeads + h] : 0.0f;
  }
  const float wscale = 1.0f / sqrtf(static_cast<float>(kIwHeads));
  const float qscale = 1.0f / sqrtf(static_cast<float>(kIwDi));
  const WgaDesc qd = wga_desc(Qs, 1024, 128), kd = wga_desc(Ks, 1024, 128);
  const int qa = wg, qb = wg + 2;  // this warpgroup's queries
  for (int kt = 0; kt < ntiles; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kIwKeys;
    {  // the tile's keys as BF16 (zeros past the block's visible keys); buffer kt & 1 was last read two tiles ago
      uint8_t* dst = Ks + (kt & 1) * kIwKBytes;
      const bool ok = k0 + cr < kend;
      const float4* src = reinterpret_cast<const float4*>(keys + (k0 + (ok ? cr : 0)) * kIwDi);
      float4 v[8];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int cb = 2 * ((tid >> 7) + 2 * u) + (tid & 1);
        v[2 * u] = v[2 * u + 1] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok) v[2 * u] = __ldg(src + 2 * cb), v[2 * u + 1] = __ldg(src + 2 * cb + 1);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int cb = 2 * ((tid >> 7) + 2 * u) + (tid & 1);
        const float4 a = v[2 * u], b = v[2 * u + 1];
        *reinterpret_cast<uint4*>(dst + wga_off(cr, 8 * cb)) = pack_bf16x8(a, b);
      }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // st.shared -> the wgmma reads
    __syncthreads();  // the tile (and the queries, the first time) staged by every thread
    const uint32_t boff = static_cast<uint32_t>((kt & 1) * (kIwKBytes >> 4));
    const WgaDesc kb{kd.lo + boff, kd.hi};
    float acc[2][32];
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t qoff = static_cast<uint32_t>((j ? qb : qa) * kIwQBytes);
#pragma unroll
      for (int ks = 0; ks < kIwDi / 16; ++ks) wgmma_bf16_n64(acc[j], wga_at(kb, 2 * ks * 1024), wga_at(qd, qoff + 2 * ks * 1024), ks > 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int j = 0; j < 2; ++j) wg_fence_acc(acc[j]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int qi = j ? qb : qa;
      if (qi >= nq) continue;  // warp-uniform
      const int64_t kq = key_end(qi);
      float* row = scores + (static_cast<int64_t>(t0) + qi) * ld;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        double sum = 0.0;
#pragma unroll
        for (int j8 = 0; j8 < 8; ++j8) {
          const int h = 8 * j8 + 2 * t;
          const float d0 = acc[j][4 * j8 + 2 * r], d1 = acc[j][4 * j8 + 2 * r + 1];
          const double va = d0 > 0 ? static_cast<double>(d0) * qscale * (ws[qi][h] * wscale) : 0.0;
          const double vb = d1 > 0 ? static_cast<double>(d1) * qscale * (ws[qi][h + 1] * wscale) : 0.0;
          const double na = __shfl_down_sync(0xffffffffu, va, 1), nb = __shfl_down_sync(0xffffffffu, vb, 1);
          // lanes t = 0, 2: partial 2 j8 + t / 2, from +0.0 as v2's (so a sum of zeros has v2's sign)
          const double part = (((0.0 + va) + vb) + na) + nb;
          const double odd = __shfl_down_sync(0xffffffffu, part, 2);  // lane 0: partial 2 j8 + 1
          sum = j8 == 0 ? part : sum + part;
          sum += odd;
        }
        const int64_t key = k0 + 16 * wq + g + 8 * r;
        if (t == 0 && key < ld) {
          float sf = -INFINITY;
          if (key < kq) {
            sf = static_cast<float>(sum);
            if (official) sf = bf16r(sf);
          }
          row[key] = sf;
        }
      }
    }
  }
  // Keys past every computed tile: -inf.
  for (int qi = 0; qi < nq; ++qi)
    for (int64_t key = static_cast<int64_t>(ntiles) * kIwKeys + tid; key < ld; key += blockDim.x)
      scores[(static_cast<int64_t>(t0) + qi) * ld + key] = -INFINITY;
}
