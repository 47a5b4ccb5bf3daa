// Prefill attention on warpgroup MMAs (wgmma, BF16 operands from shared memory, fp32 accumulation): official prefill
// chunks (attend_uses_tc) unless DSV4_ATTEND_WG=0 / set_attend_wg(false), which keep attend_tc.cuh's mma.sync kernels.
// Included INSIDE kernels.cu's anonymous namespace after moe_wg.cuh (wg_desc) and attend_tc.cuh (AttGeom, att_geom).
//
// Why: attend_tc's scores kernel wrote every S[query, head, row] (64 x ~640 fp32 per query: 1.3 GB per layer for an
// 8K chunk) to global memory and its p.v kernel read it back twice (two halves of the head dim), each computing
// exp() in double; both re-read the fp32 KV rows (2 KB each) and converted them per tile, and the m16n8k16 mma.sync
// read every operand through registers. Session 15 measured 228 ms of a 973 ms 20-layer 8K prefill in it (~37
// TFLOP/s). Here one block does a query's whole attention and S never leaves the chip:
//   pass 1: for each 64-row tile, S = Q . K^T (wgmma m64n32k16 per warpgroup: 64 heads x its 32 rows), the running
//           per-head max and sum of exp(S - max) (fp32, rescaled when the max grows);
//   merge : (M, Z) per head from both warpgroups' statistics and the sink (added once, as the split-KV kernels do);
//   pass 2: for each tile again, S recomputed (the same wgmmas: the same bits), p = BF16(exp(S - M) x (1 / Z)) into shared
//           memory, and O += P . V (wgmma m64n64k16, P as A, the SAME tile as B read transposed: K = V).
// The QK products are computed twice (once per pass) instead of storing S: 1.5x the minimum tensor work, no S traffic.
//
// Exactness (official numerics): q (norm_rope rounds to BF16), the KV rows (E4M3 x a power of two, BF16 RoPE dims)
// and p (BF16-rounded after the global normalisation, as the CPU does) are BF16 values, so every product is exact;
// only the fp32 summation order, (M, Z) (fp32 online here, double two-pass in the split-KV kernels) and p's division
// (a multiply by 1 / Z: one fp32 rounding more) differ, i.e. rare BF16 rounding flips of p or of o.
// Instruction count matters: with one 8-warp block per SM the kernel is issue-bound (ncu, first version: IPC 1.0,
// 0.32 eligible warps, ~1,300 instructions per warp and tile, half of them rebuilding wgmma descriptors), hence the
// precomputed descriptors (wga_at), the multiply by 1 / Z and the top-k entries loaded a tile ahead.
//
// Operands in shared memory, all as no-swizzle core matrices (8 rows x 16 bytes; wga_off):
//   Q [64 heads][512 dims] (A of QK, K-major), a KV tile [64 rows][512 dims] (B of QK K-major: N = rows; B of PV
//   MN-major: K = rows, N = dims), P [64 heads][64 rows] (A of PV, K-major). Two tile buffers: tile k + 1 is copied
//   (cp.async) while tile k is computed. The rows come from a BF16 copy of this call's ring, chunk kv and compressed
//   entries (attend_wg_rows_kernel), so a tile row is 64 plain 16-byte copies.
// Block: 256 threads = 2 warpgroups, one query, all heads (<= 64; missing heads are zero rows of Q, never written).
// Warpgroup w: rows 32 w .. 32 w + 31 of each tile for S, dims 256 w .. 256 w + 255 of o.
constexpr int kWgaRows = 64;  // KV rows per tile
constexpr int kWgaD = 512;
constexpr int kWgaH = 64;
constexpr int kWgaQBytes = kWgaH * kWgaD * 2;       // 64 KB
constexpr int kWgaTileBytes = kWgaRows * kWgaD * 2;  // 64 KB
constexpr int kWgaPBytes = kWgaH * kWgaRows * 2;     // 8 KB
constexpr size_t kWgaSmem = kWgaQBytes + 2 * kWgaTileBytes + kWgaPBytes;

// Byte offset of element (r, c) of a 64-row operand stored as core matrices: rows r at 16 bytes inside a core matrix,
// 8-row groups 128 bytes apart, 8-column groups 64 x 16 = 1024 bytes apart. As a K-major wgmma operand (K = c):
// LBO 1024 (next 8 columns), SBO 128 (next 8 rows); as an MN-major B (K = r, N = c): LBO 128, SBO 1024.
__device__ __forceinline__ uint32_t wga_off(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * 1024 + (r >> 3) * 128 + (r & 7) * 16 + (c & 7) * 2);
}

// Eight floats as eight BF16 values (a 16-byte operand chunk).
__device__ __forceinline__ uint4 pack_bf16x8(float4 a, float4 b) {
  return make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w));
}

// BF16 row of attention row j of query i in attend_wg_rows_kernel's copy ([ring W][chunk kv n][compressed]), or -1
// for a row that contributes nothing (past the query's rows, a -1 top-k hole, an invisible entry: err bit 1). w: the
// row's top-k entry (wga_topk; CSA rows only), loaded a tile ahead so its latency is not waited for at the copy.
__device__ __forceinline__ int32_t wga_topk(const AttendArgs& a, int i, const AttGeom& g, int j) {
  if (a.kind != 1 || j < g.nwin || j >= g.nrows) return 0;
  return __ldg(a.topk + static_cast<int64_t>(i) * a.topk_k + (j - g.nwin));
}
__device__ __forceinline__ int64_t wga_row(const AttendArgs& a, const AttGeom& g, int j, int32_t w) {
  if (j >= g.nrows) return -1;
  if (j < g.nwin) {
    const int64_t p = g.wstart + j;
    return p >= a.pos0 ? a.window + (p - a.pos0) : p % a.window;
  }
  if (a.kind == 2) return a.window + a.n + (j - g.nwin);
  if (w < 0) return -1;
  if (w >= (g.t + 1) / a.ratio || w >= a.n_comp) {
    if (a.err) atomicOr(a.err, 1);
    return -1;
  }
  return a.window + a.n + w;
}

// rows[W + n + n_comp][512] = BF16(ring | kv | comp) (exact: official numerics makes them BF16 values). The ring is
// only read for positions before pos0, i.e. not at all for a prompt's first chunk.
__global__ void attend_wg_rows_kernel(AttendArgs a, uint16_t* rows) {
  pdl_wait();
  const int64_t ncomp = a.kind == 0 ? 0 : a.n_comp, total = (a.window + a.n + ncomp) * (kWgaD / 8);
  for (int64_t x = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; x < total;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = x / (kWgaD / 8), c = (x % (kWgaD / 8)) * 8;
    const float* src;
    if (r < a.window) {
      if (a.pos0 == 0) continue;
      src = a.ring + r * kWgaD;
    } else if (r < a.window + a.n) {
      src = a.kv + (r - a.window) * kWgaD;
    } else {
      src = a.comp + (r - a.window - a.n) * kWgaD;
    }
    const float4 v0 = __ldg(reinterpret_cast<const float4*>(src + c)), v1 = __ldg(reinterpret_cast<const float4*>(src + c) + 1);
    *reinterpret_cast<uint4*>(rows + r * kWgaD + c) = pack_bf16x8(v0, v1);
  }
}

// D (+)= A x B, m64n32k16, BF16 A and B from shared memory (both K-major), fp32 accumulators.
__device__ __forceinline__ void wgmma_bf16_n32(float (&d)[16], uint64_t ad, uint64_t bd, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(ad), "l"(bd), "r"(acc));
}
// The 32 accumulator registers of an m64n64 wgmma (%0 .. %31, read and written) and their operand list.
#define DSV4_WGA_D32_REGS                                                                                             \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"       \
  "%29,%30,%31}"
#define DSV4_WGA_D32_RW                                                                                               \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),       \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
// D += A x B, m64n64k16, BF16 A (K-major) and B (MN-major: transposed) from shared memory, fp32 accumulators.
__device__ __forceinline__ void wgmma_bf16_n64_tb(float (&d)[32], uint64_t ad, uint64_t bd) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DSV4_WGA_D32_REGS ", %32, %33, 1, 1, 1, 0, 1;\n"
               : DSV4_WGA_D32_RW
               : "l"(ad), "l"(bd));
}

// A descriptor as two words: lo = start address >> 4 | LBO >> 4 << 16, hi = SBO >> 4. An operand's descriptors
// differ only in the start address, so each wgmma adds its constant byte offset / 16 to lo (one integer add; the
// start field cannot carry into LBO: shared addresses are < 2^18) instead of building the descriptor again.
struct WgaDesc {
  uint32_t lo, hi;
};
__device__ __forceinline__ WgaDesc wga_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t d = wg_desc(p, lbo, sbo);
  return WgaDesc{static_cast<uint32_t>(d), static_cast<uint32_t>(d >> 32)};
}
__device__ __forceinline__ uint64_t wga_at(WgaDesc d, uint32_t byte_off) {
  return (static_cast<uint64_t>(d.hi) << 32) | (d.lo + (byte_off >> 4));
}

// grid n queries, 256 threads, kWgaSmem dynamic shared memory.
__global__ void __launch_bounds__(256, 1) attend_wg_kernel(AttendArgs a, const uint16_t* rows) {
  pdl_wait();
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* Qs = smem;
  uint8_t* tiles = smem + kWgaQBytes;
  uint8_t* Ps = tiles + 2 * kWgaTileBytes;
  __shared__ int valid[2][kWgaRows];
  __shared__ float stat_m[2][kWgaH], stat_z[2][kWgaH];
  const int i = blockIdx.x, H = a.H, tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wg = tid >> 7, wq = (tid >> 5) & 3;  // warpgroup; warp in it (heads 16 wq .. + 16)
  const AttGeom geo = att_geom(a, i);
  const int T = (geo.nrows + kWgaRows - 1) / kWgaRows;  // >= 1: the window holds the query's own position
  // Copy mapping (Q and tiles): thread -> row 8 ((tid >> 4) & 7) + ((tid >> 1) & 7) and the 16-byte column blocks
  // 2 ((tid >> 7) + 2 q) + (tid & 1), q = 0..15: a warp copies 16 rows x 32 bytes (whole 32-byte sectors).
  const int cr = 8 * ((tid >> 4) & 7) + ((tid >> 1) & 7);
  auto cblock = [&](int q) { return 2 * ((tid >> 7) + 2 * q) + (tid & 1); };
  {
    const bool ok = cr < H;
    const float* src = a.q + (static_cast<int64_t>(i) * H + (ok ? cr : 0)) * kWgaD;
#pragma unroll 4
    for (int q = 0; q < 16; ++q) {
      const int c = 8 * cblock(q);
      float4 v0 = make_float4(0.f, 0.f, 0.f, 0.f), v1 = v0;
      if (ok) v0 = __ldg(reinterpret_cast<const float4*>(src + c)), v1 = __ldg(reinterpret_cast<const float4*>(src + c) + 1);
      *reinterpret_cast<uint4*>(Qs + wga_off(cr, c)) = pack_bf16x8(v0, v1);
    }
  }
  // Tile k (0 .. 2T - 1): rows (k % T) * 64 .. of pass k / T, into buffer k & 1; one cp.async group per call (empty
  // past the last tile, so the group count stays uniform).
  int32_t w_next = wga_topk(a, i, geo, cr);  // this thread's row of tile 0
  auto issue = [&](int k) {
    if (k < 2 * T) {
      const int64_t src = wga_row(a, geo, (k % T) * kWgaRows + cr, w_next);
      w_next = wga_topk(a, i, geo, ((k + 1) % T) * kWgaRows + cr);  // tile k + 1's, used at the next call
      if ((tid & 0x81) == 0) valid[k & 1][cr] = src >= 0;  // one writer per row
      uint8_t* dst = tiles + (k & 1) * kWgaTileBytes;
      const uint16_t* s = rows + (src >= 0 ? src : 0) * kWgaD;
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        const int c = 8 * cblock(q);
        cp_async16_zfill(dst + wga_off(cr, c), s + c, src >= 0);
      }
    }
    cp_async_commit();
  };
  const float scale = 1.0f / sqrtf(static_cast<float>(kWgaD));
  const int h0 = 16 * wq + g;  // this thread's heads h0, h0 + 8 (accumulator rows)
  float m_run[2] = {-INFINITY, -INFINITY}, z_run[2] = {0.0f, 0.0f};
  float Mh[2] = {0.0f, 0.0f}, rZ[2] = {1.0f, 1.0f};  // per head: M and 1 / Z
  const WgaDesc qd = wga_desc(Qs, 1024, 128), pd = wga_desc(Ps, 1024, 128);
  const WgaDesc kd = wga_desc(tiles, 1024, 128), vd = wga_desc(tiles, 128, 1024);  // B of QK / PV, buffer 0
  float o[4][32];
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int e = 0; e < 32; ++e) o[c][e] = 0.0f;
  float s[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) s[e] = 0.0f;
  issue(0);
  for (int k = 0; k < 2 * T; ++k) {
    __syncthreads();  // tile k - 1 is consumed by every thread: its buffer may be refilled
    issue(k + 1);
    cp_async_wait<1>();  // this thread's copies of tile k
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // st.shared / cp.async -> the wgmma reads
    __syncthreads();     // every thread's copies of tile k (and of Q, the first time)
    const int buf = k & 1;
    const uint32_t boff = static_cast<uint32_t>(buf * (kWgaTileBytes >> 4));
    const WgaDesc kb{kd.lo + boff, kd.hi}, vb{vd.lo + boff, vd.hi};
    bool vf[8];  // validity of this thread's 8 tile rows 32 wg + 8 ni + 2 t + q
#pragma unroll
    for (int e = 0; e < 8; ++e) vf[e] = valid[buf][32 * wg + 8 * (e >> 1) + 2 * t + (e & 1)] != 0;
    if (k == T) {  // merge: (M, Z) per head from both warpgroups' statistics and the sink
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int h = h0 + 8 * hh;
        const float sink = h < H ? a.sink[h] : 0.0f;
        const float m0 = stat_m[0][h], m1 = stat_m[1][h];
        const float M = fmaxf(sink, fmaxf(m0, m1));
        float Z = expf(sink - M);
        if (m0 != -INFINITY) Z += stat_z[0][h] * expf(m0 - M);
        if (m1 != -INFINITY) Z += stat_z[1][h] * expf(m1 - M);
        Mh[hh] = M, rZ[hh] = 1.0f / Z;
      }
    }
    // S for this warpgroup's 32 rows: s[4 ni + 2 hh + q] = head h0 + 8 hh, tile row 32 wg + 8 ni + 2 t + q.
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < kWgaD / 16; ++ks)
      wgmma_bf16_n32(s, wga_at(qd, 2 * ks * 1024), wga_at(kb, 2 * ks * 1024 + wg * 512), ks > 0);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_fence_acc(s);
    if (k < T) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float v[8], mx = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const float x = vf[2 * ni + q] ? s[4 * ni + 2 * hh + q] * scale : -INFINITY;
            v[2 * ni + q] = x;
            mx = fmaxf(mx, x);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m_run[hh], mx);
        if (mn != -INFINITY) {
          float z = m_run[hh] != -INFINITY ? z_run[hh] * expf(m_run[hh] - mn) : 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) z += expf(v[e] - mn);  // 0 for a skipped row (-inf)
          z_run[hh] = z, m_run[hh] = mn;
        }
      }
      if (k == T - 1) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float z = z_run[hh];
          z += __shfl_xor_sync(0xffffffffu, z, 1);
          z += __shfl_xor_sync(0xffffffffu, z, 2);
          if (t == 0) stat_m[wg][h0 + 8 * hh] = m_run[hh], stat_z[wg][h0 + 8 * hh] = z;
        }
      }
    } else {
      // p = BF16(exp(S - M) x (1 / Z)) into P (A of PV: heads x tile rows), then O += P . V.
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = 32 * wg + 8 * ni + 2 * t;
          float p[2];
#pragma unroll
          for (int q = 0; q < 2; ++q)
            p[q] = vf[2 * ni + q] ? expf(s[4 * ni + 2 * hh + q] * scale - Mh[hh]) * rZ[hh] : 0.0f;
          *reinterpret_cast<uint32_t*>(Ps + wga_off(h0 + 8 * hh, r)) = pack_bf16x2(p[0], p[1]);
        }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();  // both warpgroups' halves of P
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int ks = 0; ks < kWgaRows / 16; ++ks)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          wgmma_bf16_n64_tb(o[c], wga_at(pd, 2 * ks * 1024), wga_at(vb, 2 * ks * 128 + (32 * wg + 8 * c) * 1024));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
      for (int c = 0; c < 4; ++c) wg_fence_acc(o[c]);
    }
  }
  cp_async_wait<0>();
  // o[c][4 ni + 2 hh + q] (ni 0..7): head h0 + 8 hh, dim 256 wg + 64 c + 8 ni + 2 t + q -- whole RoPE pairs (even
  // dim, next), so a.derope_inv_freq applies attn_out's inverse RoPE here, as norm_rope does it (rope_pair at the
  // query's position, then [official] BF16): bit for bit, and one pass over o less.
  const int nope = a.derope_inv_freq ? kWgaD - a.derope_dim : kWgaD;
  const float fp = static_cast<float>(a.pos0 + i);
  float* o0 = a.o + (static_cast<int64_t>(i) * H + h0) * kWgaD + 256 * wg + 2 * t;  // head h0; h0 + 8 at + 8 rows
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
      const int e = 256 * wg + 64 * c + 8 * ni + 2 * t;
      float cs = 1.0f, sn = 0.0f;
      const bool rot = e >= nope;
      if (rot) rope_angle(fp, __ldg(a.derope_inv_freq + (e - nope) / 2), true, cs, sn);  // once for both heads
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        if (h0 + 8 * hh >= H) continue;
        float x0 = o[c][4 * ni + 2 * hh], x1 = o[c][4 * ni + 2 * hh + 1];
        if (a.official) x0 = bf16r(x0), x1 = bf16r(x1);
        if (rot) {  // = rope_pair(x0, x1, fp, inv_freq, true), then [official] BF16
          rope_apply(x0, x1, cs, sn);
          if (a.official) x0 = bf16r(x0), x1 = bf16r(x1);
        }
        *reinterpret_cast<float2*>(o0 + hh * 8 * kWgaD + 64 * c + 8 * ni) = make_float2(x0, x1);
      }
    }
}
