// Single-token decode attention as ONE launch: the three split-KV kernels (scores, pv, merge; kernels.cu) as the
// phases of one thread-block cluster per 16-head group, which meet at hardware cluster barriers and exchange their
// chunk statistics and partial outputs through distributed shared memory (DSMEM).
//
// Why: the decode trace (docs/BENCHMARKS.md) had the three launches at ~21 us per layer for ~1.3 MB of KV: two kernel
// boundaries (~2.5 us each with PDL) plus each kernel's fixed latency. An earlier one-launch version whose 160 blocks
// met at two GLOBAL-memory barriers was slower (barriers 2.5 + 4.2 us, session 9); a cluster barrier is a hardware
// barrier among <= 16 co-scheduled blocks, and the data they exchange never leaves the GPC.
// Measured (session 13, one H200 / 2xH200): the kernel itself 17.4 us per layer in the decode trace vs 21.0 for the
// three launches, but the step no faster (A/B -0.8 us per layer on one H200, +0.8 / +3.6 under TP2): the next kernel
// (wo_a's ring GEMV) lost time -- its blocks, which start their weight copies beside the tiny merge kernel, do not
// fit beside these blocks' ~100 KB of shared memory. So it is opt-in (DSV4_ATTEND_CLUSTER=16 / 8 / auto).
//
// Numerics: the same function as the split kernels -- the same per-row scores (att_tile_scores), per-chunk (max,
// sum exp) in double (att_chunk_stats), global (M, Z) with the sink added once, p = exp(S - M) / Z ([official] BF16),
// p * v summed over a chunk's rows in row order, the chunks' partials summed in chunk order ([official] BF16), the
// fused inverse RoPE and window store of attend_merge_kernel -- with CL chunks (one per block of the cluster) instead
// of the split kernels' ~40 where there are more than CL of those, so only the summation order of Z and of o differs
// (the op test bounds it); where there are at most CL, the blocks are the split kernels' chunks: the same bits.
//
// Layout: block (c, g) of the grid (CL, head groups) = chunk c (rank c of its cluster) of head group g. Its rows sit
// in shared memory from the scores to the p * v (K = V: one load serves both products), all copies in flight at once;
// rows beyond `res` per block (HCA at very long contexts) are processed in batches, reloaded for p * v.
// Included INSIDE kernels.cu's anonymous namespace, after the split kernels' helpers (att_*).
#pragma once
// (<cooperative_groups.h>: included at the top of kernels.cu, outside its namespaces.)

// Dynamic shared memory of attend_cluster_kernel for `res` resident rows of D floats: the rows (reused for the block's
// partial output, 16 heads x D <= res x D), P [16][res], the row pointers and flags.
__host__ __device__ inline size_t att_cl_smem_bytes(int res, int64_t D) {
  return static_cast<size_t>(res) * D * 4 + static_cast<size_t>(kAttHeads) * res * 4 + static_cast<size_t>(res) * (8 + 4);
}

// HB: heads per block (16, or 8: twice the blocks -- 8 clusters of 16 for 64 heads -- each with half the score and
// p * v work). At 16 the scores go by att_tile_scores (warp w: heads w and w + 8, 16 rows at a time), at 8 by
// att_head_scores32 (warp w: head w, 32 rows at a time: every reduce-scatter lane useful; a CSA block's 48 rows in 2
// passes instead of 3 half-empty ones). Every head's arithmetic is the same either way (the chunks depend on H only,
// each score is the same dot product and sum tree), so the two give the same bits. (4 heads per block, 16 clusters
// of 16 for 64 heads, measured +9.4 us per layer, session 29: only 7 such clusters fit an H200 at once at 1 block per
// SM -- the GPCs with 16 free SMs --, so the launch ran in two waves; removed.)
template <int CL, int HB>
__device__ __forceinline__ void attend_cluster_body(AttendArgs& a, int res) {
  static_assert(HB == 16 || HB == 8, "heads per block: 16 or 8");
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  // Phase stamps (DSV4_PHASE_STAMPS builds only; kernels.cu): 0 entry, 1 past the wait, 2 the first batch's rows
  // landed, 3 scores done, 4 stats shared, 5 (M, Z), 6 probabilities, 7 p * v stored, 8 partials shared, 9 merged,
  // 10 exit.
  PHASE_DECL;
  BLOCK_STAMPS_DECL;
  PHASE_MARK(0);
  // The step's position first, before any wait (a step constant: kernels.cu, pdl_wait), so that the rows' addresses
  // do not wait on its round trip after the wait.
  if (a.dpos) {
    a.pos0 = *a.dpos;
    a.n_comp = (a.pos0 + 1) / a.ratio;
  }
  // Two small inputs copied into shared memory with the first rows' cp.async group (att_wait_tile completes them)
  // rather than held in registers across the kernel (at the 2 blocks per SM of the launch bounds, 128 registers):
  // the block's sinks (they were a dependent global load after the first cluster barrier, session 29) and, in the
  // one block that stores it (block 0 of head group 0), the window store's row -- a.kv, itself a window row, so it
  // goes where the rows go: before the wait when they do. It was a dependent load in the last phase, cluster 0's other
  // blocks waiting for it at the final cluster barrier: ~0.7 us of the kernel (phase stamps, session 30).
  static_assert(HB <= 16 && kAttMaxD % 4 == 0, "sinks and the window store's row in static shared memory");
  __shared__ float sink_sm[16];
  __shared__ float4 kv_sm[kAttMaxD / 4];
  const bool storer = a.store_ring && blockIdx.x == 0 && blockIdx.y == 0;
  auto issue_small = [&] {
    const int hb = min(HB, a.H - static_cast<int>(blockIdx.y) * HB);
    if (static_cast<int>(threadIdx.x) < hb) cp_async4(sink_sm + threadIdx.x, a.sink + blockIdx.y * HB + threadIdx.x);
    if (storer && static_cast<int64_t>(threadIdx.x) < a.D / 4)  // kv_back is 0 with the store
      cp_async16(kv_sm + threadIdx.x, reinterpret_cast<const float4*>(a.kv) + threadIdx.x);
  };
  if (a.rows_before_wait) issue_small();
  else pdl_wait();
  extern __shared__ float4 att_cl_smem[];
  float* tile = reinterpret_cast<float*>(att_cl_smem);               // [res][D]; later the partial output [16][D]
  float* P = tile + static_cast<int64_t>(res) * a.D;                 // [16][res]
  const float** rp = reinterpret_cast<const float**>(P + kAttHeads * res);
  int* valid = reinterpret_cast<int*>(rp + res);
  __shared__ float stats[HB * 2];  // this chunk's (max, sum exp) per head: read by the whole cluster
  __shared__ float Ms[HB];
  __shared__ double Zs[HB];
  const int c = static_cast<int>(cluster.block_rank()), h0 = blockIdx.y * HB;
  const int hn = min(HB, a.H - h0);
  const AttGeom g = att_geom(a, 0);
  // The split kernels' chunks at this position (att_split), ceil(chunks / CL) whole ones per block: with at most CL
  // chunks (a sliding-window layer, a short context) every block is one split-KV chunk and the result is the split
  // kernels' bit for bit; with more (a CSA layer: 40 chunks of 16 rows), blocks of 3 chunks.
  const int cr0 = att_split(1, a.H, att_max_rows(a.window, a.kind, a.topk_k, a.pos0 + 1, a.ratio)).rows_per_chunk;
  const int cr = (g.nrows + cr0 - 1) / cr0 > CL ? ((g.nrows + cr0 - 1) / cr0 + CL - 1) / CL * cr0 : cr0;
  const int r0 = min(c * cr, g.nrows), r1 = min(r0 + cr, g.nrows);
  const int D4 = static_cast<int>(a.D / 4);
  const float scale = 1.0f / sqrtf(static_cast<float>(a.D));
  const bool resident = r1 - r0 <= res;  // one batch: the rows stay for p * v
  // The scores [head][row]: with one batch in P itself (ld res, this block's rows from 0), which phase 3 overwrites
  // with the probabilities in place (each thread its own elements), so they never leave the SM; with several
  // batches in the global scratch (ld max_rows, the block's rows at r0..), since P holds one batch only. (Until
  // session 29 always the scratch: a store and two dependent L1/L2 reads on the chain.)
  float* const S = resident ? P : a.scratch + static_cast<int64_t>(h0) * a.max_rows;
  const int64_t ldS = resident ? res : a.max_rows;
  const int so = resident ? -r0 : 0;  // row j of the block's rows at S[h * ldS + so + j]

  // 1. Scores of the chunk's rows and its (max, sum exp) per head.
  {
    if (a.rows_before_wait) {
      att_issue_tile(a, 0, g, r0, min(res, r1 - r0), tile, rp, valid);
      pdl_wait();
    } else {
      issue_small();  // committed with the first rows' group below
    }
    PHASE_MARK(1);
    BLOCK_STAMPS_WAITED;
    // HB 16: q of heads warp and warp + 8; HB 8: of the 4 heads of half wq % 2 (att_scores_8x4)
    float4 q[HB == 16 ? 2 : 4][kAttMaxD / 128];
    const int wq = static_cast<int>(threadIdx.x >> 5), qhf = wq & 1, hq = min(4, hn - 4 * qhf);
    if constexpr (HB == 16) att_load_q(a, 0, h0, hn, q);
    else att_load_q4(a, h0, qhf, hn, q);
    for (int b0 = r0; b0 < r1; b0 += res) {
      const int nb = min(res, r1 - b0);
      if (b0 != r0) __syncthreads();  // the previous batch's rows are no longer read
      if (b0 != r0 || !a.rows_before_wait) att_issue_tile(a, 0, g, b0, nb, tile, rp, valid);
      att_wait_tile();
      if (b0 == r0) PHASE_MARK(2);
      if constexpr (HB == 16) {
        for (int t = 0; t < nb; t += kAttTile)
          att_tile_scores(q, tile + static_cast<int64_t>(t) * a.D, valid + t, min(kAttTile, nb - t), hn, D4, scale, S, ldS, so + b0 + t);
      } else if (hq > 0) {
        for (int rg = wq >> 1; rg * 8 < nb; rg += 4)
          att_scores_8x4(q, tile + static_cast<int64_t>(rg) * 8 * a.D, valid + rg * 8, min(8, nb - rg * 8), hq, D4, scale,
                         S + static_cast<int64_t>(4 * qhf) * ldS, ldS, so + b0 + rg * 8);
      }
    }
  }
  __syncthreads();  // this block's S writes are visible to its own threads
  PHASE_MARK(3);
  att_chunk_stats(S + so + r0, ldS, r1 - r0, hn, stats, 2);
  cluster.sync();  // every chunk's statistics are visible to the cluster
  PHASE_MARK(4);

  // 2. Global (M, Z) per head: the sink once, then the chunks' (max, sum) in chunk order over lanes (double).
  {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int hh = warp; hh < hn; hh += 8) {
      const float sink = sink_sm[hh];
      float m = -INFINITY, z = 0.0f;
      if (lane < CL) {
        const float* st = cluster.map_shared_rank(stats, lane);
        m = st[hh * 2], z = st[hh * 2 + 1];
      }
      const float M = fmaxf(sink, warp_max(m));
      const double zz = warp_sum_d(m != -INFINITY ? static_cast<double>(z) * exp(static_cast<double>(m - M)) : 0.0);
      if (lane == 0) {
        Ms[hh] = M;
        Zs[hh] = exp(static_cast<double>(sink - M)) + zz;
      }
    }
  }
  __syncthreads();
  PHASE_MARK(5);

  // 3. p * v over the chunk's rows, in row order: thread (dim group gi of 4 dims, head half hf of HB / 2 heads).
  // HB 8: the probabilities go to P's second half as [row][8] (Pt), so that a thread's 4 heads of a row are one
  // 16-byte load instead of four (the first half may still hold the scores they are computed from: a resident
  // block's S); the same values into the same FMAs. HB 16 fills P: [head][row] as before.
  constexpr int HH = HB / 2;
  [[maybe_unused]] float* const Pt = P + 8 * res;
  const int gi = threadIdx.x % D4, hf = threadIdx.x / D4;
  float4 acc[HH];
#pragma unroll
  for (int k = 0; k < HH; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int b0 = r0; b0 < r1; b0 += res) {
    const int nb = min(res, r1 - b0);
    __syncthreads();  // P (and, when reloading, the rows) of the previous batch are no longer read
    if (!resident) att_issue_tile(a, 0, g, b0, nb, tile, rp, valid);
    for (int x = threadIdx.x; x < HB * nb; x += blockDim.x) {
      const int hh = x / nb, r = x % nb;
      float p = 0.0f;
      if (hh < hn) {
        const float s = S[static_cast<int64_t>(hh) * ldS + so + b0 + r];
        if (s != -INFINITY) {
          p = static_cast<float>(exp(static_cast<double>(s - Ms[hh])) / Zs[hh]);
          if (a.official) p = bf16r(p);
        }
      }
      if constexpr (HB == 8) Pt[r * 8 + hh] = p;
      else P[hh * res + r] = p;
    }
    if (!resident) cp_async_wait<0>();
    __syncthreads();
    PHASE_MARK(6);
    if (hf < 2) {
      for (int r = 0; r < nb; ++r) {
        const float4 v = reinterpret_cast<const float4*>(tile)[r * D4 + gi];
        float ph[HH];
        if constexpr (HB == 8) {
          const float4 p4 = reinterpret_cast<const float4*>(Pt)[r * 2 + hf];  // heads 4 hf .. 4 hf + 3 of row r
          ph[0] = p4.x, ph[1] = p4.y, ph[2] = p4.z, ph[3] = p4.w;
        } else {
#pragma unroll
          for (int k = 0; k < HH; ++k) ph[k] = P[(hf * HH + k) * res + r];
        }
#pragma unroll
        for (int k = 0; k < HH; ++k) {
          const float p = ph[k];
          acc[k].x += p * v.x, acc[k].y += p * v.y, acc[k].z += p * v.z, acc[k].w += p * v.w;
        }
      }
    }
  }
  __syncthreads();  // the rows are no longer read: their memory takes the partial output
  float* part = tile;  // [HB][D]
  if (hf < 2) {
#pragma unroll
    for (int k = 0; k < HH; ++k) reinterpret_cast<float4*>(part + static_cast<int64_t>(hf * HH + k) * a.D)[gi] = acc[k];
  }
  PHASE_MARK(7);
  cluster.sync();  // every chunk's partial output is visible to the cluster
  PHASE_MARK(8);

  // 4. Merge: block c owns pairs of elements of the group's hn x D outputs; each the sum of the chunks' partials in
  // chunk order ([official] BF16), then (derope) the inverse RoPE of a rope pair, exactly as attend_merge_kernel.
  {
    const int64_t pairs = static_cast<int64_t>(hn) * a.D / 2, per = (pairs + CL - 1) / CL;
    const int64_t nope = a.D - a.derope_dim;
    const float* prt[CL];
#pragma unroll
    for (int cc = 0; cc < CL; ++cc) prt[cc] = cluster.map_shared_rank(part, cc);
    for (int64_t x = c * per + threadIdx.x; x < min(pairs, (c + 1) * per); x += blockDim.x) {
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int cc = 0; cc < CL; ++cc) {
        const float2 v = reinterpret_cast<const float2*>(prt[cc])[x];
        s0 += v.x, s1 += v.y;
      }
      if (a.official) s0 = bf16r(s0), s1 = bf16r(s1);
      const int64_t e = (2 * x) % a.D, hh = (2 * x) / a.D;
      if (a.derope_inv_freq && e >= nope) {
        rope_pair(s0, s1, static_cast<float>(a.pos0), a.derope_inv_freq[(e - nope) / 2], true);
        if (a.official) s0 = bf16r(s0), s1 = bf16r(s1);
      }
      reinterpret_cast<float2*>(a.o + (h0 + hh) * a.D)[e / 2] = make_float2(s0, s1);
    }
  }
  PHASE_MARK(9);
  // The window store of the single token (see attend_merge_kernel: the slot is not read by this step).
  if (storer) {
    float4* dst = reinterpret_cast<float4*>(a.store_ring + (a.pos0 % a.window) * a.D);
    for (int64_t e = threadIdx.x; e < a.D / 4; e += blockDim.x) dst[e] = kv_sm[e];
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
  PHASE_MARK(10);
  PHASE_RECORD("attend_cluster", a.kind);
  BLOCK_STAMPS_END("attend_cluster");
}

// Two blocks per SM (at most 128 registers a thread): the 8 clusters of 16 blocks of Flash's 64 heads at 8 per block
// need 128 blocks, and one GPC of the H200 has fewer than 16 SMs free for them, so at one block per SM only 7
// clusters are resident and the launch runs in two waves (session 30: 152 registers, attention +11.5 us per layer).
template <int CL, int HB = 16>
__global__ void __launch_bounds__(256, 2) attend_cluster_kernel(AttendArgs a, int res) {
  attend_cluster_body<CL, HB>(a, res);
}

// Batched decode (attend_batch): grid.z = the batch's rows, each a single token of its own sequence -- row z's
// pointers and position replace a's, the rest (the layer) is shared. Every row is exactly attend_cluster_kernel of
// that token alone (same chunking, same sums), with the rows' clusters in one launch instead of one launch per row.
template <int CL, int HB = 16>
__global__ void __launch_bounds__(256, 2) attend_cluster_rows_kernel(AttendArgs a, int res, AttendBatch rows) {
  const AttendRow& r = rows.r[blockIdx.z];
  a.q = r.q, a.kv = r.kv, a.ring = r.ring, a.comp = r.comp, a.topk = r.topk, a.o = r.o, a.store_ring = r.store_ring;
  a.scratch = r.scratch, a.pos0 = r.pos0, a.n_comp = r.n_comp, a.dpos = r.dpos, a.max_rows = r.max_rows;
  a.kv_back = r.kv_back;
  attend_cluster_body<CL, HB>(a, res);
}
