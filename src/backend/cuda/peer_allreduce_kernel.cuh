// The peer one-shot all-reduce's kernel and its launch (peer_allreduce.h; the areas are set up in peer_allreduce.cu).
// Included by kernels.cu inside namespace dsv4::cuda, at its end: it launches through launch() (programmatic dependent
// launch, launch tracing) and stamps the decode trace (pdl_wait), as every other decode kernel.
#pragma once

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// LL ("low latency") lines: every 16-byte line carries two floats, each next to the all-reduce's epoch ({v0, e, v1, e}),
// so a receiver knows a line has landed when both of its flags read e: no fence, no separate flag, no barrier.
// Why: the first version (one block: push, __threadfence_system, barrier, publish a flag, poll it, sum) measured
// 7.3 us for 16 KB and 13.1 us for 112 KB on the H200 pair: one SM's stores over NVLink and two NVLink round trips
// in series. Here many blocks each push and then sum their own lines; the only wait is for the peers' lines.
// Assumes, as NCCL's LL protocol does, that the 8-byte halves of a 16-byte volatile store are never torn.
__device__ __forceinline__ void st_line(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ uint4 ld_line(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}

// Grid-stride over the lines of one row (count / rows / 2; rows = 1 unless ep sums rows). Epoch: every block reads
// *p.epoch + 1 at its start; the last block to finish (done counter) stores it back, after every block has read the
// old value. The next all-reduce is stream-ordered after this grid. Slot [parity][rank] of each receiver: a sender
// reuses a parity two epochs later, by when every receiver has finished reading it (it started the epoch in between,
// stream-ordered after this one). Stale lines carry older epochs, never e. The sum is in rank order (this rank's own
// value from buf): the same bits on every rank. The epilogue (PeerEpilogue) runs on each thread's own columns.
// PDL (launch(), like every decode kernel): the wait comes first -- buf is the previous kernel's output, and the epoch
// the previous all-reduce stored is read after it too (with back-to-back all-reduces that one is the previous
// kernel). Then the next kernel may launch: its blocks run their weight prologue while this one waits on the peers,
// instead of the two launch gaps a plainly launched kernel put around every all-reduce (two per layer). This grid's
// blocks are all resident by then (dependents launch once every block has triggered), so they cannot be starved.
__global__ void __launch_bounds__(256) peer_all_reduce_kernel(PeerReduceRank p, float* buf, size_t count, PeerEpilogue ep) {
  pdl_wait();
  __shared__ uint32_t ep_now;
  if (threadIdx.x == 0) {
    // After 2^32 all-reduces (~4 days of TP2 decode) the counter wraps: epoch 0 is skipped, because never-written
    // (zeroed) lines carry it, and so is 1, so that parities still alternate (0xFFFFFFFF is odd, 2 even).
    const uint32_t e = *reinterpret_cast<volatile uint32_t*>(p.epoch) + 1;
    ep_now = e == 0 ? 2 : e;
  }
  __syncthreads();
  const uint32_t e = ep_now;
  const int rows = ep.kind == PeerEpilogue::SumRows ? ep.rows : 1;
  const size_t par = e & 1u, lines = count / 2, row_lines = lines / rows, cap_lines = p.cap / 2;
  const float2* src = reinterpret_cast<const float2*>(buf);
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x, stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  // Each thread pushes exactly the lines it reduces below (columns j of every row), so a block waits only on the
  // peer's block of the same index: no dependence on the whole grid being resident at once.
  for (size_t j = first; j < row_lines; j += stride)
    for (int r = 0; r < rows; ++r) {
      const size_t i = static_cast<size_t>(r) * row_lines + j;
      const float2 v = src[i];
      const uint4 line = make_uint4(__float_as_uint(v.x), e, __float_as_uint(v.y), e);
      for (int q = 0; q < p.n; ++q)
        if (q != p.rank) st_line(reinterpret_cast<uint4*>(p.recv[q]) + (par * p.n + p.rank) * cap_lines + i, line);
    }
  const uint4* mine = reinterpret_cast<const uint4*>(p.recv[p.rank]) + par * p.n * cap_lines;
  const uint64_t t0 = global_ns();
  auto reduced = [&](size_t i) {  // line i summed over the ranks in rank order
    const float2 own = src[i];
    float2 s = make_float2(0.0f, 0.0f);
    for (int q = 0; q < p.n; ++q) {
      float2 v = own;
      if (q != p.rank) {
        uint4 l = ld_line(mine + q * cap_lines + i);
        for (int spin = 0; l.y != e || l.w != e; ++spin) {
          if ((spin & 1023) == 1023 && global_ns() - t0 > 20ull * 1000 * 1000 * 1000) __trap();  // a peer never came
          l = ld_line(mine + q * cap_lines + i);
        }
        v = make_float2(__uint_as_float(l.x), __uint_as_float(l.z));
      }
      s.x += v.x, s.y += v.y;
    }
    return s;
  };
  for (size_t j = first; j < row_lines; j += stride) {
    if (ep.kind == PeerEpilogue::SumRows) {
      double a0 = 0.0, a1 = 0.0;  // moe_reduce: the rows in order, in double, after [official] BF16 rounding of each
      for (int r = 0; r < rows; ++r) {
        float2 s = reduced(static_cast<size_t>(r) * row_lines + j);
        if (ep.official) s = make_float2(dev::bf16r(s.x), dev::bf16r(s.y));
        a0 += s.x, a1 += s.y;
      }
      const float o0 = static_cast<float>(a0), o1 = static_cast<float>(a1);
      reinterpret_cast<float2*>(ep.out)[j] = ep.official ? make_float2(dev::bf16r(o0), dev::bf16r(o1)) : make_float2(o0, o1);
    } else {
      float2 s = reduced(j);
      if (ep.kind == PeerEpilogue::Round) s = make_float2(dev::bf16r(s.x), dev::bf16r(s.y));
      reinterpret_cast<float2*>(buf)[j] = s;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.done, 1u) == gridDim.x - 1) {
      *p.epoch = e;
      *p.done = 0;
    }
  }
}

}  // namespace

void peer_all_reduce(const PeerReduceRank& p, float* buf, size_t count, cudaStream_t s, const PeerEpilogue& ep) {
  if (count == 0) return;
  if (count > p.cap || count % 4 != 0 || (reinterpret_cast<uintptr_t>(buf) & 15u) != 0)
    fail("peer all-reduce: ", count, " floats do not fit (capacity ", p.cap, ", multiple of 4, 16-byte aligned)");
  if (ep.kind == PeerEpilogue::SumRows &&
      (ep.rows < 1 || count % (2 * static_cast<size_t>(ep.rows)) != 0 || !ep.out || (reinterpret_cast<uintptr_t>(ep.out) & 7u) != 0))
    fail("peer all-reduce: the row sum needs rows >= 1 dividing ", count, " into even rows and an 8-byte aligned output");
  // One 16-byte line per thread and peer (and row, for SumRows) where the grid allows (16 KB: 8 blocks; the MoE's
  // 112 KB as 7 rows: 8 blocks).
  const size_t lines = count / 2 / (ep.kind == PeerEpilogue::SumRows ? static_cast<size_t>(ep.rows) : 1);  // per thread space
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((lines + 255) / 256, 256));
  static const bool pdl = switch_on("DSV4_AR_PDL");  // 0: launched plainly, as before (A/B; not traced then)
  if (pdl) {
    launch(peer_all_reduce_kernel, dim3(blocks), dim3(256), 0, s, p, buf, count, ep);
  } else {
    peer_all_reduce_kernel<<<blocks, 256, 0, s>>>(p, buf, count, ep);
    DSV4_LAUNCHED();
  }
}

