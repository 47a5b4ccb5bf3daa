// Probe: is the decode MoE expert walk limited by its ACCESS PATTERN? DRAM bandwidth of expert_mma.cuh's ring walk
// (mma_walk) with trivial math, for the engine's row-major expert layout and for a tile-major repack.
//
// Why: phase timestamps showed the routed MXFP4 walks streaming at only ~2 TB/s of the H200's ~4.4 TB/s although the
// per-step math is small. Each warp step reads 16 separate 64-byte row pieces (rows 1-2 KB apart) plus 16 separate
// 4-byte E8M0 scale words through cp.async into its shared-memory ring (8 slots of 1,088 B, 7 steps in flight). If the
// pattern is the limit, repacking the experts tile-major (each step's 1,088 bytes contiguous) is worth doing. Here the
// same persistent walk (132 blocks x 16 warps, units block-minor, the ring running continuously across units, K split
// in `parts` warps for TP2 gate/up) only XOR-folds the slot, so the time is the memory system's.
// DRAM-cold runs: run n reads expert set n % 8 (8 byte-identical copies of the 6 experts at different addresses, both
// layouts) and a 256 MB streaming read precedes it (outside the cudaEvents). The flush alone is NOT enough on the
// H200: with one set, the walks still "streamed" 26.7 MB at ~5.0 TB/s (above the 4.8 TB/s peak) after a 256 MB or even
// a 1 GB read -- the L2 keeps lines that were re-referenced (run after run) through a one-touch scan.
//   A rowmajor          the engine: per step lane (g, t4) copies 16 B chunk t4 of tile rows g and g + 8 (cp.async.cg),
//                       lanes < 16 the 4 scale bytes of row `lane` (cp.async.ca 4 B); slot = 16 x 64 B swizzled
//                       (MmaCfg<4>::piece) + 16 x 4 B scales
//   B rowmajor_noscale  A without the scale copies: are the 4-byte scale reads the cost?
//   C rowmajor_wide     the same 1,088 B per step as 8 rows x 128 B (full lines) + 8 rows x 8 scale bytes (cp.async
//                       8 B): half as many rows touched per step; tiles of 8 rows, twice as many with half the steps
//   D tiles_cpasync     tile-major buffers (block (tile, step) = the 1,088 B slot image at (tile * steps + step) * 1088,
//                       repacked on the device from A's buffers): lane l copies pieces l, l + 32, lanes < 4 piece 64 + l
//   E tiles_bulk        the same buffers, ONE cp.async.bulk (TMA bulk copy, 1,088 B) per step by lane 0, completion on
//                       a per-slot mbarrier (complete_tx), consumers wait with try_wait.parity
//   F stream            ld.global.nc.L1::no_allocate.v4 grid-stride read of the tile-major bytes: the bound
// Checks: the slot images of A, D and E are identical step by step, so a position-aware fold (word rotated by its
// slot position, step and unit, XORed; reduced with atomicXor: order-independent) must agree for A/D/E -- this tests
// the repack too; the plain XOR of every word read must agree for A/C/D/E/F (all bytes, each read once). B reads no
// scales and is not checked. Timing: cudaEvent around the walk (includes the launch's fixed cost, ~4 us here, which
// matters for these 3-20 us walks) and the in-kernel span (%globaltimer: first block start .. last block end).
// Build/run on the GPU machine: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a expert_layout_probe.cu -o p && ./p
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    const cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

constexpr int kE = 6, kWarps = 16, kThreads = 32 * kWarps, kS = 8, kStepW = 1024, kStep = kStepW + 64;
constexpr int kSmem = kWarps * kS * kStep;  // 139,264 B
constexpr int kRuns = 31;
enum { kRow = 0, kRowNoScale = 1, kRowWide = 2, kTileCp = 3, kTileBulk = 4, kNumWalk = 5 };

struct Out {  // per run: in-kernel span and the two checksums
  unsigned long long t0, t1;
  unsigned plain, pos;
};
struct Args {
  const uint8_t* w[2][kE];  // row-major weights [rows][K/2]: w1 (or w2) and w3, per expert (separate cudaMallocs)
  const uint8_t* s[2][kE];  // row-major E8M0 scales [rows][K/32]
  uint8_t* tm[kE];          // tile-major: 16-row tiles, (tile * K/128 + step) * 1088
  long long rows, K;        // rows per matrix and expert; columns
  int gate_up, parts;
  Out* out;
};

__device__ __forceinline__ uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp16(void* d, const void* s) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(d)), "l"(s) : "memory");
}
__device__ __forceinline__ void cp8(void* d, const void* s) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(sa(d)), "l"(s) : "memory");
}
__device__ __forceinline__ void cp4(void* d, const void* s) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sa(d)), "l"(s) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* d, const void* s, int bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(sa(d)), "l"(s), "r"(bytes), "r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(sa(b)), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ uint4 ld_nc(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
// MmaCfg<4>::piece: (tile row r, 16-byte chunk c) of a step's weights in the slot.
__host__ __device__ __forceinline__ int piece(int r, int c) { return 64 * r + 16 * (c ^ ((r >> 1) & 3)); }
__device__ __forceinline__ uint32_t rot(uint32_t w, uint32_t r) { return __funnelshift_l(w, w, r); }
// Block-wide end of a walk: checksums into out (atomicXor: order-independent), span via %globaltimer.
__device__ __forceinline__ void finish(Out* out, uint32_t plain, uint32_t pos, unsigned long long t0) {
  plain = __reduce_xor_sync(0xffffffffu, plain), pos = __reduce_xor_sync(0xffffffffu, pos);
  if ((threadIdx.x & 31) == 0) atomicXor(&out->plain, plain), atomicXor(&out->pos, pos);
  __syncthreads();
  if (threadIdx.x == 0) atomicMin(&out->t0, t0), atomicMax(&out->t1, gtimer());
}

// The ring walk of expert_mma.cuh with the copy pattern of variant V and an XOR fold as the "math".
template <int V>
__global__ void __launch_bounds__(kThreads, 1) walk(const Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t bars[kWarps][kS];  // E: one mbarrier per slot
  const unsigned long long t0 = gtimer();
  constexpr bool kWide = V == kRowWide, kTiles = V == kTileCp || V == kTileBulk;
  constexpr int kRpt = kWide ? 8 : 16, kCols = kWide ? 256 : 128;  // rows per tile, columns per step
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const int64_t per_m = a.gate_up ? a.rows / (kRpt / 2) : a.rows / kRpt, nunits = kE * per_m;  // tiles per expert
  const int parts = a.parts, part = warp % parts;
  const int64_t gw = static_cast<int64_t>(warp / parts) * gridDim.x + blockIdx.x, nw = static_cast<int64_t>(kWarps / parts) * gridDim.x;
  const int ks = static_cast<int>(a.K / parts / kCols), kg0 = part * ks;  // steps per unit; this part's first step
  const int64_t steps = gw < nunits ? ((nunits - gw + nw - 1) / nw) * ks : 0;
  uint8_t* ring = smem + warp * (kS * kStep);
  uint64_t* bar = bars[warp];
  if constexpr (V == kTileBulk) {
    if (lane == 0) {
      for (int s = 0; s < kS; ++s) mbar_init(&bar[s], 1);  // one arrival (lane 0's expect_tx) + 1,088 tx bytes
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // inits visible to the async proxy
    }
    __syncwarp();  // ... and to the other lanes before their first try_wait
  }
  // Producer state: unit lt, its step lk, slot lslot; this lane's source pointers for the unit.
  int64_t lt = gw;
  int lk = 0, lslot = 0;
  const uint8_t *p0 = nullptr, *p1 = nullptr, *ps = nullptr;
  auto load_unit = [&] {
    const int j = static_cast<int>(lt / per_m);
    const int64_t rt = lt - j * per_m;
    auto row = [&](int r, bool scale) {  // tile row r: gate/up = the first half from w1, the second from w3
      const int h = kRpt / 2, m = a.gate_up && r >= h ? 1 : 0;
      const int64_t q = a.gate_up ? h * rt + (r % h) : kRpt * rt + r;
      return scale ? a.s[m][j] + q * (a.K / 32) : a.w[m][j] + q * (a.K / 2);
    };
    if constexpr (kTiles) {
      p0 = a.tm[j] + (rt * (a.K / 128) + kg0) * kStep;
    } else if constexpr (kWide) {
      p0 = row(g, false);
      if (lane < 8) ps = row(lane, true);
    } else {
      p0 = row(g, false), p1 = row(g + 8, false);
      if (lane < 16) ps = row(lane, true);
    }
  };
  if (steps > 0) load_unit();
  auto issue = [&] {
    uint8_t* slot = ring + lslot * kStep;
    const int kg = kg0 + lk;  // the step's index along the full K
    if constexpr (V == kRow || V == kRowNoScale) {
      cp16(slot + piece(g, t4), p0 + kg * 64 + t4 * 16);
      cp16(slot + piece(g + 8, t4), p1 + kg * 64 + t4 * 16);
      if (V == kRow && lane < 16) cp4(slot + kStepW + 4 * lane, ps + kg * 4);
    } else if constexpr (kWide) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = t4 + 4 * i;
        cp16(slot + 128 * g + 16 * (c ^ g), p0 + kg * 128 + c * 16);
      }
      if (lane < 8) cp8(slot + kStepW + 8 * lane, ps + kg * 8);
    } else if constexpr (V == kTileCp) {
      const uint8_t* src = p0 + static_cast<int64_t>(lk) * kStep;
      cp16(slot + 16 * lane, src + 16 * lane);
      cp16(slot + 16 * (lane + 32), src + 16 * (lane + 32));
      if (lane < 4) cp16(slot + 16 * (lane + 64), src + 16 * (lane + 64));
    } else {
      // Ordering relied on. RAW (copy -> reads): complete_tx on the slot's mbarrier + every lane's try_wait.parity
      // (acquire) make the async-proxy writes visible to that lane. WAR (the lanes' ld.shared of this slot one step
      // ago -> this async-proxy write into it): each lane's loaded words fed its XOR, so the loads had returned before
      // the lane reached the __syncwarp() preceding issue(); __syncwarp orders the lanes' accesses before lane 0's
      // later instructions, and lane 0's fence.proxy.async.shared::cta then orders generic-proxy shared accesses
      // before its async-proxy copy. Whether the proxy fence is formally cumulative over the other lanes' reads is
      // not spelled out in the PTX model; CUTLASS's TMA pipelines rely on an mbarrier arrive/wait alone for this WAR,
      // so the fence is the conservative choice (one instruction of lane 0 per 1,088 B). Phase reuse: the same
      // __syncwarp guarantees every lane has passed its try_wait on this slot's previous phase before lane 0
      // re-arms the barrier -- otherwise a lagging lane could see it two phases on (same parity) and spin forever.
      if (lane == 0) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        mbar_expect_tx(&bar[lslot], kStep);  // arrive (count 1) + expect 1,088 tx bytes, before the copy is issued
        bulk_copy(slot, p0 + static_cast<int64_t>(lk) * kStep, kStep, &bar[lslot]);
      }
    }
    lslot = lslot + 1 == kS ? 0 : lslot + 1;
    if (++lk == ks) {
      lk = 0;
      lt += nw;
      if (lt < nunits) load_unit();
    }
  };
  __syncwarp();
#pragma unroll
  for (int p = 0; p < kS - 1; ++p) {
    if (p < steps) issue();
    if constexpr (V != kTileBulk) cp_commit();
  }
  int64_t ct = gw;
  int ck = 0, cslot = 0;
  uint32_t phase = 0, plain = 0, pos = 0;
  for (int64_t st = 0; st < steps; ++st) {
    __syncwarp();  // every lane has read the slot the next copy overwrites (it was read one step ago)
    if (st + kS - 1 < steps) issue();
    if constexpr (V != kTileBulk) {
      cp_commit();
      cp_wait<kS - 1>();  // this lane's copies of step st have landed
      __syncwarp();       // ... and the other lanes'
    } else {
      mbar_wait(&bar[cslot], phase);  // acquire: the bulk copy's async-proxy writes are visible to this lane
    }
    const uint8_t* slot = ring + cslot * kStep;
    // The "math": lane reads 16-B words lane and lane + 32 of the weights and (lanes < 16) scale word lane, XORs them
    // plain and rotated by slot position + step + unit (the latter equal for A/D/E only: identical slot images).
    const uint32_t r0 = static_cast<uint32_t>((kg0 + ck) * 5 + ct * 11);
    const uint4 v0 = *reinterpret_cast<const uint4*>(slot + 16 * lane);
    const uint4 v1 = *reinterpret_cast<const uint4*>(slot + 16 * (lane + 32));
    const uint32_t pw0 = r0 + 4 * lane, pw1 = r0 + 4 * (lane + 32);
    plain ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w;
    pos ^= rot(v0.x, pw0) ^ rot(v0.y, pw0 + 1) ^ rot(v0.z, pw0 + 2) ^ rot(v0.w, pw0 + 3) ^ rot(v1.x, pw1) ^
           rot(v1.y, pw1 + 1) ^ rot(v1.z, pw1 + 2) ^ rot(v1.w, pw1 + 3);
    if (V != kRowNoScale && lane < 16) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(slot + kStepW + 4 * lane);
      plain ^= w, pos ^= rot(w, r0 + 256 + lane);
    }
    if (++cslot == kS) cslot = 0, phase ^= 1;  // every slot's barrier completes once per pass over the ring
    if (++ck == ks) ck = 0, ct += nw;
  }
  if constexpr (V != kTileBulk) cp_wait<0>();
  finish(a.out, plain, pos, t0);
}

// F (and the L2 eviction): grid-stride 16-byte non-allocating reads of N equal-sized buffers; per iteration a thread
// loads word i of every buffer at U consecutive grid strides: N x U loads in flight (F: 6 x 4, the eviction: 1 x 8).
// (A flat grid-stride loop per buffer would leave the 4-8 words per thread of one ~4 MB expert mostly to its
// one-load-in-flight remainder loop.)
struct Bufs {
  const uint4* p[kE];
  long long n;  // 16-byte words per buffer
  Out* out;
};
template <int N, int U>
__global__ void __launch_bounds__(kThreads, 1) stream(const Bufs b) {
  const unsigned long long t0 = gtimer();
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, nt = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t x = 0;
  auto fold = [&](const uint4& v) { x ^= v.x ^ v.y ^ v.z ^ v.w; };
  int64_t i = tid;
  for (; i + (U - 1) * nt < b.n; i += U * nt) {
    uint4 v[U][N];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < N; ++e) v[u][e] = ld_nc(b.p[e] + i + u * nt);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < N; ++e) fold(v[u][e]);
  }
  for (; i < b.n; i += nt) {
    uint4 v[N];
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = ld_nc(b.p[e] + i);
#pragma unroll
    for (int e = 0; e < N; ++e) fold(v[e]);
  }
  finish(b.out, x, 0, t0);
}

__global__ void fill(uint32_t* p, int64_t n, uint32_t seed) {  // random words (murmur3 finaliser of index + seed)
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA77u;
    h ^= h >> 16, h *= 0x85EBCA6Bu, h ^= h >> 13, h *= 0xC2B2AE35u, h ^= h >> 16;
    p[i] = h;
  }
}
// Expert j's tile-major buffer from its row-major ones, in the engine's order: block (tile t, step k) = the 16 tile
// rows' 64-byte pieces at piece(r, c), then the 16 rows' 4 scale bytes at 1024 + 4 r. Item: one 16-B piece (idx < 64)
// or 4 scale words (idx 64..67).
__global__ void repack(const Args a, int j) {
  const int64_t per_m = a.gate_up ? a.rows / 8 : a.rows / 16, kst = a.K / 128, n = per_m * kst * 68;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t blk = i / 68, rt = blk / kst, k = blk % kst;
    const int idx = static_cast<int>(i % 68);
    uint8_t* dst = a.tm[j] + blk * kStep;
    auto row = [&](int r, bool scale) {
      const int m = a.gate_up && r >= 8 ? 1 : 0;
      const int64_t q = a.gate_up ? 8 * rt + (r & 7) : 16 * rt + r;
      return scale ? a.s[m][j] + q * (a.K / 32) : a.w[m][j] + q * (a.K / 2);
    };
    if (idx < 64) {
      const int r = idx / 4, c = idx % 4;
      *reinterpret_cast<uint4*>(dst + piece(r, c)) = *reinterpret_cast<const uint4*>(row(r, false) + k * 64 + c * 16);
    } else {
      for (int r = 4 * (idx - 64); r < 4 * (idx - 63); ++r)
        *reinterpret_cast<uint32_t*>(dst + kStepW + 4 * r) = *reinterpret_cast<const uint32_t*>(row(r, true) + k * 4);
    }
  }
}

struct Shape {
  const char* name;
  int gate_up;
  long long rows, K;
  int parts;
};

int main() {
  int dev = 0, sms = 0, clk = 0, mclk = 0, bus = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  sms = prop.multiProcessorCount;
  // CUDA 13 dropped cudaDeviceProp::clockRate / memoryClockRate: the attributes still report them.
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
  CK(cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, dev));
  CK(cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  // Cold runs: rotation over `copies` expert sets + a streaming read of flush MB before each run. Knobs (sanity checks):
  // PROBE_L2_HOT=1 (one set, no flush: the L2-hot numbers), PROBE_COPIES=n, PROBE_FLUSH_MB=m.
  auto env = [](const char* k, int d) { const char* v = std::getenv(k); return v ? std::atoi(v) : d; };
  const bool hot = env("PROBE_L2_HOT", 0) == 1;
  const int copies = hot ? 1 : std::max(1, env("PROBE_COPIES", 8)), flush_mb = hot ? 0 : env("PROBE_FLUSH_MB", 256);
  const bool flush = flush_mb > 0;
  std::printf("# %s  %d SMs  SM clock %.0f MHz  mem clock %.0f MHz x %d bit (%.0f GB/s peak)  L2 %d MB  | median of %d "
              "runs, %d expert sets rotated, %d MB flush read between runs%s\n",
              prop.name, sms, clk / 1e3, mclk / 1e3, bus, 2.0 * mclk * 1e3 * bus / 8 / 1e9, l2 >> 20, kRuns,
              copies, flush_mb, hot ? " (L2-HOT)" : "");
  void (*walks[kNumWalk])(Args) = {walk<kRow>, walk<kRowNoScale>, walk<kRowWide>, walk<kTileCp>, walk<kTileBulk>};
  const char* names[kNumWalk + 1] = {"A rowmajor", "B rowmajor_noscale", "C rowmajor_wide", "D tiles_cpasync", "E tiles_bulk", "F stream"};
  for (auto k : walks) CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));

  Out* dout;  // [0]: the measured kernel, [1]: the L2 eviction's
  CK(cudaMalloc(&dout, 2 * sizeof(Out)));
  const int64_t flush_bytes = std::max<int64_t>(flush_mb, 1) << 20;
  uint8_t* flush_buf;
  CK(cudaMalloc(&flush_buf, flush_bytes));
  fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(flush_buf), flush_bytes / 4, 0xF1u);
  CK(cudaGetLastError());
  Bufs fb{};
  fb.p[0] = reinterpret_cast<const uint4*>(flush_buf), fb.n = flush_bytes / 16, fb.out = dout + 1;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  const Shape shapes[] = {{"gateup_tp1", 1, 2048, 4096, 1}, {"down_tp1", 0, 4096, 2048, 1},
                          {"gateup_tp2", 1, 1024, 4096, 2}, {"down_tp2", 0, 4096, 1024, 1}};
  std::printf("%-11s %-19s %7s %9s %8s %6s | %7s %9s %6s\n", "shape", "variant", "MB", "event_us", "GB/s", "%F",
              "span_us", "span_GB/s", "%F");
  for (const Shape& sh : shapes) {
    const int nmat = sh.gate_up ? 2 : 1;
    const int64_t wbytes = sh.rows * sh.K / 2, sbytes = sh.rows * sh.K / 32, tbytes = nmat * (wbytes + sbytes);
    // `copies` identical expert sets (same bytes, so the checksums stay comparable; different addresses, so no L2
    // sharing), each with its row-major and tile-major buffers; run n uses set n % copies.
    std::vector<Args> sets(copies);
    std::vector<Bufs> sbs(copies);
    std::vector<void*> allocs;
    auto alloc_fill = [&](int64_t bytes, uint32_t seed) {
      void* p;
      CK(cudaMalloc(&p, bytes));
      allocs.push_back(p);
      fill<<<1024, 256>>>(static_cast<uint32_t*>(p), bytes / 4, 0x9E3779B9u * seed);
      CK(cudaGetLastError());
      return static_cast<uint8_t*>(p);
    };
    for (int c = 0; c < copies; ++c) {
      Args& a = sets[c];
      a.rows = sh.rows, a.K = sh.K, a.gate_up = sh.gate_up, a.parts = sh.parts, a.out = dout;
      for (int j = 0; j < kE; ++j)  // per expert, like the engine: w1 (w2), s1, w3, s3
        for (int m = 0; m < nmat; ++m)
          a.w[m][j] = alloc_fill(wbytes, 4 * j + 2 * m + 1), a.s[m][j] = alloc_fill(sbytes, 4 * j + 2 * m + 2);
      for (int j = 0; j < kE; ++j) {
        CK(cudaMalloc(&a.tm[j], tbytes));
        allocs.push_back(a.tm[j]);
        repack<<<2 * sms, 512>>>(a, j);
        CK(cudaGetLastError());
        sbs[c].p[j] = reinterpret_cast<const uint4*>(a.tm[j]);
      }
      sbs[c].n = tbytes / 16, sbs[c].out = dout;
    }
    CK(cudaDeviceSynchronize());

    double ev_us[kNumWalk + 1], sp_us[kNumWalk + 1];
    Out res[kNumWalk + 1];
    bool stable = true;
    int run = 0;
    for (int v = 0; v <= kNumWalk; ++v) {
      auto launch = [&](int c) {
        if (v < kNumWalk) walks[v]<<<sms, kThreads, kSmem>>>(sets[c]);
        else stream<kE, 4><<<sms, kThreads>>>(sbs[c]);
      };
      std::vector<double> ev, sp;
      for (int r = -1; r < kRuns; ++r) {  // run -1: warm-up (instruction cache, TLB), not counted
        const Out init{~0ull, 0ull, 0u, 0u};
        CK(cudaMemcpy(dout, &init, sizeof(Out), cudaMemcpyHostToDevice));
        if (flush) stream<1, 8><<<sms, kThreads>>>(fb);  // the streaming read between runs (besides the rotation)
        CK(cudaGetLastError());
        CK(cudaEventRecord(e0));
        launch(run++ % copies);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        Out o;
        CK(cudaMemcpy(&o, dout, sizeof(Out), cudaMemcpyDeviceToHost));
        if (r < 0) {
          res[v] = o;
          continue;
        }
        if (o.plain != res[v].plain || o.pos != res[v].pos) stable = false;
        ev.push_back(ms * 1e3), sp.push_back((o.t1 - o.t0) * 1e-3);
      }
      std::sort(ev.begin(), ev.end()), std::sort(sp.begin(), sp.end());
      ev_us[v] = ev[ev.size() / 2], sp_us[v] = sp[sp.size() / 2];
    }
    const double f_bytes = static_cast<double>(tbytes) * kE, f_ev = f_bytes / ev_us[kNumWalk], f_sp = f_bytes / sp_us[kNumWalk];
    for (int v = 0; v <= kNumWalk; ++v) {
      const double bytes = static_cast<double>(v == kRowNoScale ? nmat * wbytes : tbytes) * kE;
      const double ev = bytes / ev_us[v], sp = bytes / sp_us[v];  // bytes per us = MB/s
      std::printf("%-11s %-19s %7.2f %9.2f %8.0f %5.1f%% | %7.2f %9.0f %5.1f%%\n", sh.name, names[v], bytes / 1e6,
                  ev_us[v], ev * 1e-3, 100.0 * ev / f_ev, sp_us[v], sp * 1e-3, 100.0 * sp / f_sp);
    }
    const Out& A = res[kRow];
    const bool ok = stable && res[kRowWide].plain == A.plain && res[kTileCp].plain == A.plain &&
                    res[kTileBulk].plain == A.plain && res[kNumWalk].plain == A.plain &&
                    res[kTileCp].pos == A.pos && res[kTileBulk].pos == A.pos;
    if (ok) {
      std::printf("%-11s checksum ok (plain %08x, positional %08x; B not checked)\n", sh.name, A.plain, A.pos);
    } else {
      std::printf("%-11s MISMATCH%s plain A %08x C %08x D %08x E %08x F %08x | positional A %08x D %08x E %08x\n",
                  sh.name, stable ? "" : " (run-to-run unstable)", A.plain, res[kRowWide].plain, res[kTileCp].plain,
                  res[kTileBulk].plain, res[kNumWalk].plain, A.pos, res[kTileCp].pos, res[kTileBulk].pos);
    }
    for (void* p : allocs) CK(cudaFree(p));
  }
  CK(cudaFree(flush_buf));
  CK(cudaFree(dout));
  return 0;
}
