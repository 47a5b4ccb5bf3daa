// dsv4 bench-ops: micro-benchmarks of the CUDA kernels at V4-Flash shapes (batch-1 decode sizes), each against its
// bandwidth bound (bytes moved / streaming-read bandwidth measured in the same run). Weights are synthetic device
// buffers in the stored formats; several copies are rotated so that no matrix is served from the 50 MB L2.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"

#if defined(DSV4_HAVE_CUDA)
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/ops.h"

namespace {

namespace cu = dsv4::cuda;

struct Dev {
  std::vector<void*> ptrs;
  ~Dev() {
    for (void* p : ptrs) cudaFree(p);
  }
  void* alloc(size_t bytes, int byte) {
    void* p = nullptr;
    DSV4_CU(cudaMalloc(&p, bytes));
    DSV4_CU(cudaMemset(p, byte, bytes));
    ptrs.push_back(p);
    return p;
  }
  float* f32(size_t n, float v) {
    float* p = static_cast<float*>(alloc(n * 4, 0));
    cu::fill_f32(p, static_cast<int64_t>(n), v, nullptr);
    return p;
  }
};

// Median time (us) of `reps` launches of fn(i) (i = rotation index), after warm-up; before(i), if given, runs untimed
// ahead of each.
double time_us(const std::function<void(int)>& fn, int reps = 30, const std::function<void(int)>& before = nullptr) {
  cudaEvent_t a, b;
  DSV4_CU(cudaEventCreate(&a));
  DSV4_CU(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) {
    if (before) before(i);
    fn(i);
  }
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    if (before) before(i);
    DSV4_CU(cudaEventRecord(a));
    fn(i);
    DSV4_CU(cudaEventRecord(b));
    DSV4_CU(cudaEventSynchronize(b));
    float ms = 0;
    DSV4_CU(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int copies_for(double bytes) { return std::max(1, static_cast<int>(256e6 / std::max(bytes, 1.0)) + 1); }

struct Row {
  std::string op, shape;
  double bytes, us;
};

int cmd_bench_ops(const std::vector<std::string>& args) {
  CLI::App app{"Micro-benchmark the CUDA kernels at V4-Flash shapes against the measured HBM bandwidth", "dsv4 bench-ops"};
  int reps = 30;
  app.add_option("--reps", reps, "timed launches per kernel (median reported)")->check(CLI::Range(3, 1000));
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  cudaDeviceProp prop{};
  DSV4_CU(cudaGetDeviceProperties(&prop, 0));
  Dev dev;
  // Bandwidth: a streaming read of 1 GiB (our own kernel) and a 1 GiB device-to-device memcpy (read + write).
  const size_t GiB = size_t(1) << 30;
  void* big = dev.alloc(GiB, 0);
  void* big2 = dev.alloc(GiB, 0);
  float* sink = dev.f32(1, 0.0f);
  const double read_us = time_us([&](int) { cu::stream_read(big, GiB, sink, nullptr); }, 10);
  const double copy_us = time_us([&](int) { DSV4_CU(cudaMemcpyAsync(big2, big, GiB, cudaMemcpyDeviceToDevice)); }, 10);
  const double bw_read = GiB / (read_us * 1e-6), bw_copy = 2.0 * GiB / (copy_us * 1e-6);
  const double bw = std::max(bw_read, bw_copy);
  std::vector<Row> rows;

  // FP8 block-scaled linear (E4M3 + 128x128 fp32-widened scales).
  auto fp8 = [&](const char* name, int64_t out, int64_t in, int n, bool qa8) {
    const double wbytes = double(out) * in + double((out + 127) / 128) * ((in + 127) / 128) * 4;
    const int nc = copies_for(wbytes);
    std::vector<cu::DevLinear> W(nc);
    for (auto& w : W) {
      w.fmt = dsv4::WeightFormat::FP8_E8M0, w.out = out, w.in = in, w.sb_cols = (in + 127) / 128;
      w.w = dev.alloc(size_t(out) * in, 0x30);
      w.scale = dev.f32(size_t((out + 127) / 128) * w.sb_cols, 1.0f);
    }
    float* x = dev.f32(size_t(n) * in, 0.5f);
    float* xq = dev.f32(size_t(n) * in, 0.0f);
    float* y = dev.f32(size_t(n) * out, 0.0f);
    const double us = time_us([&](int i) {
      const float* xin = x;
      if (qa8) cu::qa8_rows(x, n, in, xq, nullptr), xin = xq;
      cu::LinearArgs a;
      a.x = xin, a.ldx = in, a.n = n, a.y = y, a.ldy = out, a.round_bf16 = qa8;
      cu::linear(W[i % nc], a, nullptr);
    }, reps);
    rows.push_back({std::string(name) + (qa8 ? " (QA8+bf16)" : ""), std::to_string(out) + "x" + std::to_string(in) + " n=" + std::to_string(n),
                    wbytes + 4.0 * n * (in + out), us});
  };
  fp8("fp8 gemv wq_a", 1024, 4096, 1, false);
  fp8("fp8 gemv wq_a", 1024, 4096, 1, true);
  fp8("fp8 gemv wq_b", 32768, 1024, 1, false);
  fp8("fp8 gemv wo_b", 4096, 8192, 1, false);
  fp8("fp8 gemv shared w1", 2048, 4096, 1, false);
  fp8("fp8 gemm wq_b", 32768, 1024, 4, false);
  fp8("fp8 gemm wq_b", 32768, 1024, 64, false);

  // What an L2-resident weight is worth to a decode GEMV: the official tensor-core GEMV timed alone after a 30 us
  // device wait, preceded by (cold) the GEMV of another copy, or (warm) its own copy's GEMV, which leaves the 33.6 MB
  // in the L2 (60 MB). Measured (session 20, one H200): 18.5 vs 14.7 us (wq_b), 17.0 vs 14.0 (wo_b), host-timed with
  // the launch: the bound a perfect L2 prefetch of the next kernel's weights could reach (the hints tried for it,
  // docs/BENCHMARKS.md, session 20, recovered < 1 us of it and cost more at their issuing kernels).
  auto l2_rows = [&](const char* name, int64_t out, int64_t in) {
    const double wbytes = double(out) * in + double((out + 127) / 128) * ((in + 127) / 128) * 4;
    const int nc = std::max(copies_for(wbytes), 3);
    std::vector<cu::DevLinear> W(nc);
    for (auto& w : W) {
      w.fmt = dsv4::WeightFormat::FP8_E8M0, w.out = out, w.in = in, w.sb_cols = (in + 127) / 128;
      w.w = dev.alloc(size_t(out) * in, 0x30);
      w.scale = dev.f32(size_t((out + 127) / 128) * w.sb_cols, 1.0f);
    }
    float* x = dev.f32(size_t(in), 0.5f);
    float* y = dev.f32(size_t(out), 0.0f);
    auto run = [&](const cu::DevLinear& w) {
      cu::LinearArgs a;
      a.x = x, a.ldx = in, a.n = 1, a.y = y, a.ldy = out, a.round_bf16 = true, a.qa8_x = true;
      cu::linear(w, a, nullptr);
    };
    // Copy i + 1 timed; before it, copy i's GEMV (cold) or its own (warm), then the wait.
    auto timed = [&](bool warm) {
      return time_us([&](int i) { run(W[(i + 1) % nc]); }, reps, [&](int i) {
        run(W[(warm ? i + 1 : i) % nc]);
        cu::device_sleep(30000, nullptr);
      });
    };
    const std::string shape = std::to_string(out) + "x" + std::to_string(in) + " n=1";
    rows.push_back({std::string(name) + " (L2 cold)", shape, wbytes, timed(false)});
    rows.push_back({std::string(name) + " (L2 warm)", shape, wbytes, timed(true)});
  };
  l2_rows("tc gemv wq_b", 32768, 1024);
  l2_rows("tc gemv wo_b", 4096, 8192);

  // BF16 LM head.
  {
    const int64_t V = 129280, d = 4096;
    cu::DevLinear W;
    W.fmt = dsv4::WeightFormat::BF16, W.out = V, W.in = d, W.w = dev.alloc(size_t(V) * d * 2, 0x3c);
    float* x = dev.f32(d, 0.5f);
    float* y = dev.f32(V, 0.0f);
    const double us = time_us([&](int) {
      cu::LinearArgs a;
      a.x = x, a.ldx = d, a.n = 1, a.y = y, a.ldy = V;
      cu::linear(W, a, nullptr);
    }, reps);
    rows.push_back({"bf16 head gemv", "129280x4096 n=1", double(V) * d * 2 + 4.0 * V, us});
  }

  // MXFP4 routed experts: 6 of 256 selected, gate/up (SwiGLU fused) + down.
  {
    const int E = 256, k = 6;
    const int64_t d = 4096, I = 2048;
    std::vector<cu::DevExpert> table(E);
    for (int e = 0; e < E; ++e) {
      auto& t = table[e];
      t.w1 = dev.alloc(size_t(I) * d / 2, 0x22), t.w3 = dev.alloc(size_t(I) * d / 2, 0x22), t.w2 = dev.alloc(size_t(d) * I / 2, 0x22);
      // E8M0 block scales as stored (127 = 1.0).
      t.s1 = dev.alloc(size_t(I) * d / 32, 127), t.s3 = dev.alloc(size_t(I) * d / 32, 127), t.s2 = dev.alloc(size_t(d) * I / 32, 127);
    }
    auto* dtable = static_cast<cu::DevExpert*>(dev.alloc(sizeof(cu::DevExpert) * E, 0));
    DSV4_CU(cudaMemcpy(dtable, table.data(), sizeof(cu::DevExpert) * E, cudaMemcpyHostToDevice));
    auto* sel = static_cast<int32_t*>(dev.alloc(4 * k * 64, 0));
    float* wts = dev.f32(k, 0.1f);
    float* x = dev.f32(d, 0.5f);
    float* act = dev.f32(size_t(k) * I, 0.0f);
    float* y = dev.f32(size_t(k) * d, 0.0f);
    float* out = dev.f32(d, 0.0f);
    // 40 different expert sets (rotated) so that consecutive steps do not hit L2.
    std::vector<int32_t> hsel(size_t(k) * 40);
    for (size_t i = 0; i < hsel.size(); ++i) hsel[i] = static_cast<int32_t>((i * 37) % E);
    auto* sels = static_cast<int32_t*>(dev.alloc(hsel.size() * 4, 0));
    DSV4_CU(cudaMemcpy(sels, hsel.data(), hsel.size() * 4, cudaMemcpyHostToDevice));
    (void)sel;
    cu::ExpertArgs a;
    a.table = dtable, a.fmt = dsv4::WeightFormat::MXFP4, a.d = d, a.I = I, a.sb1 = d / 32, a.sb2 = I / 32;
    a.x = x, a.n = 1, a.k = k, a.wts = wts, a.limit = 10.0f, a.act = act, a.act_q = act, a.y = y;
    const double gate_bytes = k * (2.0 * I * d / 2 + 2.0 * I * d / 32);
    const double down_bytes = k * (double(d) * I / 2 + double(d) * I / 32);
    const double us_gu = time_us([&](int i) { a.sel = sels + (i % 40) * k; cu::expert_gate_up(a, nullptr); }, reps);
    const double us_dn = time_us([&](int i) { a.sel = sels + (i % 40) * k; cu::expert_down(a, nullptr); }, reps);
    const double us_rd = time_us([&](int) { cu::moe_reduce(y, nullptr, 1, k, d, true, out, nullptr); }, reps);
    rows.push_back({"mxfp4 experts gate+up+swiglu", "6x(2x2048x4096)", gate_bytes, us_gu});
    rows.push_back({"mxfp4 experts down", "6x(4096x2048)", down_bytes, us_dn});
    rows.push_back({"moe reduce", "6x4096", 4.0 * (k + 1) * d, us_rd});
  }

  // Sparse attention: 64 heads x 512, 128-window + 512 top-k, one query.
  {
    const int H = 64, W = 128, K = 512, ratio = 4;
    const int64_t D = 512, pos0 = 8191, ncomp = 2048;
    float* q = dev.f32(size_t(H) * D, 0.01f);
    float* kv = dev.f32(D, 0.01f);
    float* ring = dev.f32(size_t(W) * D, 0.01f);
    float* comp = dev.f32(size_t(ncomp) * D, 0.01f);
    float* sinkw = dev.f32(H, 0.0f);
    std::vector<int32_t> ht(K);
    for (int j = 0; j < K; ++j) ht[j] = (j * 3) % 2048;
    auto* topk = static_cast<int32_t*>(dev.alloc(4 * K, 0));
    DSV4_CU(cudaMemcpy(topk, ht.data(), 4 * K, cudaMemcpyHostToDevice));
    int* err = static_cast<int*>(dev.alloc(4, 0));
    cu::AttendArgs a;
    a.q = q, a.kv = kv, a.ring = ring, a.comp = comp, a.topk = topk, a.sink = sinkw, a.n = 1, a.H = H, a.window = W;
    a.topk_k = K, a.ratio = ratio, a.kind = 1, a.D = D, a.pos0 = pos0, a.n_comp = ncomp, a.official = true;
    a.max_rows = cu::attend_max_rows(W, 1, K, pos0 + 1, ratio);
    a.scratch = dev.f32(size_t(cu::attend_scratch_floats(1, H, D, a.max_rows)), 0.0f), a.o = dev.f32(size_t(H) * D, 0.0f), a.err = err;
    const double us = time_us([&](int) { cu::attend(a, nullptr); }, reps);
    rows.push_back({"attention split-KV (fp32 KV)", "64h x 512, 128 win + 512 topk", 4.0 * (W + K) * D + 8.0 * H * D, us});
  }

  // Indexer: 64 heads x 128 over 4096 keys (fp32 keys), top-512.
  {
    const int Hi = 64, K = 512, ratio = 4;
    const int64_t Di = 128, nkeys = 4096, pos0 = nkeys * ratio - 1;
    float* q = dev.f32(size_t(Hi) * Di, 0.01f);
    float* w = dev.f32(Hi, 1.0f);
    float* keys = dev.f32(size_t(nkeys) * Di, 0.01f);
    float* sc = dev.f32(size_t(nkeys), 0.0f);
    auto* topk = static_cast<int32_t*>(dev.alloc(4 * K, 0));
    const double us_s = time_us([&](int) { cu::indexer_scores(q, w, keys, 1, Hi, Di, pos0, ratio, nkeys, true, sc, nkeys, nullptr); }, reps);
    // Top-k on distinct pseudo-random scores (the constant inputs above would make every score tie).
    std::vector<float> hs(static_cast<size_t>(nkeys));
    uint32_t st = 12345u;
    for (auto& v : hs) st = st * 1664525u + 1013904223u, v = static_cast<float>(st >> 8) * 1e-6f;
    DSV4_CU(cudaMemcpy(sc, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    const double us_k = time_us([&](int) { cu::topk_rows(sc, 1, nkeys, pos0, ratio, K, topk, nullptr); }, reps);
    rows.push_back({"indexer scores (fp32 keys)", "64x128 over 4096 keys", 4.0 * nkeys * Di, us_s});
    rows.push_back({"indexer top-512 (radix select)", "4096 scores", 4.0 * nkeys, us_k});
  }

  // mHC pre (mix GEMV + Sinkhorn + collapse + RMSNorm), post, and the two fused, hc=4, d=4096, one token.
  {
    const int hc = 4;
    const int64_t d = 4096;
    float* X = dev.f32(size_t(hc) * d, 0.1f);
    float* fn = dev.f32(size_t(24) * hc * d, 0.001f);
    float* base = dev.f32(24, 0.0f);
    float* scale = dev.f32(3, 1.0f);
    float* nw = dev.f32(d, 1.0f);
    float* x = dev.f32(d, 0.0f);
    float* post = dev.f32(hc, 0.0f);
    float* comb = dev.f32(hc * hc, 0.0f);
    cu::HcPreArgs a;
    a.X = X, a.n = 1, a.hc = hc, a.d = d, a.fn = fn, a.base = base, a.scale = scale, a.norm_w = nw, a.official = true;
    a.x = x, a.post = post, a.comb = comb, a.partial = dev.f32(size_t(cu::hc_pre_scratch_floats(1, hc, d)), 0.0f);
    const double us_pre = time_us([&](int) { cu::hc_pre(a, nullptr); }, reps);
    const double us_post = time_us([&](int) { cu::hc_post(x, post, comb, 1, hc, d, true, X, nullptr); }, reps);
    rows.push_back({"mhc pre (mix+sinkhorn+norm)", "hc=4 d=4096", 4.0 * (24 * hc * d + hc * d + d), us_pre});
    rows.push_back({"mhc post", "hc=4 d=4096", 4.0 * (2 * hc * d + d), us_post});
    // y = x: any [d] activation will do for timing.
    const double us_post_pre = time_us([&](int) { cu::hc_post_pre(x, post, comb, X, a, nullptr); }, reps);
    rows.push_back({"mhc post + pre (fused)", "hc=4 d=4096", 4.0 * (24 * hc * d + 3 * hc * d + 2 * d), us_post_pre});
  }

  std::printf("## CUDA ops micro-benchmarks (%s, %d SMs)\n\n", prop.name, prop.multiProcessorCount);
  std::printf("HBM: streaming read %.0f GB/s (1 GiB), D2D memcpy %.0f GB/s (1 GiB read+write); bound uses %.0f GB/s\n\n",
              bw_read / 1e9, bw_copy / 1e9, bw / 1e9);
  std::printf("| op | shape | bytes | median us | GB/s | bound us | bound/measured |\n|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double bound = r.bytes / bw * 1e6;
    std::printf("| %s | %s | %.2f MB | %.2f | %.0f | %.2f | %.0f%% |\n", r.op.c_str(), r.shape.c_str(), r.bytes / 1e6, r.us,
                r.bytes / (r.us * 1e-6) / 1e9, bound, 100.0 * bound / r.us);
  }
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("bench-ops", "micro-benchmark the CUDA kernels at V4-Flash shapes vs the HBM bound", cmd_bench_ops);
#endif
