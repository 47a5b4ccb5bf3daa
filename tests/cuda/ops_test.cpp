// Per-kernel CUDA vs CPU at real V4-Flash shapes, on random inputs. The CPU side is the reference math of
// backend/cpu/cpu_backend.cpp (dequantize_rows, cpu::matmul_nt/dot/rms_norm, num:: quantization simulation), written
// out per op because the CPU backend only exposes whole-layer ops on a loaded checkpoint.
// Tolerances (why): reference numerics = fp32 with a different summation order: rel L2 <= 1e-5 (dot products of
// 1024-4096 terms with |x| ~ 1). Official numerics add BF16/FP8 roundings after those sums: a last-bit difference can
// move one element by a whole BF16 step (2^-8 relative), so rel L2 <= 3e-3 and at most 1% of elements off by > 1%.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_math.h"
#include "backend/cuda/expert_tiles.h"
#include "backend/cuda/ops.h"
#include "checkpoint/linear.h"
#include "numeric/codecs.h"
#include "numeric/quant_sim.h"

namespace dsv4::test {
namespace {

using std::vector;
namespace cu = dsv4::cuda;

template <typename T>
struct DBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DBuf(size_t count) : n(count) {
    DSV4_CU(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    DSV4_CU(cudaMemset(p, 0, std::max<size_t>(count, 1) * sizeof(T)));
  }
  explicit DBuf(const vector<T>& h) : DBuf(h.size()) { DSV4_CU(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  ~DBuf() { cudaFree(p); }
  vector<T> get() const {
    DSV4_CU(cudaDeviceSynchronize());
    vector<T> h(n);
    DSV4_CU(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

vector<float> randn(size_t n, std::mt19937& g, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct Stats {
  double rel = 0;
  double frac_off = 0;  // elements with |diff| > 1% of max(|ref|, 1e-3 * max|ref|)
};
Stats cmp(const vector<float>& got, const vector<float>& ref) {
  double num = 0, den = 0, mx = 0;
  for (float r : ref) mx = std::max(mx, static_cast<double>(std::fabs(r)));
  size_t off = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    if (std::fabs(d) > 0.01 * std::max(static_cast<double>(std::fabs(ref[i])), 1e-3 * mx) || !std::isfinite(got[i])) ++off;
  }
  return Stats{std::sqrt(num / std::max(den, 1e-30)), static_cast<double>(off) / std::max<size_t>(ref.size(), 1)};
}
void expect_close(const vector<float>& got, const vector<float>& ref, bool official, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const Stats s = cmp(got, ref);
  std::printf("[op] %-34s %-9s rel L2 %.3g, off>1%% %.4f%%\n", what, official ? "official" : "reference", s.rel, 100 * s.frac_off);
  if (official) {
    EXPECT_LE(s.rel, 3e-3) << what;
    EXPECT_LE(s.frac_off, 0.01) << what;
  } else {
    EXPECT_LE(s.rel, 1e-5) << what;
  }
}

// A host-side synthetic checkpoint tensor, so that dequantize_rows (the CPU twin) reads the same bytes we upload.
struct HostTensor {
  ckpt::HeaderEntry e;
  vector<uint8_t> bytes;
  ckpt::TensorView v;
  std::string file = "synthetic";
  HostTensor(const std::string& name, ckpt::DType dt, vector<int64_t> shape, vector<uint8_t> b) : bytes(std::move(b)) {
    e.name = name;
    e.dtype = dt;
    e.shape = std::move(shape);
    e.begin = 0;
    e.end = bytes.size();
    v.entry = &e;
    v.data = bytes.data();
    v.file = &file;
  }
};

struct HostLinear {
  std::unique_ptr<HostTensor> w, s;
  LinearRef ref;
  vector<float> deq;  // [out, in] via dequantize_rows
};

uint8_t rand_e4m3(std::mt19937& g) {
  for (;;) {
    uint8_t b = static_cast<uint8_t>(g());
    if ((b & 0x7F) != 0x7F) return b;
  }
}

// FP8 E4M3 with 128x128 E8M0 scales, or MXFP4 with 1x32 E8M0 scales.
std::unique_ptr<HostLinear> make_linear(WeightFormat fmt, int64_t out, int64_t in, std::mt19937& g) {
  auto h = std::make_unique<HostLinear>();
  h->ref.name = "synthetic";
  h->ref.fmt = fmt;
  h->ref.out = out;
  h->ref.in = in;
  std::uniform_int_distribution<int> sc(118, 124);
  if (fmt == WeightFormat::FP8_E8M0 || fmt == WeightFormat::FP8_F32) {
    vector<uint8_t> w(static_cast<size_t>(out * in));
    for (auto& b : w) b = rand_e4m3(g);
    const int64_t ro = (out + 127) / 128, co = (in + 127) / 128;
    h->w = std::make_unique<HostTensor>("w", ckpt::DType::F8_E4M3, vector<int64_t>{out, in}, std::move(w));
    if (fmt == WeightFormat::FP8_E8M0) {
      vector<uint8_t> s(static_cast<size_t>(ro * co));
      for (auto& b : s) b = static_cast<uint8_t>(sc(g));
      h->s = std::make_unique<HostTensor>("w.scale", ckpt::DType::F8_E8M0, vector<int64_t>{ro, co}, std::move(s));
    } else {  // fp32 scales that are not powers of two (the FP8_F32 export)
      std::uniform_real_distribution<float> u(0.002f, 0.03f);
      vector<uint8_t> s(static_cast<size_t>(ro * co * 4));
      for (int64_t i = 0; i < ro * co; ++i) {
        const float v = u(g);
        std::memcpy(s.data() + 4 * i, &v, 4);
      }
      h->s = std::make_unique<HostTensor>("w.scale", ckpt::DType::F32, vector<int64_t>{ro, co}, std::move(s));
    }
  } else if (fmt == WeightFormat::BF16) {
    vector<uint8_t> w(static_cast<size_t>(out * in * 2));
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (int64_t i = 0; i < out * in; ++i) {
      const uint16_t b = num::encode_bf16(nd(g));
      std::memcpy(w.data() + 2 * i, &b, 2);
    }
    h->w = std::make_unique<HostTensor>("w", ckpt::DType::BF16, vector<int64_t>{out, in}, std::move(w));
  } else {
    vector<uint8_t> w(static_cast<size_t>(out * in / 2));
    for (auto& b : w) b = static_cast<uint8_t>(g());
    vector<uint8_t> s(static_cast<size_t>(out * in / 32));
    for (auto& b : s) b = static_cast<uint8_t>(sc(g) + 4);
    h->w = std::make_unique<HostTensor>("w", ckpt::DType::U8, vector<int64_t>{out, in / 2}, std::move(w));
    h->s = std::make_unique<HostTensor>("w.scale", ckpt::DType::F8_E8M0, vector<int64_t>{out, in / 32}, std::move(s));
  }
  h->ref.weight = &h->w->v;
  h->ref.scale = h->s ? &h->s->v : nullptr;
  h->deq.resize(static_cast<size_t>(out * in));
  dequantize_rows(h->ref, 0, out, h->deq.data());
  return h;
}

void qa8_host(float* x, int64_t n, int64_t len) {
  for (int64_t t = 0; t < n; ++t) {
    float* r = x + t * len;
    const int64_t full = len / 128 * 128;
    if (full) num::fp8_sim(r, full, 128);
    if (len > full) num::fp8_sim(r + full, len - full, static_cast<int>(len - full));
  }
}

// ---- FP8 block-scaled linear (decode GEMV and small prefill), both numerics --------------------------------------
void run_linear(int64_t out, int64_t in, int n, bool official, WeightFormat fmt = WeightFormat::FP8_E8M0) {
  std::mt19937 g(static_cast<unsigned>(out * 31 + in + n));
  auto L = make_linear(fmt, out, in, g);
  vector<float> x = randn(static_cast<size_t>(n * in), g);
  vector<float> xr = x;
  if (official) qa8_host(xr.data(), n, in);
  vector<float> ref(static_cast<size_t>(n * out));
  cpu::matmul_nt(xr.data(), n, in, L->deq.data(), out, ref.data());
  if (official) num::round_bf16(ref.data(), static_cast<int64_t>(ref.size()));
  cu::DevLinear W = cu::upload_linear(L->ref);
  DBuf<float> dx(x), dq(x.size()), dy(ref.size());
  const float* xin = dx.p;
  if (official) {
    cu::qa8_rows(dx.p, n, in, dq.p, nullptr);
    xin = dq.p;
  }
  cu::LinearArgs a;
  a.x = xin, a.ldx = in, a.n = n, a.y = dy.p, a.ldy = out, a.round_bf16 = official;
  a.x_bf16_exact = official;  // as the backend sets it: x is QA8 exactly when official and W is FP8/FP4
  cu::linear(W, a, nullptr);
  const bool gemm = cu::prefill_gemm_eligible(W, a);
  EXPECT_EQ(gemm, n >= cu::kGemmMinTokens) << "prefill-sized linears take the tensor-core GEMM";
  if (official && gemm) {
    // DSV4_GEMM_QA8: the GEMM quantizes the raw x while splitting it (qa8_split_bf16): bit-identical to qa8_rows + GEMM.
    const bool was = cu::prefill_gemm_qa8();
    cu::set_prefill_gemm_qa8(true);
    cu::LinearArgs f = a;
    DBuf<float> dyf(ref.size());
    f.x = dx.p, f.qa8_x = true, f.x_bf16_exact = false, f.y = dyf.p;
    EXPECT_TRUE(cu::prefill_gemm_runs(W, f, nullptr));
    cu::linear(W, f, nullptr);
    cu::set_prefill_gemm_qa8(was);
    EXPECT_EQ(0, std::memcmp(dyf.get().data(), dy.get().data(), ref.size() * 4)) << "GEMM with qa8_x vs qa8_rows + GEMM";
  }
  expect_close(dy.get(), ref, official, (std::string(weight_format_name(fmt)) + " linear " + std::to_string(out) + "x" + std::to_string(in) + " n=" + std::to_string(n) + (gemm ? " (GEMM)" : "")).c_str());
  if (n == 1 && cu::gemv_ring_eligible(W, a)) {
    // LinearArgs::beside (a side branch's GEMV): the 256-thread kernel without a K split instead of the ring kernel,
    // which must give the ring's bits.
    cu::LinearArgs b = a;
    b.beside = true;
    EXPECT_FALSE(cu::gemv_ring_eligible(W, b));
    DBuf<float> db(ref.size());
    b.y = db.p;
    cu::linear(W, b, nullptr);
    EXPECT_EQ(0, std::memcmp(db.get().data(), dy.get().data(), ref.size() * 4)) << "beside vs the ring kernel, " << out << "x" << in;
  }
  if (gemm) {
    // Before the BF16 output rounding, the GEMM and the GEMV compute the same fp32 function and differ only by
    // summation order (and the tensor cores' fp32 accumulation, which is not round-to-nearest): measured on the H200
    // 1.1e-6 to 9.2e-6 rel L2, growing with K (K = 8192 the largest). The FP8 tensor cores' 9.2e-4 (see
    // prefill_gemm.cu) would fail this by 45x; a lost BF16 term (2^-9 per element) by 100x.
    DBuf<float> dg(ref.size()), dm(ref.size());
    cu::LinearArgs b = a;
    b.round_bf16 = false, b.y = dg.p;
    cu::gemv(W, b, nullptr);
    b.y = dm.p;
    cu::linear(W, b, nullptr);
    const Stats st = cmp(dm.get(), dg.get());
    std::printf("[op] GEMM vs GEMV %s %lldx%lld n=%d (unrounded): rel L2 %.3g\n", official ? "official " : "reference",
                (long long)out, (long long)in, n, st.rel);
    EXPECT_LE(st.rel, 2e-5) << "GEMM vs GEMV";
    // The tuned algorithm choice (DSV4_GEMM_TUNE): another cuBLASLt kernel for the same GEMM, the same bound.
    const bool tune_was = cu::prefill_gemm_tune();
    cu::set_prefill_gemm_tune(true);
    DBuf<float> dt(ref.size());
    b.y = dt.p;
    cu::linear(W, b, nullptr);
    cu::set_prefill_gemm_tune(tune_was);
    const Stats stt = cmp(dt.get(), dg.get());
    std::printf("[op] GEMM (tuned algorithm) vs GEMV %lldx%lld n=%d: rel L2 %.3g\n", (long long)out, (long long)in, n, stt.rel);
    EXPECT_LE(stt.rel, 2e-5) << "tuned GEMM vs GEMV";
  }
  // Single-token GEMVs with >= 2048 rows stream through the cp.async ring (gemv_ring.cuh); the v3 kernels compute
  // the same per-lane chunk order, so the two agree bit for bit where v3 does not split K (>= 4096 rows at n = 1,
  // see gemv()'s K-split rule), and to summation order otherwise.
  if (n == 1) {
    EXPECT_EQ(cu::gemv_ring_eligible(W, a), out >= 2048) << "the ring takes single-token GEMVs of >= 2048 rows";
    if (cu::gemv_ring_eligible(W, a)) {
      cu::LinearArgs b = a;
      b.round_bf16 = false;
      DBuf<float> d_ring(ref.size()), d_v3(ref.size());
      b.y = d_ring.p;
      cu::linear(W, b, nullptr);
      cu::set_gemv_ring(false);
      b.y = d_v3.p;
      cu::linear(W, b, nullptr);
      cu::set_gemv_ring(true);
      const auto yr = d_ring.get(), yv = d_v3.get();
      const Stats st = cmp(yr, yv);
      const bool same = std::memcmp(yr.data(), yv.data(), yr.size() * 4) == 0;
      std::printf("[op] ring vs v3 GEMV %s %lldx%lld: %s (rel L2 %.3g)\n", weight_format_name(fmt), (long long)out,
                  (long long)in, same ? "bit-identical" : "differs", st.rel);
      if (out >= 4096) {
        EXPECT_TRUE(same) << "ring vs v3 without K split";
      }
      EXPECT_LE(st.rel, 1e-6) << "ring vs v3";
    }
  }
  // Single-token official GEMVs quantize x while staging it (qa8_x): bit-identical to QA8 kernel + GEMV, except on the
  // tensor cores (FP8, >= 1024 rows), which sum in another order: there, against the CPU and, unrounded, against the
  // FMA kernels on the same quantized x.
  if (official && n == 1) {
    cu::LinearArgs b = a;
    b.x = dx.p, b.qa8_x = true, b.x_bf16_exact = false;
    DBuf<float> df(ref.size());
    b.y = df.p;
    ASSERT_TRUE(cu::gemv_stages_x(W, b)) << "the single-token GEMV should stage x";
    cu::linear(W, b, nullptr);
    const bool tc = cu::gemv_tc_eligible(W, b);
    const bool want_tc = (fmt == WeightFormat::FP8_E8M0 || fmt == WeightFormat::FP8_F32) && out >= 1024 && out % 16 == 0 && in % 128 == 0;
    EXPECT_EQ(tc, want_tc) << "single-token FP8 GEMVs with qa8_x take the tensor cores";
    if (!tc) {
      EXPECT_EQ(0, std::memcmp(df.get().data(), dy.get().data(), ref.size() * 4)) << "fused QA8 differs from qa8_rows + GEMV";
    } else {
      expect_close(df.get(), ref, true, (std::string("tensor-core GEMV ") + std::to_string(out) + "x" + std::to_string(in)).c_str());
      DBuf<float> dt(ref.size()), dr(ref.size());
      cu::LinearArgs u = b;
      u.round_bf16 = false, u.y = dt.p;
      cu::linear(W, u, nullptr);
      cu::set_gemv_tc(false);
      u.y = dr.p;
      cu::linear(W, u, nullptr);
      cu::set_gemv_tc(true);
      const Stats st = cmp(dt.get(), dr.get());
      std::printf("[op] tensor-core vs FMA GEMV %lldx%lld (unrounded): rel L2 %.3g\n", (long long)out, (long long)in, st.rel);
      EXPECT_LE(st.rel, 2e-5) << "tensor-core GEMV vs the FMA kernels";  // as the prefill GEMM vs GEMV bound
    }
  }
  // Batched-decode sizes (2 .. 8 tokens) with qa8_x take the multi-token tensor-core GEMV (FP8, >= 1024 rows): against
  // the CPU, and each token's outputs bit for bit the single-token kernel's on that token alone (its MMA column, scale
  // product and K-slice order are the single-token kernel's); unrounded against the FMA kernels on QA8(x).
  if (official && n > 1 && n < cu::kGemmMinTokens) {
    cu::LinearArgs b = a;
    b.x = dx.p, b.qa8_x = true, b.x_bf16_exact = false;
    const bool fp8 = fmt == WeightFormat::FP8_E8M0 || fmt == WeightFormat::FP8_F32;
    const bool want_tc = fp8 && out >= 1024 && out % 16 == 0 && in % 128 == 0;
    EXPECT_EQ(cu::gemv_tc_eligible(W, b), want_tc) << "batched FP8 GEMVs with qa8_x take the tensor cores";
    if (want_tc) {
      DBuf<float> dn(ref.size());
      b.y = dn.p;
      cu::linear(W, b, nullptr);
      const auto yn = dn.get();
      expect_close(yn, ref, true, (std::string("multi-token tensor-core GEMV ") + std::to_string(out) + "x" + std::to_string(in) + " n=" + std::to_string(n)).c_str());
      // Bit for bit before the BF16 rounding (after it, a last-bit difference would survive only ~1 in 2^15 times).
      cu::LinearArgs bu = b;
      DBuf<float> dnu(ref.size());
      bu.round_bf16 = false, bu.y = dnu.p;
      cu::linear(W, bu, nullptr);
      const auto ynu = dnu.get();
      int same = 0;
      for (int j = 0; j < n; ++j) {
        DBuf<float> d1(static_cast<size_t>(out));
        cu::LinearArgs one = bu;
        one.x = dx.p + static_cast<size_t>(j) * in, one.n = 1, one.y = d1.p;
        cu::linear(W, one, nullptr);
        const auto y1 = d1.get();
        same += std::memcmp(y1.data(), ynu.data() + static_cast<size_t>(j) * out, static_cast<size_t>(out) * 4) == 0;
      }
      EXPECT_EQ(same, n) << "tokens whose unrounded outputs are the single-token kernel's bits";
      DBuf<float> dt(ref.size()), dr(ref.size());
      cu::LinearArgs u = b;
      u.round_bf16 = false, u.y = dt.p;
      cu::linear(W, u, nullptr);
      cu::set_gemv_tc_n(false);
      EXPECT_FALSE(cu::gemv_tc_eligible(W, u)) << "DSV4_GEMV_TC_N=0";
      u.x = dq.p, u.qa8_x = false, u.x_bf16_exact = true, u.y = dr.p;
      cu::linear(W, u, nullptr);
      cu::set_gemv_tc_n(true);
      const Stats st = cmp(dt.get(), dr.get());
      std::printf("[op] multi-token tensor-core vs FMA GEMV %lldx%lld n=%d (unrounded): rel L2 %.3g, %d/%d tokens = single-token bits (unrounded)\n",
                  (long long)out, (long long)in, n, st.rel, same, n);
      EXPECT_LE(st.rel, 2e-5) << "multi-token tensor-core GEMV vs the FMA kernels";
    }
  }
  // QA8 itself must be bit-exact (it is a pure function of each 128-block).
  if (official) {
    auto q = dq.get();
    EXPECT_EQ(0, std::memcmp(q.data(), xr.data(), q.size() * 4)) << "QA8 differs from num::fp8_sim";
  }
  cu::free_linear(W);
}

TEST(CudaOps, Fp8LinearWqaShape) {
  for (bool off : {false, true}) {
    run_linear(1024, 4096, 1, off);
    run_linear(1024, 4096, 5, off);
  }
}
// Prefill-sized linears: the tensor-core GEMM with exact BF16-term operands (1 x 1 terms: QA8 x FP8 E8M0; 3 x 1:
// FP8 with fp32 scales; 1 x 3: fp32 activations), token counts odd and even, against the CPU and the GEMV.
TEST(CudaOps, PrefillGemm) {
  run_linear(1024, 4096, 64, true);
  run_linear(32768, 1024, 37, true);
  run_linear(4096, 8192, 256, true);
  run_linear(2048, 4096, 16, true, WeightFormat::FP8_F32);
  run_linear(1024, 4096, 33, false);
  run_linear(1000, 4096, 20, false, WeightFormat::BF16);
  run_linear(1000, 1024, 24, true, WeightFormat::MXFP4);
}
TEST(CudaOps, Fp8LinearWqbShape) {
  for (bool off : {false, true}) run_linear(32768, 1024, 1, off);
}
// Batched decode (2 .. 15 tokens) on the multi-token tensor-core GEMV at the Flash shapes it serves: wq_a (n = 5 is in
// Fp8LinearWqaShape), wq_b, wo_b (K = 8192: 3 ring stages at any n > 1, the staged rows leave no room for 6; at most
// 7 tokens a launch, so 8 = 7 + 1), the shared expert's w1 and w2 and the indexer's wq_b; more than 8 tokens (12, 15)
// in launches of 8.
TEST(CudaOps, TensorCoreGemvMultiToken) {
  run_linear(32768, 1024, 8, true);
  run_linear(32768, 1024, 2, true);
  run_linear(32768, 1024, 12, true);
  run_linear(4096, 8192, 8, true);
  run_linear(4096, 8192, 3, true);
  run_linear(4096, 8192, 14, true);  // 7 + 7: two full launches of the 3-stage kernel
  run_linear(4096, 8192, 15, true);
  run_linear(2048, 4096, 7, true);
  run_linear(4096, 2048, 4, true);
  run_linear(8192, 1024, 6, true);
  run_linear(1024, 4096, 8, true, WeightFormat::FP8_F32);
}
// Batched decode's grouped wo_a on the tensor cores (gemv_tc_grouped_eligible: x BF16 values staged exactly): the V4
// shape (8 groups of 1024 rows over 4096-column slices of a 32768-wide row), 2 / 4 / 8 tokens and 12 (8 + 4), vs the
// double-precision CPU product (rel L2 <= 1e-6 unrounded: fp32 summation order only) and vs the FMA kernels it
// replaces (switch off: rel L2 <= 1e-6 unrounded; with the BF16 output rounding >= 99 % of outputs identical).
// Values spanning 2^-30..2^4 in a block check the staging scale (a lost small value would not show; a wrong scale
// would).
TEST(CudaOps, TensorCoreGemvGroupedExact) {
  const int64_t G = 8, ro = 1024, gin = 4096, ldx = G * gin, out = G * ro;
  std::mt19937 g(29);
  auto L = make_linear(WeightFormat::FP8_E8M0, out, gin, g);
  cu::DevLinear W = cu::upload_linear(L->ref);
  for (int n : {2, 4, 8, 12}) {
    vector<float> x = randn(static_cast<size_t>(n * ldx), g);
    std::uniform_int_distribution<int> ex(-30, 4);
    for (size_t i = 0; i < x.size(); i += 7) x[i] = std::ldexp(x[i], ex(g));
    num::round_bf16(x.data(), static_cast<int64_t>(x.size()));
    vector<float> ref(static_cast<size_t>(n * out));
    for (int t = 0; t < n; ++t)
      for (int64_t r = 0; r < out; ++r) {
        const float* xr = x.data() + t * ldx + (r / ro) * gin;
        const float* wr = L->deq.data() + r * gin;
        double acc = 0.0;
        for (int64_t k = 0; k < gin; ++k) acc += static_cast<double>(xr[k]) * wr[k];
        ref[static_cast<size_t>(t * out + r)] = static_cast<float>(acc);
      }
    DBuf<float> dx(x);
    auto run = [&](bool tc, bool round) {
      DBuf<float> dy(static_cast<size_t>(n * out));
      cu::LinearArgs a;
      a.x = dx.p, a.ldx = ldx, a.n = n, a.y = dy.p, a.ldy = out, a.group_rows = ro, a.group_x_off = gin;
      a.round_bf16 = round, a.x_bf16_exact = true;
      cu::set_gemv_tc_grouped(tc);
      EXPECT_EQ(cu::gemv_tc_grouped_eligible(W, a), tc) << "n " << n;
      cu::linear(W, a, nullptr);
      cu::set_gemv_tc_grouped(true);
      return dy.get();
    };
    const auto tc = run(true, false), fma = run(false, false);
    const double e_ref = cmp(tc, ref).rel, e_fma = cmp(tc, fma).rel;
    const auto tcr = run(true, true), fmar = run(false, true);
    size_t same = 0;
    for (size_t i = 0; i < tcr.size(); ++i) same += tcr[i] == fmar[i];
    std::printf("[op] grouped wo_a tensor cores n=%d: rel L2 vs CPU %.3g, vs FMA %.3g; BF16 outputs identical %.2f%%\n", n,
                e_ref, e_fma, 100.0 * static_cast<double>(same) / static_cast<double>(tcr.size()));
    EXPECT_LE(e_ref, 1e-6) << "n " << n;
    EXPECT_LE(e_fma, 1e-6) << "n " << n;
    EXPECT_GE(static_cast<double>(same) / static_cast<double>(tcr.size()), 0.99) << "n " << n;
  }
  cu::free_linear(W);
}
// Row strides wider than the rows (x at in + 128, y at out + 16), 5 tokens and 12 (two launches): x's padding is
// NaN (a read of it would poison the QA8 scale and every output of its row) and y's padding must stay as it was; each
// token's outputs are the single-token kernel's bits (unrounded).
TEST(CudaOps, TensorCoreGemvMultiTokenStrides) {
  const int64_t out = 2048, in = 4096, ldx = in + 128, ldy = out + 16;
  std::mt19937 g(7);
  auto L = make_linear(WeightFormat::FP8_E8M0, out, in, g);
  cu::DevLinear W = cu::upload_linear(L->ref);
  for (int n : {5, 12}) {
    vector<float> x(static_cast<size_t>(n * ldx), std::numeric_limits<float>::quiet_NaN());
    const vector<float> r = randn(static_cast<size_t>(n * in), g);
    for (int t = 0; t < n; ++t) std::copy_n(r.begin() + t * in, in, x.begin() + t * ldx);
    const float sentinel = 12345.0f;
    DBuf<float> dx(x), dy(vector<float>(static_cast<size_t>(n * ldy), sentinel));
    cu::LinearArgs a;
    a.x = dx.p, a.ldx = ldx, a.n = n, a.y = dy.p, a.ldy = ldy, a.qa8_x = true;
    ASSERT_TRUE(cu::gemv_tc_eligible(W, a));
    cu::linear(W, a, nullptr);
    const auto y = dy.get();
    int same = 0, pad_ok = 0;
    for (int t = 0; t < n; ++t) {
      DBuf<float> d1(static_cast<size_t>(out));
      cu::LinearArgs one = a;
      one.x = dx.p + t * ldx, one.n = 1, one.y = d1.p, one.ldy = out;
      cu::linear(W, one, nullptr);
      const auto y1 = d1.get();
      same += std::memcmp(y1.data(), y.data() + t * ldy, static_cast<size_t>(out) * 4) == 0;
      pad_ok += std::all_of(y.begin() + t * ldy + out, y.begin() + (t + 1) * ldy, [&](float v) { return v == sentinel; });
      for (int64_t c = 0; c < out; ++c) ASSERT_TRUE(std::isfinite(y[static_cast<size_t>(t * ldy + c)])) << "token " << t;
    }
    EXPECT_EQ(same, n) << "n " << n << ": tokens with the single-token kernel's bits";
    EXPECT_EQ(pad_ok, n) << "n " << n << ": rows whose padding the GEMV left alone";
  }
  cu::free_linear(W);
}
// wo_b (K = 8192: the largest staged row) and the shared expert's w1|w3 and w2 at n = 1 (the ring GEMV), and the
// LM head's format (BF16) at a ring-sized height.
TEST(CudaOps, RingGemvShapes) {
  for (bool off : {false, true}) {
    run_linear(4096, 8192, 1, off);
    run_linear(4096, 4096, 1, off);
    run_linear(4096, 2048, 1, off);
  }
  run_linear(8192, 4096, 1, false, WeightFormat::BF16);
  run_linear(2048, 4096, 1, true, WeightFormat::MXFP4);
}
// The vectorised GEMV's other formats and K splits (2048 rows: 2 slices; 1000x80: partial row groups, 5 chunks), and
// the per-element kernel for a width that is not whole 16-byte chunks (FP8 K = 200).
TEST(CudaOps, LinearFormatsAndSplits) {
  run_linear(2048, 4096, 1, false, WeightFormat::BF16);
  run_linear(1000, 4096, 3, false, WeightFormat::BF16);
  run_linear(4096, 2048, 1, false, WeightFormat::MXFP4);
  run_linear(1000, 1024, 2, true, WeightFormat::MXFP4);
  run_linear(2048, 4096, 1, true);
  run_linear(1000, 80 * 16, 6, false);
  run_linear(300, 200, 2, false);
}
// The prefill GEMM's conversion passes against their CPU twins, bit for bit: qa8_rows (vector path at len % 4 == 0,
// a short last block, the per-element fallback), split_bf16_terms (1 and 3 terms of x, 1..3 weight-term copies, a
// strided x, the fallback at K % 8 != 0) and round_bf16_rows (strided; the fallback at cols % 4 != 0). Inputs with
// blocks of zeros, tiny and huge values (the QA8 floor and scale rule, E4M3 saturation) besides normal ones.
// The first differing element of two float arrays, for failure messages ("" if none).
std::string first_diff(const vector<float>& got, const vector<float>& ref) {
  std::string r;
  size_t count = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], 4) != 0 && count++ < 6)
      r += " [" + std::to_string(i) + "] " + std::to_string(got[i]) + " vs " + std::to_string(ref[i]);
  return count ? std::to_string(count) + " differ:" + r : "";
}
vector<float> conversion_input(size_t n, std::mt19937& g) {
  vector<float> x = randn(n, g);
  for (size_t i = 0; i < n; ++i) {
    if (i % 997 < 130) x[i] = 0.0f;           // whole zero blocks (amax floor)
    else if (i % 1013 < 40) x[i] *= 1e-7f;    // tiny
    else if (i % 1031 < 5) x[i] *= 3e30f;     // huge
    else if (i % 17 == 3) x[i] = std::ldexp(x[i], -100);  // subnormal-ish after scaling
  }
  return x;
}
TEST(CudaOps, PrefillConversionsMatchCpu) {
  std::mt19937 g(4242);
  for (const int64_t len : {int64_t(4096), int64_t(1000), int64_t(1001), int64_t(96)}) {
    const int n = 37;
    vector<float> x = conversion_input(static_cast<size_t>(n * len), g), ref = x;
    qa8_host(ref.data(), n, len);
    DBuf<float> dx(x), dq(x.size());
    cu::qa8_rows(dx.p, n, len, dq.p, nullptr);
    EXPECT_EQ("", first_diff(dq.get(), ref)) << "qa8_rows len " << len;
    cu::qa8_rows(dx.p, n, len, dx.p, nullptr);  // in place
    EXPECT_EQ("", first_diff(dx.get(), ref)) << "qa8_rows in place, len " << len;
  }
  for (const int64_t K : {int64_t(4096), int64_t(1000), int64_t(1004)}) {
    for (const int tx : {1, 3}) {
      for (const int tw : {1, 2, 3}) {
        const int n = 19;
        const int64_t ldx = K + 12, kp = K * tw * tx;
        vector<float> x = conversion_input(static_cast<size_t>(n * ldx), g);
        vector<uint16_t> ref(static_cast<size_t>(n * kp));
        for (int t = 0; t < n; ++t)
          for (int64_t k = 0; k < K; ++k) {
            float v = x[static_cast<size_t>(t * ldx + k)];
            uint16_t b[3];
            for (int j = 0; j < tx; ++j) {
              b[j] = num::encode_bf16(v);
              v -= num::decode_bf16(b[j]);
            }
            for (int i = 0; i < tw; ++i)
              for (int j = 0; j < tx; ++j) ref[static_cast<size_t>(t * kp + (i * tx + j) * K + k)] = b[j];
          }
        DBuf<float> dx(x);
        DBuf<uint16_t> dout(ref.size());
        cu::split_bf16_terms(dx.p, ldx, n, K, tw, tx, dout.p, nullptr);
        EXPECT_EQ(0, std::memcmp(dout.get().data(), ref.data(), ref.size() * 2))
            << "split_bf16_terms K " << K << " terms " << tw << "x" << tx;
      }
    }
  }
  for (const int64_t cols : {int64_t(8192), int64_t(1000), int64_t(1002)}) {
    const int n = 23;
    const int64_t ldy = cols + (cols % 4 == 0 ? 8 : 2);
    vector<float> y = conversion_input(static_cast<size_t>(n * ldy), g), ref = y;
    for (int t = 0; t < n; ++t) num::round_bf16(ref.data() + t * ldy, cols);
    DBuf<float> dy(y);
    cu::round_bf16_rows(dy.p, n, cols, ldy, nullptr);
    EXPECT_EQ("", first_diff(dy.get(), ref)) << "round_bf16_rows cols " << cols;
  }
}

void run_grouped_wo_a(int n) {
  // wo_a: 8 groups x 1024 rows, each group reading its own 4096-slice of the 64 x 512 attention output (plain dot).
  std::mt19937 g(5);
  const int64_t G = 8, ro = 1024, gin = 4096;
  auto L = make_linear(WeightFormat::FP8_E8M0, G * ro, gin, g);
  vector<float> u = randn(static_cast<size_t>(n * G * gin), g);
  vector<float> ref(static_cast<size_t>(n * G * ro));
  for (int t = 0; t < n; ++t)
    for (int64_t r = 0; r < G * ro; ++r)
      ref[t * G * ro + r] = cpu::dot(u.data() + t * G * gin + (r / ro) * gin, L->deq.data() + r * gin, gin);
  cu::DevLinear W = cu::upload_linear(L->ref);
  DBuf<float> du(u), dz(ref.size());
  cu::LinearArgs a;
  a.x = du.p, a.ldx = G * gin, a.n = n, a.y = dz.p, a.ldy = G * ro, a.group_rows = ro, a.group_x_off = gin;
  cu::linear(W, a, nullptr);
  expect_close(dz.get(), ref, false, (std::string("grouped wo_a 8x1024x4096 n=") + std::to_string(n) +
                                      (cu::prefill_gemm_eligible(W, a) ? " (GEMM)" : "")).c_str());
  if (cu::prefill_gemm_eligible(W, a)) {
    // Official numerics hand wo_a a BF16 input and say so (x_bf16_exact): one BF16 term instead of three, the same
    // products -- against the three-term GEMM on the same BF16-rounded input and against the CPU.
    vector<float> ub = u, refb(ref.size());
    num::round_bf16(ub.data(), static_cast<int64_t>(ub.size()));
    for (int t = 0; t < n; ++t)
      for (int64_t r = 0; r < G * ro; ++r)
        refb[t * G * ro + r] = cpu::dot(ub.data() + t * G * gin + (r / ro) * gin, L->deq.data() + r * gin, gin);
    DBuf<float> dub(ub), d3(ref.size()), d1(ref.size());
    cu::LinearArgs b = a;
    b.x = dub.p, b.y = d3.p;
    cu::linear(W, b, nullptr);
    // d1: the per-group GEMMs (DSV4_GEMM_BATCHED off), the baseline the batched GEMM is compared with below.
    const bool was = cu::prefill_gemm_batched();
    cu::set_prefill_gemm_batched(false);
    b.x_bf16_exact = true, b.y = d1.p;
    cu::linear(W, b, nullptr);
    const Stats st = cmp(d1.get(), d3.get());
    std::printf("[op] grouped wo_a n=%d, BF16 input: one term vs three, rel L2 %.3g\n", n, st.rel);
    // Two cuBLASLt GEMMs (K 4096 vs 3 x 4096) sum in different fp32 orders: 1.46e-6 measured (the GEMM vs the CPU:
    // 2.4e-6); a dropped or truncated term would show as ~1e-3 (BF16's 2^-9).
    EXPECT_LE(st.rel, 1e-5);
    expect_close(d1.get(), refb, false, "grouped wo_a, BF16 input as one term");
    // DSV4_GEMM_BATCHED: the groups as one strided-batched GEMM (one term each), against the per-group GEMMs.
    cu::set_prefill_gemm_batched(true);
    DBuf<float> db(ref.size());
    b.y = db.p;
    cu::linear(W, b, nullptr);
    cu::set_prefill_gemm_batched(was);
    const Stats sb = cmp(db.get(), d1.get());
    std::printf("[op] grouped wo_a n=%d, BF16 input: batched GEMM vs per-group GEMMs, rel L2 %.3g\n", n, sb.rel);
    EXPECT_LE(sb.rel, 1e-5);  // fp32 summation order only (a wrong group's operands would be O(1))
    expect_close(db.get(), refb, false, "grouped wo_a, batched GEMM");
  }
  if (n == 1) {
    // Decode: the ring GEMV, one group per set of blocks; v3 (no K split at 8192 rows) gives the same bits.
    ASSERT_TRUE(cu::gemv_ring_eligible(W, a));
    ASSERT_TRUE(cu::gemv_stages_x(W, a));
    DBuf<float> dv(ref.size());
    cu::set_gemv_ring(false);
    a.y = dv.p;
    cu::linear(W, a, nullptr);
    cu::set_gemv_ring(true);
    EXPECT_EQ(0, std::memcmp(dv.get().data(), dz.get().data(), ref.size() * 4)) << "grouped ring vs v3";
    // Official decode: QA8 of each group's slice fused into the staging, bit-identical to qa8_rows + GEMV.
    DBuf<float> dq(u.size()), dr(ref.size()), df(ref.size());
    cu::qa8_rows(du.p, 1, G * gin, dq.p, nullptr);
    a.x = dq.p, a.y = dr.p;
    cu::linear(W, a, nullptr);
    a.x = du.p, a.qa8_x = true, a.y = df.p;
    cu::linear(W, a, nullptr);
    EXPECT_EQ(0, std::memcmp(dr.get().data(), df.get().data(), ref.size() * 4)) << "grouped ring, fused QA8";
  }
  cu::free_linear(W);
}
TEST(CudaOps, Fp8LinearGroupedWoA) {
  run_grouped_wo_a(1);
  run_grouped_wo_a(2);
  run_grouped_wo_a(40);  // the GEMM, one per group
}

// ---- router top-k with ties at real expert counts ------------------------------------------------------------------
// Logits on a 0.25 grid (9 values over E experts: dozens of exact ties in the top group) and no bias, so the order
// (score descending, index ascending) is the logits' order and the CPU can state it exactly: the selection must be
// the first k of that order, best first. Flash 256 and Pro 384 experts at k 6 (route_topk_prefiltered), and the
// shapes around its limits: 40 experts (six of the eight warps hold none: every expert a candidate), k 8 (its
// largest), 1,024 experts (4 per lane), k 16 and 1,100 experts (the rank count over all: k > 8, more than 4 experts
// per lane).
TEST(CudaOps, RouterTopkTies) {
  std::mt19937 g(5);
  for (auto [E, k] : {std::pair{256, 6}, {384, 6}, {40, 6}, {256, 8}, {1024, 8}, {256, 16}, {1100, 6}}) {
    const int n = 5;
    vector<float> logits(static_cast<size_t>(n * E));
    for (auto& v : logits) v = 0.25f * static_cast<float>(static_cast<int>(g() % 9) - 4);
    DBuf<float> dlog(logits), dwts(static_cast<size_t>(n * k));
    DBuf<int32_t> dsel(static_cast<size_t>(n * k));
    cu::RouterArgs r;
    r.logits = dlog.p, r.n = n, r.E = E, r.k = k, r.func = 0, r.norm_topk = true, r.scaling = 2.5f;
    r.sel = dsel.p, r.wts = dwts.p;
    cu::router(r, nullptr);
    const vector<int32_t> sel = dsel.get();
    const vector<float> wts = dwts.get();
    for (int t = 0; t < n; ++t) {
      vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      const float* lg = logits.data() + static_cast<size_t>(t) * E;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lg[a] > lg[b]; });
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += std::sqrt(std::log1p(std::exp(static_cast<double>(lg[order[j]]))));
      for (int j = 0; j < k; ++j) {
        ASSERT_EQ(sel[t * k + j], order[j]) << "E " << E << " token " << t << " slot " << j;
        const double w = std::sqrt(std::log1p(std::exp(static_cast<double>(lg[order[j]])))) / sum * 2.5;
        EXPECT_NEAR(wts[t * k + j], w, 1e-5 * w) << "E " << E << " token " << t << " slot " << j;
      }
    }
  }
}

// ---- MXFP4 routed experts: router + fused gate/up SwiGLU + down + reduce ------------------------------------------
// grouped: the prefill path (slots grouped by expert on the device, one block per (row tile, expert)).
// expert_f8 (the W4A8 prefill kernel, moe_f8.cuh) against expert_tc2 on the same grouped operands t (unrounded: no
// BF16 output rounding, x_bf16_exact), with x and the down input given a different power-of-two magnitude per
// 128-column block and slot, so that a wrong activation-scale index shows as O(1). Both compute the same exact
// products (QA8 x MXFP4); they differ in summation order and the FP8 MMA's internal accumulation of 32 products.
// wg 1 .. 4: the same against the f16 wgmma kernel (moe_wg.cuh, set_moe_wg(wg): its variants), 5 / 6 the BF16 one
// (moe_wb.cuh), instead of expert_f8.
void run_experts_f8_vs_tc2(const cu::ExpertArgs& t, const vector<float>& x, int n, int64_t d, int64_t I, int k, int wg = 0) {
  struct F8Back {
    ~F8Back() { cu::set_moe_f8(true), cu::set_moe_wg(cu::kMoeWgAuto); }
  } f8_back;
  auto launches = [wg] { return wg ? cu::moe_wg_launches() : cu::moe_f8_launches(); };
  auto set_new = [wg](bool on) { cu::set_moe_f8(on), cu::set_moe_wg(wg); };  // wg 0: expert_f8 itself
  auto blocky = [](vector<float> v, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) v[r * cols + c] *= std::ldexp(1.0f, static_cast<int>((c / 128 * 5 + r) % 7) - 3);
    return v;
  };
  DBuf<float> dx(blocky(x, n, d)), dxq(static_cast<size_t>(n * d));
  cu::qa8_rows(dx.p, n, d, dxq.p, nullptr);
  const size_t nact = static_cast<size_t>(n * k * I), ny = static_cast<size_t>(n * k * d);
  DBuf<float> act0(nact), act1(nact), y0(ny), y1(ny), aq(nact);
  cu::ExpertArgs p = t;
  p.x = dxq.p;
  const int64_t f0 = launches();
  cu::set_moe_f8(false);
  p.act = act0.p;
  cu::expert_gate_up(p, nullptr);  // expert_tc2
  set_new(true);
  p.act = act1.p;
  cu::expert_gate_up(p, nullptr);  // expert_f8 where d % 128 == 0
  // The down input: tc2's act, re-scaled per block and slot, QA8 (the same for both kernels).
  {
    DBuf<float> ab(blocky(act0.get(), n * k, I));
    cu::qa8_rows(ab.p, n * k, I, aq.p, nullptr);
  }
  p.act_q = aq.p;
  p.y = y1.p;
  cu::expert_down(p, nullptr);  // expert_f8 / expert_wg
  set_new(false);
  cu::set_moe_f8(false);
  p.y = y0.p;
  cu::expert_down(p, nullptr);  // expert_tc2
  EXPECT_EQ(launches() - f0, d % 128 == 0 ? 2 : 1) << (wg ? "expert_wg ran" : "expert_f8 ran");
  const auto a0 = act0.get(), a1 = act1.get(), yy0 = y0.get(), yy1 = y1.get();
  const Stats sa = cmp(a1, a0), sy = cmp(yy1, yy0);
  std::printf("[op] experts %s vs tc2 n=%d d=%lld (unrounded, per-block magnitudes): gate/up rel L2 %.3g%s, down rel L2 %.3g\n",
              wg == 14 ? "wgmma bf16 (bulk B, 3 warpgroups, 2 A sets)" : wg == 13 ? "wgmma bf16 (bulk B, n64 wgmmas on narrow tiles)" : wg == 12 ? "wgmma bf16 (bulk B, per-warpgroup barriers)" : wg == 11 ? "wgmma bf16 (bulk B multicast to block pairs)" : wg == 10 ? "wgmma bf16 (bulk B, 64 slots)" : wg == 9 ? "wgmma bf16 (bulk B, 128 slots)" : wg == 8 ? "wgmma bf16 (4 warpgroups, 128 slots)" : wg == 7 ? "wgmma bf16 (4 warpgroups, 2 A sets)" : wg == 6 ? "wgmma bf16 (scales folded, 2 A sets)" : wg == 5 ? "wgmma bf16 (scales folded)" : wg == 4 ? "wgmma f16 (128-slot tiles)" : wg == 3 ? "wgmma f16 (2 blocks/SM, early barrier)" : wg == 2 ? "wgmma f16 (2 blocks/SM)" : wg ? "wgmma f16" : "W4A8 f8", n, static_cast<long long>(d), sa.rel, d % 128 == 0 ? "" : " (tc2 both: d % 128 != 0)", sy.rel);
  EXPECT_LE(sa.rel, 1e-5);  // the decode MMA walk vs its FMA walk: ~1.6e-7
  EXPECT_LE(sy.rel, 1e-5);
  for (float v : a1) ASSERT_TRUE(std::isfinite(v));
  for (float v : yy1) ASSERT_TRUE(std::isfinite(v));
}

void run_experts(int n, bool grouped, int64_t d = 4096) {
  // The bit-for-bit comparisons below pit the decode ring kernels against the n-token ones: the FMA ring walk
  // (the MMA walk is the same function in another summation order; Mxfp4DecodeExpertsMma compares them).
  cu::set_expert_mma(false);
  struct MmaBack {
    ~MmaBack() { cu::set_expert_mma(true); }
  } mma_back;
  std::mt19937 g(11);
  const int E = 8, k = 6;
  const int64_t I = 2048;
  const float lim = 10.0f;
  vector<std::unique_ptr<HostLinear>> w1, w2, w3;
  vector<cu::DevLinear> d1, d2, d3;
  vector<cu::DevExpert> table;
  for (int e = 0; e < E; ++e) {
    w1.push_back(make_linear(WeightFormat::MXFP4, I, d, g));
    w3.push_back(make_linear(WeightFormat::MXFP4, I, d, g));
    w2.push_back(make_linear(WeightFormat::MXFP4, d, I, g));
    d1.push_back(cu::upload_linear(w1.back()->ref));
    d3.push_back(cu::upload_linear(w3.back()->ref));
    d2.push_back(cu::upload_linear(w2.back()->ref));
    table.push_back(cu::make_dev_expert(d1.back(), d3.back(), d2.back()));
  }
  DBuf<cu::DevExpert> dtable(table);
  vector<float> x = randn(static_cast<size_t>(n * d), g, 0.05f);
  // Router over E experts: sqrtsoftplus + bias, top-k.
  vector<float> logits = randn(static_cast<size_t>(n * E), g), bias = randn(E, g, 0.1f);
  vector<int32_t> sel_ref(static_cast<size_t>(n * k));
  vector<float> wts_ref(static_cast<size_t>(n * k));
  for (int t = 0; t < n; ++t) {
    vector<float> s(E);
    for (int e = 0; e < E; ++e) {
      float v = logits[t * E + e];
      s[e] = std::sqrt(v > 20.0f ? v : std::log1p(std::exp(v)));
    }
    vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      float sa = s[a] + bias[a], sb = s[b] + bias[b];
      return sa > sb || (sa == sb && a < b);
    });
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += s[order[j]];
    for (int j = 0; j < k; ++j) {
      sel_ref[t * k + j] = order[j];
      wts_ref[t * k + j] = static_cast<float>(s[order[j]] / sum) * 1.5f;
    }
  }
  DBuf<float> dlog(logits), dbias(bias), dwts(static_cast<size_t>(n * k));
  DBuf<int32_t> dsel(static_cast<size_t>(n * k));
  cu::RouterArgs r;
  r.logits = dlog.p, r.n = n, r.E = E, r.k = k, r.func = 0, r.bias = dbias.p, r.norm_topk = true, r.scaling = 1.5f;
  r.sel = dsel.p, r.wts = dwts.p;
  cu::router(r, nullptr);
  EXPECT_EQ(dsel.get(), sel_ref) << "router selection";
  expect_close(dwts.get(), wts_ref, false, "router weights");

  for (bool official : {false, true}) {
    // CPU twin of expert_ffn for every (token, slot), summed in double like moe().
    vector<float> ref(static_cast<size_t>(n * d));
    for (int t = 0; t < n; ++t) {
      vector<float> xq(x.begin() + t * d, x.begin() + (t + 1) * d);
      if (official) qa8_host(xq.data(), 1, d);
      vector<double> acc(static_cast<size_t>(d), 0.0);
      for (int j = 0; j < k; ++j) {
        const int e = sel_ref[t * k + j];
        vector<float> gg(I), uu(I), y(d);
        cpu::matmul_nt(xq.data(), 1, d, w1[e]->deq.data(), I, gg.data());
        cpu::matmul_nt(xq.data(), 1, d, w3[e]->deq.data(), I, uu.data());
        if (official) num::round_bf16(gg.data(), I), num::round_bf16(uu.data(), I);
        for (int64_t i = 0; i < I; ++i) {
          float gv = std::min(gg[i], lim), uv = std::clamp(uu[i], -lim, lim);
          gg[i] = cpu::silu(gv) * uv * wts_ref[t * k + j];
        }
        if (official) num::round_bf16(gg.data(), I), qa8_host(gg.data(), 1, I);
        cpu::matmul_nt(gg.data(), 1, I, w2[e]->deq.data(), d, y.data());
        if (official) num::round_bf16(y.data(), d);
        for (int64_t i = 0; i < d; ++i) acc[i] += y[i];
      }
      for (int64_t i = 0; i < d; ++i) ref[t * d + i] = static_cast<float>(acc[i]);
      if (official) num::round_bf16(ref.data() + t * d, d);
    }
    DBuf<float> dx(x), dxq(x.size()), dact(static_cast<size_t>(n * k * I)), dactq(static_cast<size_t>(n * k * I)),
        dy(static_cast<size_t>(n * k * d)), dout(static_cast<size_t>(n * d));
    cu::ExpertArgs a;
    a.table = dtable.p, a.fmt = WeightFormat::MXFP4, a.d = d, a.I = I, a.sb1 = d / 32, a.sb2 = I / 32;
    a.x = dx.p;
    if (official) {
      cu::qa8_rows(dx.p, n, d, dxq.p, nullptr);
      a.x = dxq.p;
    }
    a.n = n, a.k = k, a.sel = dsel.p, a.wts = dwts.p, a.limit = lim, a.official = official, a.act = dact.p;
    DBuf<int32_t> doff(static_cast<size_t>(E + 1)), dperm(static_cast<size_t>(n * k));
    const size_t xg_bytes = cu::moe_prefill_scratch_bytes(n, k, d, I, E);
    DBuf<float> dxg(xg_bytes / 4 + 1);  // the prefill kernels' staged rows
    if (grouped) {
      cu::moe_group(dsel.p, n * k, E, doff.p, dperm.p, nullptr);
      a.perm = dperm.p, a.offsets = doff.p, a.E = E;
      a.x_bf16_exact = official;  // QA8 inputs: the tensor-core kernels (as the backend sets it)
      a.xg = reinterpret_cast<uint16_t*>(dxg.p), a.xg_bytes = xg_bytes;
      EXPECT_EQ(cu::expert_tc2_eligible(a, true), official) << "official grouped MXFP4 prefill takes expert_tc2";
      // The grouping is a permutation of the slots, expert by expert.
      const auto off = doff.get();
      auto perm = dperm.get();
      ASSERT_EQ(off[0], 0);
      ASSERT_EQ(off[E], n * k);
      for (int e = 0; e < E; ++e)
        for (int i = off[e]; i < off[e + 1]; ++i) ASSERT_EQ(sel_ref[perm[i]], e) << "slot " << perm[i];
      std::sort(perm.begin(), perm.end());
      for (int i = 0; i < n * k; ++i) ASSERT_EQ(perm[i], i);
    }
    cu::expert_gate_up(a, nullptr);
    a.act_q = dact.p;
    if (official) {
      cu::qa8_rows(dact.p, n * k, I, dactq.p, nullptr);
      a.act_q = dactq.p;
    }
    a.y = dy.p;
    cu::expert_down(a, nullptr);
    cu::moe_reduce(dy.p, nullptr, n, k, d, official, dout.p, nullptr);
    if (!grouped && n >= 2) {
      // Token 0 alone (n = 1: the persistent decode kernels, expert_tiles_kernel) gives bit for bit what the
      // per-(row block, slot) kernels gave it inside the n-token call: same chunk order per lane, same warp sums.
      cu::ExpertArgs one = a;
      DBuf<float> act1(static_cast<size_t>(k * I)), y1(static_cast<size_t>(k * d));
      one.n = 1, one.act = act1.p, one.y = y1.p;
      EXPECT_TRUE(cu::expert_ring_eligible(one, true)) << "decode gate/up takes the ring kernel";
      EXPECT_TRUE(cu::expert_ring_eligible(one, false)) << "decode down takes the ring kernel";
      cu::expert_gate_up(one, nullptr);
      cu::expert_down(one, nullptr);  // act_q rows 0..k-1 of the n-token call
      EXPECT_EQ(0, std::memcmp(act1.get().data(), dact.get().data(), static_cast<size_t>(k * I) * 4)) << "decode gate/up";
      EXPECT_EQ(0, std::memcmp(y1.get().data(), dy.get().data(), static_cast<size_t>(k * d) * 4)) << "decode down";
      {
        // The shared expert fused into the same two ring launches as slot k (FP8 w1|w3 pair [2I, d] and w2 [d, I]):
        // routed rows unchanged, and row k bit for bit what the separate path computes on the ring GEMVs (pair GEMV,
        // SwiGLU kernel, w2 GEMV), official numerics with QA8 applied while staging as the backend does.
        std::mt19937 gs(23);
        auto H13 = make_linear(WeightFormat::FP8_E8M0, 2 * I, d, gs);
        auto H2 = make_linear(WeightFormat::FP8_E8M0, d, I, gs);
        cu::DevLinear S13 = cu::upload_linear(H13->ref), S2 = cu::upload_linear(H2->ref);
        cu::ExpertArgs f = one;
        DBuf<float> fact(static_cast<size_t>((k + 1) * I)), fy(static_cast<size_t>((k + 1) * d));
        f.act = fact.p, f.y = fy.p, f.shared13 = &S13, f.shared2 = &S2;
        if (official) f.x = dx.p, f.qa8_x = true;
        ASSERT_TRUE(cu::expert_ring_shared_ok(f)) << "decode: the shared expert fuses into the ring launches";
        cu::expert_gate_up(f, nullptr);
        f.act_q = fact.p, f.qa8_act = official;
        cu::expert_down(f, nullptr);
        EXPECT_EQ(0, std::memcmp(fact.get().data(), act1.get().data(), static_cast<size_t>(k * I) * 4)) << "fused: routed act";
        EXPECT_EQ(0, std::memcmp(fy.get().data(), y1.get().data(), static_cast<size_t>(k * d) * 4)) << "fused: routed y";
        // The separate path on the ring GEMVs (tensor-core GEMV off: it sums in another order).
        cu::set_gemv_tc(false);
        DBuf<float> g2(static_cast<size_t>(2 * I)), sact(static_cast<size_t>(I)), sy(static_cast<size_t>(d));
        cu::LinearArgs l;
        l.x = official ? dx.p : one.x, l.ldx = d, l.n = 1, l.y = g2.p, l.ldy = 2 * I, l.round_bf16 = official, l.qa8_x = official;
        cu::linear(S13, l, nullptr);
        cu::swiglu(g2.p, g2.p + I, I, lim, official, sact.p, nullptr);
        l.x = sact.p, l.ldx = I, l.y = sy.p, l.ldy = d;
        cu::linear(S2, l, nullptr);
        cu::set_gemv_tc(true);
        const auto fa = fact.get(), fyv = fy.get();
        EXPECT_EQ(0, std::memcmp(fa.data() + k * I, sact.get().data(), static_cast<size_t>(I) * 4)) << "fused: shared act";
        EXPECT_EQ(0, std::memcmp(fyv.data() + k * d, sy.get().data(), static_cast<size_t>(d) * 4)) << "fused: shared y";
        cu::free_linear(S13), cu::free_linear(S2);
      }
      if (official) {  // ... and with QA8 applied while staging (the official decode path): the same bits again
        cu::ExpertArgs f1 = one;
        DBuf<float> fact1(static_cast<size_t>(k * I)), fy1(static_cast<size_t>(k * d));
        f1.x = dx.p, f1.qa8_x = true, f1.act = fact1.p;
        ASSERT_TRUE(cu::expert_gate_up_stages_x(f1));
        cu::expert_gate_up(f1, nullptr);
        f1.act_q = fact1.p, f1.qa8_act = true, f1.y = fy1.p;
        EXPECT_TRUE(cu::expert_down_stages_x(f1));
        cu::expert_down(f1, nullptr);
        EXPECT_EQ(0, std::memcmp(fact1.get().data(), dact.get().data(), static_cast<size_t>(k * I) * 4)) << "decode gate/up, fused QA8";
        EXPECT_EQ(0, std::memcmp(fy1.get().data(), dy.get().data(), static_cast<size_t>(k * d) * 4)) << "decode down, fused QA8";
      }
    }
    if (official && !grouped) {
      // The single-slot kernels quantizing x and act while staging them (qa8_x / qa8_act, the decode path): bit for
      // bit the QA8 kernels' result.
      cu::ExpertArgs f = a;
      DBuf<float> fact(dact.n), fy(dy.n);
      f.x = dx.p, f.qa8_x = true, f.act = fact.p;
      ASSERT_TRUE(cu::expert_gate_up_stages_x(f));
      cu::expert_gate_up(f, nullptr);
      f.act_q = fact.p, f.qa8_act = true, f.y = fy.p;
      ASSERT_TRUE(cu::expert_down_stages_x(f));
      cu::expert_down(f, nullptr);
      EXPECT_EQ(0, std::memcmp(fact.get().data(), dact.get().data(), dact.n * 4)) << "fused QA8 of x";
      EXPECT_EQ(0, std::memcmp(fy.get().data(), dy.get().data(), dy.n * 4)) << "fused QA8 of act";
    }
    expect_close(dout.get(), ref, official, (std::string("mxfp4 experts 6x(") + std::to_string(d) + "->2048->" + std::to_string(d) + ") n=" + std::to_string(n) +
                                             (grouped ? " grouped" : "") + (a.x_bf16_exact ? " (tensor cores)" : "")).c_str());
    if (grouped && official) {
      // Tensor-core kernels vs the fp32 grouped kernels on the same exact-BF16 operands, without the BF16 output
      // rounding: the same fp32 function up to summation order (a BF16-rounding bug would show as ~1e-3).
      cu::ExpertArgs t = a, f = a;
      t.official = f.official = false;
      f.x_bf16_exact = false;
      DBuf<float> act_t(dact.n), act_f(dact.n), y_t(dy.n), y_f(dy.n);
      t.act = act_t.p, f.act = act_f.p, t.y = y_t.p, f.y = y_f.p;
      t.act_q = f.act_q = dactq.p;
      cu::expert_gate_up(t, nullptr);
      cu::expert_gate_up(f, nullptr);
      cu::expert_down(t, nullptr);
      cu::expert_down(f, nullptr);
      const Stats sa = cmp(act_t.get(), act_f.get()), sy = cmp(y_t.get(), y_f.get());
      std::printf("[op] experts tensor cores vs fp32 n=%d (unrounded): gate/up rel L2 %.3g, down rel L2 %.3g\n", n, sa.rel, sy.rel);
      EXPECT_LE(sa.rel, 1e-5);  // measured 1.5e-7 (gate/up) and 1.2e-6 (down)
      EXPECT_LE(sy.rel, 1e-5);
      // (t ran the default: expert_wg / expert_f8 by moe_wg_effective where K % 128 == 0.) expert_tc2 (xg set,
      // DSV4_MOE_F8=0) against the v1
      // tensor-core kernels on the same operands.
      ASSERT_TRUE(cu::expert_tc2_eligible(t, true) && cu::expert_tc2_eligible(t, false));
      cu::ExpertArgs v = t, w = t;
      DBuf<float> act_v(dact.n), y_v(dy.n), act_w(dact.n), y_w(dy.n);
      v.act = act_v.p, v.y = y_v.p, w.act = act_w.p, w.y = y_w.p;
      cu::set_moe_f8(false);
      cu::expert_gate_up(w, nullptr);
      cu::expert_down(w, nullptr);
      cu::set_moe_tc2(false);
      cu::expert_gate_up(v, nullptr);
      cu::expert_down(v, nullptr);
      cu::set_moe_tc2(true);
      cu::set_moe_f8(true);
      const Stats va = cmp(act_w.get(), act_v.get()), vy = cmp(y_w.get(), y_v.get());
      std::printf("[op] experts tc2 vs tc1 n=%d (unrounded): gate/up rel L2 %.3g, down rel L2 %.3g\n", n, va.rel, vy.rel);
      EXPECT_LE(va.rel, 1e-5);
      EXPECT_LE(vy.rel, 1e-5);
      // Both kernels at both pipeline depths (DSV4_MOE_PREFILL_STAGES): the same arithmetic, so the same results.
      const int stages0 = cu::moe_prefill_stages();
      for (int stages : {4, 8}) {
        cu::set_moe_prefill_stages(stages);
        std::printf("[op] prefill expert kernels with %d pipeline stages:\n", stages);
        run_experts_f8_vs_tc2(t, x, n, d, I, k);
        run_experts_f8_vs_tc2(t, x, n, d, I, k, 1);
        run_experts_f8_vs_tc2(t, x, n, d, I, k, 2);  // (always 4 stages)
        run_experts_f8_vs_tc2(t, x, n, d, I, k, 3);
        run_experts_f8_vs_tc2(t, x, n, d, I, k, 4);  // 128-slot tiles (always 4 stages)
      }
      cu::set_moe_prefill_stages(stages0);
    }
    if (grouped && official) {
      // The default run above took expert_f8 (the W4A8 prefill kernel) where K % 128 == 0; the whole official MoE
      // again on expert_tc2 (DSV4_MOE_F8=0, and still the kernel where K % 128 != 0) against the CPU twin.
      struct F8Back {
        ~F8Back() { cu::set_moe_f8(true); }
      } f8_back;
      const int64_t f0 = cu::moe_f8_launches();
      cu::set_moe_f8(false);
      DBuf<float> act8(dact.n), actq8(dact.n), y8(dy.n), out8(dout.n);
      cu::ExpertArgs b = a;
      b.act = act8.p;
      cu::expert_gate_up(b, nullptr);
      cu::qa8_rows(act8.p, n * k, I, actq8.p, nullptr);
      b.act_q = actq8.p, b.y = y8.p;
      cu::expert_down(b, nullptr);
      cu::moe_reduce(y8.p, nullptr, n, k, d, official, out8.p, nullptr);
      EXPECT_EQ(cu::moe_f8_launches(), f0) << "expert_f8 off";
      expect_close(out8.get(), ref, official, (std::string("mxfp4 experts n=") + std::to_string(n) + " d=" + std::to_string(d) +
                                               " grouped (expert_tc2)").c_str());
      // ... and on the wgmma kernel (moe_wg.cuh), both variants.
      cu::set_moe_f8(true);
      for (int mode : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}) {
        cu::set_moe_wg(mode);
        const int64_t w0 = cu::moe_wg_launches();
        b = a;
        b.act = act8.p;
        cu::expert_gate_up(b, nullptr);
        cu::qa8_rows(act8.p, n * k, I, actq8.p, nullptr);
        b.act_q = actq8.p, b.y = y8.p;
        cu::expert_down(b, nullptr);
        cu::set_moe_wg(cu::kMoeWgAuto);
        cu::moe_reduce(y8.p, nullptr, n, k, d, official, out8.p, nullptr);
        EXPECT_EQ(cu::moe_wg_launches() - w0, d % 128 == 0 ? 2 : 1) << "expert_wg ran (gate/up only where d % 128 == 0)";
        expect_close(out8.get(), ref, official, (std::string("mxfp4 experts n=") + std::to_string(n) + " d=" + std::to_string(d) +
                                                 " grouped (expert_wg " + std::to_string(mode) + ")").c_str());
      }
    }
  }
  for (int e = 0; e < E; ++e) cu::free_linear(d1[e]), cu::free_linear(d2[e]), cu::free_linear(d3[e]);
}

TEST(CudaOps, Mxfp4ExpertsAndRouter) { run_experts(2, false); }

// ---- decode MXFP4 experts on FP8 MMAs (expert_mma.cuh) vs the FMA ring walk --------------------------------------
// One token, 6 of 8 experts, the FP8 shared expert fused as in the backend, the activation QA8-quantized while staging.
// Without the BF16 output rounding (official = false) the two walks compute the same exact products and differ only
// in summation order and the tensor core's internal accumulation: a fragment, staging-order or scale-index bug shows
// as O(1). With official rounding: within a few BF16 ulps. The shared expert's rows: bit for bit on its FMA walk,
// within the same bounds on the MMAs (DSV4_SHARED_MMA). So that a wrong per-block scale index cannot hide, every
// 128-column block of x and of the down input has its own power-of-two magnitude and the SwiGLU limit is out of reach
// (random data at one magnitude gives every QA8 block the same scale). Shapes: V4-Flash (fewer 16-row tiles than
// warps: one tile per warp), V4-Flash under TP2 (each rank holds half of every expert's width: I 1024, the shared
// expert's down walk K-split into 4 parts of 2 steps, the routed gate/up walk into 2 parts: expert_mma_parts) and V4-Pro's gate/up (d 7168, I 3072: more tiles than warps,
// so warps walk several; its down does not fit the ring and takes another kernel in both runs).
void run_decode_experts_mma(int64_t d, int64_t I, bool shared);
TEST(CudaOps, Mxfp4DecodeExpertsMma) {
  for (bool shared : {false, true}) {
    run_decode_experts_mma(4096, 2048, shared);
    run_decode_experts_mma(4096, 1024, shared);
    run_decode_experts_mma(7168, 3072, shared);
    // Pro TP2 (a rank's I = 1536): 2,688 down tiles for 2,112 warps, so a warp walks two down tiles -- the per-tile
    // refresh of the staged activation's pointers in mma_walk (each down tile reads its own slot's row).
    run_decode_experts_mma(7168, 1536, shared);
  }
  cu::set_shared_expert_mma(true);  // the defaults
  cu::set_expert_f16(true);
}
// Batched decode's routed experts on the single-token f16 MMA walk (expert_rows_*: two tokens' 12 slots per launch) at
// V4-Flash shapes, n = 2 / 3 / 4 / 7 tokens (odd counts: a last launch of one token): act and y bit for bit what the
// single-token launch computes for each token alone (the same walk over the same tiles), and within summation-order
// noise of the per-slot kernels it replaces; official numerics (QA8 staged, BF16 roundings).
TEST(CudaOps, Mxfp4BatchedExpertsOnTheMmaWalk) {
  const int64_t d = 4096, I = 2048;
  const int E = 12, k = 6;
  std::mt19937 g(43);
  vector<cu::DevLinear> mats;
  vector<cu::DevExpert> table;
  for (int e = 0; e < E; ++e) {
    for (int m = 0; m < 3; ++m) mats.push_back(cu::upload_linear(make_linear(WeightFormat::MXFP4, m == 2 ? d : I, m == 2 ? I : d, g)->ref));
    table.push_back(cu::make_dev_expert(mats[mats.size() - 3], mats[mats.size() - 2], mats.back()));
  }
  DBuf<cu::DevExpert> dtable(table);
  for (int n : {2, 3, 4, 7}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    vector<int32_t> sel;
    vector<float> wts;
    std::uniform_real_distribution<float> uw(0.05f, 0.4f);
    for (int t = 0; t < n; ++t) {
      vector<int32_t> ids(E);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), g);
      for (int j = 0; j < k; ++j) sel.push_back(ids[j]), wts.push_back(uw(g));
    }
    DBuf<int32_t> dsel(sel);
    DBuf<float> dwts(wts), dx(randn(static_cast<size_t>(n * d), g, 0.05f));
    cu::ExpertArgs a;
    a.table = dtable.p, a.fmt = WeightFormat::MXFP4, a.d = d, a.I = I, a.sb1 = d / 32, a.sb2 = I / 32;
    a.x = dx.p, a.n = n, a.k = k, a.sel = dsel.p, a.wts = dwts.p, a.limit = 10.0f, a.official = true;
    const size_t na = static_cast<size_t>(n * k * I), ny = static_cast<size_t>(n * k * d);
    ASSERT_TRUE(cu::expert_rows_ok(a));
    ASSERT_EQ(cu::expert_rows_per_launch(a), 2);
    // The batched launches.
    DBuf<float> act(na), y(ny);
    {
      cu::ExpertArgs b = a;
      b.act = act.p, b.qa8_x = true;
      cu::expert_rows_gate_up(b, nullptr);
      b.act_q = act.p, b.qa8_act = true, b.y = y.p;
      cu::expert_rows_down(b, nullptr);
    }
    // Each token alone on the single-token launch.
    DBuf<float> act1(na), y1(ny);
    for (int t = 0; t < n; ++t) {
      cu::ExpertArgs b = a;
      b.n = 1, b.x = dx.p + t * d, b.sel = dsel.p + t * k, b.wts = dwts.p + t * k, b.qa8_x = true;
      b.act = act1.p + t * k * I;
      ASSERT_GE(cu::expert_mma_mode_used(b, true), 1) << "the single-token MMA walk runs";
      cu::expert_gate_up(b, nullptr);
      b.act_q = b.act, b.qa8_act = true, b.y = y1.p + t * k * d;
      cu::expert_down(b, nullptr);
    }
    // The per-slot kernels of n tokens (what batched decode ran before), on QA8'd inputs as the backend feeds them.
    DBuf<float> actp(na), yp(ny), xq(static_cast<size_t>(n * d)), aq(na);
    {
      cu::qa8_rows(dx.p, n, d, xq.p, nullptr);
      cu::ExpertArgs b = a;
      b.x = xq.p, b.act = actp.p;
      cu::expert_gate_up(b, nullptr);
      cu::qa8_rows(actp.p, n * k, I, aq.p, nullptr);
      b.act_q = aq.p, b.y = yp.p;
      cu::expert_down(b, nullptr);
    }
    const auto ga = act.get(), gy = y.get(), wa = act1.get(), wy = y1.get(), pa = actp.get(), py = yp.get();
    for (float v : gy) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(std::memcmp(ga.data(), wa.data(), na * 4), 0) << "act vs each token alone: rel L2 " << cmp(ga, wa).rel;
    EXPECT_EQ(std::memcmp(gy.data(), wy.data(), ny * 4), 0) << "y vs each token alone: rel L2 " << cmp(gy, wy).rel;
    const double ea = cmp(ga, pa).rel, ey = cmp(gy, py).rel;
    std::printf("[op] batched MMA experts n=%d vs the per-slot kernels: act rel L2 %.3g, y rel L2 %.3g\n", n, ea, ey);
    EXPECT_LE(ea, 1e-2);
    EXPECT_LE(ey, 1e-2);
  }
  for (auto& m : mats) cu::free_linear(m);
}

void run_decode_experts_mma(int64_t d, int64_t I, bool shared) {
  cu::set_shared_expert_mma(shared);
  std::mt19937 g(41);
  const int E = 8, k = 6;
  vector<cu::DevLinear> d1, d2, d3;
  vector<cu::DevExpert> table;
  for (int e = 0; e < E; ++e) {
    d1.push_back(cu::upload_linear(make_linear(WeightFormat::MXFP4, I, d, g)->ref));
    d3.push_back(cu::upload_linear(make_linear(WeightFormat::MXFP4, I, d, g)->ref));
    d2.push_back(cu::upload_linear(make_linear(WeightFormat::MXFP4, d, I, g)->ref));
    table.push_back(cu::make_dev_expert(d1.back(), d3.back(), d2.back()));
  }
  cu::DevLinear S13 = cu::upload_linear(make_linear(WeightFormat::FP8_E8M0, 2 * I, d, g)->ref);
  cu::DevLinear S2 = cu::upload_linear(make_linear(WeightFormat::FP8_E8M0, d, I, g)->ref);
  DBuf<cu::DevExpert> dtable(table);
  // The experts' tile-major copies (expert_tiles.h) in a table whose row-major pointers are null: a walk on it can
  // only have read the tiles.
  vector<std::unique_ptr<DBuf<uint8_t>>> tile_bufs;
  vector<cu::DevExpert> tiled(table.size());
  for (size_t e = 0; e < table.size(); ++e) {
    tile_bufs.push_back(std::make_unique<DBuf<uint8_t>>(static_cast<size_t>(cu::tile_bytes(true, d, I))));
    tiled[e].t13 = tile_bufs.back()->p;
    tile_bufs.push_back(std::make_unique<DBuf<uint8_t>>(static_cast<size_t>(cu::tile_bytes(false, d, I))));
    tiled[e].t2 = tile_bufs.back()->p;
    cu::build_expert_tiles(table[e], WeightFormat::MXFP4, d, I, d / 32, I / 32, const_cast<void*>(tiled[e].t13),
                           const_cast<void*>(tiled[e].t2), nullptr);
  }
  DBuf<cu::DevExpert> dtiled(tiled);
  DBuf<int32_t> dsel(vector<int32_t>{5, 1, 7, 0, 3, 6});
  DBuf<float> dwts(vector<float>{0.31f, 0.22f, 0.17f, 0.13f, 0.1f, 0.07f});
  auto block_scaled = [&](size_t n, int64_t row, float sd) {  // block b of row r: x 2^((3 b + r) % 7 - 3)
    vector<float> v = randn(n, g, sd);
    for (size_t i = 0; i < n; ++i) v[i] = std::ldexp(v[i], static_cast<int>((3 * ((i % row) / 128) + i / row) % 7) - 3);
    return v;
  };
  DBuf<float> dx(block_scaled(static_cast<size_t>(d), d, 0.05f));
  DBuf<float> dact_in(block_scaled(static_cast<size_t>((k + 1) * I), I, 0.5f));  // the down walks' common input
  const int want_mode = shared ? 2 : 1;
  const std::string what = "d=" + std::to_string(d) + " I=" + std::to_string(I) + ", shared " + (shared ? "MMA" : "FMA");
  for (bool official : {false, true}) {
    SCOPED_TRACE(what + (official ? " official" : " unrounded"));
    cu::ExpertArgs a;
    a.table = dtable.p, a.fmt = WeightFormat::MXFP4, a.d = d, a.I = I, a.sb1 = d / 32, a.sb2 = I / 32;
    a.x = dx.p, a.qa8_x = true, a.n = 1, a.k = k, a.sel = dsel.p, a.wts = dwts.p, a.limit = 1e4f, a.official = official;
    a.shared13 = &S13, a.shared2 = &S2;
    cu::ExpertArgs dn = a;
    dn.act_q = dact_in.p, dn.qa8_act = true;
    const bool down_ring = cu::expert_ring_eligible(dn, false);
    if (!down_ring) a.shared13 = a.shared2 = dn.shared13 = dn.shared2 = nullptr;  // fused only where both launches are rings
    ASSERT_EQ(cu::expert_ring_shared_ok(a), down_ring);
    DBuf<float> act[2] = {DBuf<float>(static_cast<size_t>((k + 1) * I)), DBuf<float>(static_cast<size_t>((k + 1) * I))};
    DBuf<float> y[2] = {DBuf<float>(static_cast<size_t>((k + 1) * d)), DBuf<float>(static_cast<size_t>((k + 1) * d))};
    int parts = 1;
    // The E4M3 MMA walk first (the f16 walk, the default, is compared with it below).
    cu::set_expert_f16(false);
    for (int m = 0; m < 2; ++m) {  // m = 0: FMA ring walk, 1: MMA walk
      cu::set_expert_mma(m == 1);
      cu::ExpertArgs b = a;
      b.act = act[m].p;
      ASSERT_EQ(cu::expert_mma_mode_used(b, true), m == 1 ? want_mode : 0) << "the variant under test runs (gate/up)";
      if (m == 1) {
        // The K-split routed walk runs where a TP2 rank's Flash gate/up (768 tiles) leaves most warps idle: on a GPU
        // with >= 96 SMs (H100/H200: 132) two parts per tile still fit the launch's warps (16 per SM).
        int sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        parts = cu::expert_mma_parts(b, true);
        if (I == 1024 && d == 4096 && sms >= 96) {
          ASSERT_GE(parts, 2) << "the K-split routed walk runs (gate/up)";
        }
      }
      cu::expert_gate_up(b, nullptr);
      cu::ExpertArgs c = dn;
      c.act = act[m].p, c.y = y[m].p;
      if (down_ring) {
        ASSERT_EQ(cu::expert_mma_mode_used(c, false), m == 1 ? want_mode : 0) << "the variant under test runs (down)";
      }
      cu::expert_down(c, nullptr);
    }
    cu::set_expert_mma(true);
    auto part = [](const vector<float>& v, size_t from, size_t to) { return vector<float>(v.begin() + from, v.begin() + to); };
    const auto a0 = act[0].get(), a1 = act[1].get(), y0 = y[0].get(), y1 = y[1].get();
    // Both MMA launches again with a switch flipped (set(v), then back to !v): the same bits expected.
    auto same_bits_with = [&](void (*set)(bool), bool v, const char* what) {
      set(v);
      DBuf<float> act2(static_cast<size_t>((k + 1) * I)), y2(static_cast<size_t>((k + 1) * d));
      cu::ExpertArgs b = a, c = dn;
      b.act = act2.p, c.act = act2.p, c.y = y2.p;
      cu::expert_gate_up(b, nullptr);
      cu::expert_down(c, nullptr);
      set(!v);
      EXPECT_EQ(0, std::memcmp(act2.get().data(), a1.data(), a1.size() * 4)) << "gate/up: " << what;
      EXPECT_EQ(0, std::memcmp(y2.get().data(), y1.data(), y1.size() * 4)) << "down: " << what;
    };
    // Each walk staging its own input (set_expert_stage_once(false)).
    if (shared && down_ring) same_bits_with(cu::set_expert_stage_once, false, "staged once vs per walk");
    // Both walks from warp 0 up (set_expert_balance(false)): only the warp a tile runs on changes.
    same_bits_with(cu::set_expert_balance, false, "balanced vs unbalanced warps");
    // The kernel variant without the FMA walks (the default; it takes mode 2 and mode 1 without the shared expert,
    // so the MMA launches above ran it in every case here except "shared FMA" with a fused shared expert) vs the full
    // kernel (set_expert_mma_only(false)): first that the default launches do take the variant, then the same bits.
    if (shared) {
      const int64_t only0 = cu::expert_mma_only_launches();
      DBuf<float> act4(static_cast<size_t>((k + 1) * I)), y4(static_cast<size_t>((k + 1) * d));
      cu::ExpertArgs b = a, c = dn;
      b.act = act4.p, c.act = act4.p, c.y = y4.p;
      cu::expert_gate_up(b, nullptr);
      cu::expert_down(c, nullptr);
      EXPECT_GE(cu::expert_mma_only_launches() - only0, down_ring ? 2 : 1) << "the MMA-only variant ran (default)";
    }
    same_bits_with(cu::set_expert_mma_only, false, "the full kernel vs the MMA-only kernel");
    {
      // The MMA walks on the tile-major copies: the same bytes in each ring slot, so bit for bit the same outputs
      // (down only where it is a ring launch: other down kernels read the row-major weights, null here).
      DBuf<float> act3(static_cast<size_t>((k + 1) * I)), y3(static_cast<size_t>((k + 1) * d));
      cu::ExpertArgs b = a, c = dn;
      b.table = c.table = dtiled.p, b.tiles = c.tiles = true;
      b.act = act3.p, c.act = act3.p, c.y = y3.p;
      ASSERT_EQ(cu::expert_mma_mode_used(b, true), want_mode) << "tiles: the MMA walk runs (gate/up)";
      cu::expert_gate_up(b, nullptr);
      EXPECT_EQ(0, std::memcmp(act3.get().data(), a1.data(), a1.size() * 4)) << "gate/up: tile-major vs row-major";
      if (down_ring) {
        ASSERT_EQ(cu::expert_mma_mode_used(c, false), want_mode) << "tiles: the MMA walk runs (down)";
        cu::expert_down(c, nullptr);
        EXPECT_EQ(0, std::memcmp(y3.get().data(), y1.data(), y1.size() * 4)) << "down: tile-major vs row-major";
      }
    }
    const size_t kI = static_cast<size_t>(k * I), kd = static_cast<size_t>(k * d);
    {
      // The routed walk on f16 MMAs (set_expert_f16, the default; MMA-only launches): the same products, the tensor
      // core's order inside an MMA may differ, so close to the E4M3 walk (unrounded: fp32 summation order only) and to
      // the FMA walk; the shared expert's walk is the same code, the same bits. Row-major and tile-major alike.
      for (bool tiles : {false, true}) {
        if (tiles && !down_ring) continue;
        cu::set_expert_f16(true);
        const int64_t f0 = cu::expert_f16_launches();
        DBuf<float> act5(static_cast<size_t>((k + 1) * I)), y5(static_cast<size_t>((k + 1) * d));
        cu::ExpertArgs b = a, c = dn;
        if (tiles) b.table = c.table = dtiled.p, b.tiles = c.tiles = true;
        b.act = act5.p, c.act = act5.p, c.y = y5.p;
        cu::expert_gate_up(b, nullptr);
        cu::expert_down(c, nullptr);
        {
          // The once-staged inputs as one batched pass (set_expert_stage_batch, the default) vs the per-row stagings.
          cu::set_expert_stage_batch(false);
          DBuf<float> act6(static_cast<size_t>((k + 1) * I)), y6(static_cast<size_t>((k + 1) * d));
          cu::ExpertArgs b6 = b, c6 = c;
          b6.act = act6.p, c6.act = act6.p, c6.y = y6.p;
          cu::expert_gate_up(b6, nullptr);
          cu::expert_down(c6, nullptr);
          cu::set_expert_stage_batch(true);
          EXPECT_EQ(0, std::memcmp(act6.get().data(), act5.get().data(), act5.n * 4)) << "gate/up: batched vs per-row staging";
          EXPECT_EQ(0, std::memcmp(y6.get().data(), y5.get().data(), y5.n * 4)) << "down: batched vs per-row staging";
        }
        {
          // gate/up's shared walk before the wait, each warp reading the selection past it (ExpertArgs::x_early, what
          // decode steps set): the same walks and stagings in another order of waiting -- the same bits.
          DBuf<float> act7(static_cast<size_t>((k + 1) * I));
          cu::ExpertArgs b7 = b;
          b7.act = act7.p, b7.x_early = true;
          cu::expert_gate_up(b7, nullptr);
          EXPECT_EQ(0, std::memcmp(act7.get().data(), act5.get().data(), act5.n * 4)) << "gate/up: x_early vs waiting first";
        }
        cu::set_expert_f16(false);
        const bool only = shared || !down_ring;  // "shared FMA" with a fused shared expert takes the full kernel
        EXPECT_GE(cu::expert_f16_launches() - f0, only ? (down_ring ? 2 : 1) : 0) << "the f16 walk ran";
        const auto a5 = act5.get(), y5h = y5.get();
        const Stats fa = cmp(part(a5, 0, kI), part(a1, 0, kI)), fy = cmp(part(y5h, 0, kd), part(y1, 0, kd));
        const Stats fa0 = cmp(part(a5, 0, kI), part(a0, 0, kI)), fy0 = cmp(part(y5h, 0, kd), part(y0, 0, kd));
        const bool same_a = std::memcmp(a5.data(), a1.data(), kI * 4) == 0, same_y = std::memcmp(y5h.data(), y1.data(), kd * 4) == 0;
        std::printf("[op] decode experts f16 MMA walk (%s, %s%s): vs E4M3 walk gate/up %s (rel L2 %.3g), down %s (rel L2 %.3g); "
                    "vs FMA walk %.3g / %.3g\n", what.c_str(), official ? "official" : "unrounded", tiles ? ", tiles" : "",
                    same_a ? "bit-identical" : "differs", fa.rel, same_y ? "bit-identical" : "differs", fy.rel, fa0.rel, fy0.rel);
        EXPECT_LE(fa.rel, official ? 3e-3 : 1e-6);
        EXPECT_LE(fy.rel, down_ring ? (official ? 3e-3 : 1e-6) : 0.0);
        EXPECT_LE(fa0.rel, official ? 3e-3 : 1e-3);
        EXPECT_LE(fy0.rel, down_ring ? (official ? 3e-3 : 1e-3) : 0.0);
        if (down_ring) {  // the shared expert's rows: the same walk
          EXPECT_EQ(0, std::memcmp(a5.data() + kI, a1.data() + kI, static_cast<size_t>(I) * 4)) << "shared gate/up";
          EXPECT_EQ(0, std::memcmp(y5h.data() + kd, y1.data() + kd, static_cast<size_t>(d) * 4)) << "shared down";
        }
        for (float v : a5) ASSERT_TRUE(std::isfinite(v));
        for (float v : y5h) ASSERT_TRUE(std::isfinite(v));
      }
    }
    const Stats sa = cmp(part(a1, 0, kI), part(a0, 0, kI)), sy = cmp(part(y1, 0, kd), part(y0, 0, kd));
    std::printf("[op] decode experts MMA (%s) vs FMA walk (%s): gate/up act rel L2 %.3g (K in %d parts), down y rel L2 %.3g%s\n",
                what.c_str(), official ? "official" : "unrounded", sa.rel, parts, sy.rel, down_ring ? "" : " (down: not a ring launch)");
    const double tol = official ? 3e-3 : 1e-3;
    EXPECT_LE(sa.rel, tol);
    EXPECT_LE(sy.rel, down_ring ? tol : 0.0);
    for (float v : a1) ASSERT_TRUE(std::isfinite(v));
    if (down_ring) {
      const Stats ssa = cmp(part(a1, kI, kI + I), part(a0, kI, kI + I)), ssy = cmp(part(y1, kd, kd + d), part(y0, kd, kd + d));
      std::printf("[op]   shared expert (FP8, %s walk) vs FMA walk: act rel L2 %.3g, y rel L2 %.3g\n", shared ? "MMA" : "FMA",
                  ssa.rel, ssy.rel);
      EXPECT_LE(ssa.rel, shared ? tol : 0.0);
      EXPECT_LE(ssy.rel, shared ? tol : 0.0);
    }
  }
  cu::free_linear(S13), cu::free_linear(S2);
  for (int e = 0; e < E; ++e) cu::free_linear(d1[e]), cu::free_linear(d2[e]), cu::free_linear(d3[e]);
}

// A hidden size that is not a multiple of the prefill kernels' 128-row tiles (4160 = 32.5 x 128): the down
// projection's last row tile is partial (expert_tc2's clamped rows and guarded stores).
TEST(CudaOps, Mxfp4ExpertsGroupedPartialRowTile) { run_experts(40, true, 4160); }
// n = 20: ~15 slots per expert; n = 96: ~72, so some experts take two 64-slot tiles; n = 200: ~150, two 128-slot
// tiles (modes 4, 8, 9).
TEST(CudaOps, Mxfp4ExpertsGroupedPrefill) {
  run_experts(20, true);
  run_experts(96, true);
  run_experts(200, true);
  // The default's kernel choice (moe_wg_effective): expert_wb with bulk-copied activations on 128-slot tiles, m64n64
  // wgmmas on tiles of <= 64 slots.
  EXPECT_EQ(cu::moe_wg_mode(), cu::kMoeWgAuto);
  EXPECT_EQ(cu::moe_wg_effective(true, 120, 8), 13);
  EXPECT_EQ(cu::moe_wg_effective(false, 2048 * 6, 256), 13);  // a 2K chunk of Flash
  EXPECT_EQ(cu::moe_wg_effective(false, 8192 * 6, 256), 13);  // an 8K chunk
}

// expert_wg folds each weight row's four per-32 scales of a 128-column step into its f16 operands, relative to the
// step's largest (moe_wg.cuh, wg_fold): exact while they span <= 15 binades, rounded below that. Here every scale is
// drawn from 91 binades (so most steps span far more than 15) and both prefill kernels are held against expert_tc2,
// which applies each scale exactly: a wrong fold (chunk, row or exponent) shows as O(1), and the rounding of chunks
// more than 15 binades below a step's largest must stay invisible (terms below 2^-24 of it). expert_wb (moe_wb.cuh,
// modes 5 / 6) folds them exactly relative to each row's largest: scales above 128 here take its base > 1 path.
TEST(CudaOps, Mxfp4ExpertsPrefillScaleSpread) {
  std::mt19937 g(29);
  const int E = 4, k = 2, n = 200;
  const int64_t d = 512, I = 512;
  std::uniform_int_distribution<int> wide(80, 170);
  vector<std::unique_ptr<HostLinear>> hosts;
  vector<cu::DevLinear> devs;
  vector<cu::DevExpert> table;
  for (int e = 0; e < E; ++e) {
    for (int m = 0; m < 3; ++m) {  // w1, w3 [I, d]; w2 [d, I]
      hosts.push_back(make_linear(WeightFormat::MXFP4, m == 2 ? d : I, m == 2 ? I : d, g));
      for (auto& b : hosts.back()->s->bytes) b = static_cast<uint8_t>(wide(g));
      devs.push_back(cu::upload_linear(hosts.back()->ref));
    }
    table.push_back(cu::make_dev_expert(devs[3 * e], devs[3 * e + 1], devs[3 * e + 2]));
  }
  DBuf<cu::DevExpert> dtable(table);
  const vector<float> x = randn(static_cast<size_t>(n * d), g, 0.05f);
  vector<int32_t> sel(static_cast<size_t>(n * k));
  vector<float> wts(sel.size());
  std::uniform_real_distribution<float> uw(0.2f, 1.0f);
  for (int t = 0; t < n; ++t) {
    sel[t * k] = t % E;
    sel[t * k + 1] = (t % E + 1 + (t / E) % (E - 1)) % E;  // another expert
    wts[t * k] = uw(g), wts[t * k + 1] = uw(g);
  }
  DBuf<int32_t> dsel(sel), doff(static_cast<size_t>(E + 1)), dperm(sel.size());
  DBuf<float> dwts(wts);
  cu::moe_group(dsel.p, n * k, E, doff.p, dperm.p, nullptr);
  const size_t xg_bytes = cu::moe_prefill_scratch_bytes(n, k, d, I, E);
  DBuf<float> dxg(xg_bytes / 4 + 1);
  cu::ExpertArgs t;
  t.table = dtable.p, t.fmt = WeightFormat::MXFP4, t.d = d, t.I = I, t.sb1 = d / 32, t.sb2 = I / 32;
  t.n = n, t.k = k, t.sel = dsel.p, t.wts = dwts.p, t.limit = 10.0f, t.official = false, t.x_bf16_exact = true;
  t.perm = dperm.p, t.offsets = doff.p, t.E = E, t.xg = reinterpret_cast<uint16_t*>(dxg.p), t.xg_bytes = xg_bytes;
  run_experts_f8_vs_tc2(t, x, n, d, I, k);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 1);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 2);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 3);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 4);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 5);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 6);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 7);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 8);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 9);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 10);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 11);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 12);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 13);
  run_experts_f8_vs_tc2(t, x, n, d, I, k, 14);
  for (auto& l : devs) cu::free_linear(l);
}

// ---- sparse attention with sink: window + top-k (CSA) or all compressed entries (HCA), split-KV on the GPU -------
// kind 1: 128-window + 512 top-k (with -1 holes) of 512 dims, 64 heads, 3 queries; kind 2: HCA over every visible
// entry at a long context (many chunks, the last ones partly empty for the earlier queries); odd head counts exercise
// partial head groups.
// bf16_inputs: q and the KV rows are BF16 values, as official numerics make them (the tensor-core prefill path
// relies on it); prefill-sized n then also compares that path with the split-KV kernels.
void run_attention(int kind, int H, int64_t pos0, int n, int ratio, bool bf16_inputs = false) {
  std::mt19937 g(static_cast<unsigned>(3 + kind * 100 + H));
  const int W = 128, K = kind == 1 ? 512 : 0;
  const int64_t D = 512, ncomp = (pos0 + n) / ratio;
  vector<float> q = randn(static_cast<size_t>(n * H * D), g), kv = randn(static_cast<size_t>(n * D), g),
                ring = randn(static_cast<size_t>(W * D), g), comp = randn(static_cast<size_t>(ncomp * D), g),
                sink = randn(H, g);
  if (bf16_inputs)
    for (vector<float>* v : {&q, &kv, &ring, &comp}) num::round_bf16(v->data(), static_cast<int64_t>(v->size()));
  vector<int32_t> topk(static_cast<size_t>(std::max(1, n * K)), -1);
  for (int i = 0; i < n && kind == 1; ++i) {
    const int64_t vis = (pos0 + i + 1) / ratio;
    for (int j = 0; j < K; ++j) topk[i * K + j] = j % 50 == 49 ? -1 : static_cast<int32_t>((j * 7919 + i) % vis);
  }
  for (bool official : {false, true}) {
    vector<float> ref(static_cast<size_t>(n * H * D), 0.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int i = 0; i < n; ++i) {
      const int64_t t = pos0 + i;
      vector<const float*> rows;
      for (int64_t p = std::max<int64_t>(0, t - W + 1); p <= t; ++p)
        rows.push_back(p >= pos0 ? kv.data() + (p - pos0) * D : ring.data() + (p % W) * D);
      if (kind == 1)
        for (int j = 0; j < K; ++j)
          if (topk[i * K + j] >= 0) rows.push_back(comp.data() + topk[i * K + j] * D);
      if (kind == 2)
        for (int64_t c = 0; c < (t + 1) / ratio; ++c) rows.push_back(comp.data() + c * D);
      for (int h = 0; h < H; ++h) {
        const float* qh = q.data() + (i * H + h) * D;
        vector<float> s(rows.size());
        float mx = sink[h];
        for (size_t j = 0; j < rows.size(); ++j) mx = std::max(mx, s[j] = cpu::dot(qh, rows[j], D) * scale);
        double z = std::exp(static_cast<double>(sink[h] - mx));
        for (size_t j = 0; j < rows.size(); ++j) z += (s[j] = static_cast<float>(std::exp(static_cast<double>(s[j] - mx))));
        float* oh = ref.data() + (i * H + h) * D;
        for (size_t j = 0; j < rows.size(); ++j) {
          float p = static_cast<float>(s[j] / z);
          if (official) p = num::decode_bf16(num::encode_bf16(p));
          for (int64_t e = 0; e < D; ++e) oh[e] += p * rows[j][e];
        }
        if (official) num::round_bf16(oh, D);
      }
    }
    DBuf<float> dq(q), dkv(kv), dring(ring), dcomp(comp), dsink(sink), dout(ref.size());
    DBuf<int32_t> dtopk(topk), derr(1);
    cu::fill_f32(dout.p, static_cast<int64_t>(ref.size()), std::nanf(""), nullptr);  // poison: every output written
    cu::AttendArgs a;
    a.q = dq.p, a.kv = dkv.p, a.ring = dring.p, a.comp = dcomp.p, a.topk = dtopk.p, a.sink = dsink.p;
    a.n = n, a.H = H, a.window = W, a.topk_k = K, a.ratio = ratio, a.kind = kind, a.D = D, a.pos0 = pos0, a.n_comp = ncomp;
    a.official = official;
    a.max_rows = cu::attend_max_rows(W, kind, K, pos0 + n, ratio);
    a.err = derr.p;
    const bool was_on = cu::prefill_gemm_enabled(), wg_was_on = cu::attend_wg_enabled();
    cu::set_prefill_gemm(true);  // whatever DSV4_PREFILL_GEMM / DSV4_ATTEND_WG say: this test is about every path
    cu::set_attend_wg(true);
    // Room for every path taken below: the wgmma kernel's row copy, the split-KV / attend_tc scratch.
    DBuf<float> scr(static_cast<size_t>(std::max(cu::attend_scratch_floats(a), cu::attend_scratch_floats(n, H, D, a.max_rows))));
    a.scratch = scr.p, a.o = dout.p;
    cu::attend(a, nullptr);
    const bool tc = cu::attend_uses_tc(a);
    EXPECT_EQ(tc, official && n >= cu::kGemmMinTokens) << "official prefill chunks take the tensor-core kernels";
    const std::string what = std::string("attention ") + std::to_string(H) + "h " + (kind == 1 ? "win+topk" : "win+HCA") +
                             " n=" + std::to_string(n) + (tc ? " (tensor cores)" : "");
    expect_close(dout.get(), ref, official, what.c_str());
    EXPECT_EQ(derr.get()[0], 0);
    if (n == 1) {
      // A single token may take the one-launch cluster kernel (attend_cluster.cuh; the default at >= 64 heads where
      // 16-block clusters fit -- an H200: checked below): each cluster size and the
      // three split-KV launches against the CPU, and against each other: the same function up to the summation order
      // of Z (double) and of the chunks' partial outputs, so only last-bit and rare BF16 rounding differences -- and
      // none where the split kernels cut at most 8 chunks (the sliding window's 128 rows: 8 of 16), which the
      // cluster's blocks then take one each.
      int sms = 0;
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
      if (sms >= 132) {
        EXPECT_EQ(cu::attend_cluster_size(D, H), H >= 64 ? 16 : 0) << "the automatic choice on an H100/H200";
      }
      vector<float> split;
      for (int size : {0, 8, 16}) {
        cu::set_attend_cluster(size);
        ASSERT_EQ(cu::attend_cluster_size(D, H), size);
        DBuf<float> d2(ref.size());
        cu::fill_f32(d2.p, static_cast<int64_t>(ref.size()), std::nanf(""), nullptr);
        a.o = d2.p;
        cu::attend(a, nullptr);
        const vector<float> got = d2.get();
        const std::string w2 = what + (size ? " cluster " + std::to_string(size) : std::string(" split-KV"));
        expect_close(got, ref, official, w2.c_str());
        if (size == 0) {
          split = got;
          continue;
        }
        const Stats st = cmp(got, split);
        size_t same = 0;
        for (size_t e = 0; e < got.size(); ++e) same += got[e] == split[e];
        std::printf("[op] %s vs split-KV: rel L2 %.3g, bit-identical %.2f%%\n", w2.c_str(), st.rel,
                    100.0 * static_cast<double>(same) / static_cast<double>(got.size()));
        EXPECT_LE(st.rel, official ? 2e-3 : 1e-5) << w2;
        if (kind == 0) {
          EXPECT_EQ(same, got.size()) << w2 << ": the split kernels' chunks, the same values";
        }
        if (size == 16) {  // 8 (the default) and 16 heads per block: every head's arithmetic unchanged, the same bits
          const int was = cu::attend_heads();
          for (const int other : {8, 16}) {
            if (other == was) continue;
            cu::set_attend_heads(other);
            cu::fill_f32(d2.p, static_cast<int64_t>(ref.size()), std::nanf(""), nullptr);
            cu::attend(a, nullptr);
            const vector<float> got8 = d2.get();
            cu::set_attend_heads(was);
            const bool same_bits = std::memcmp(got8.data(), got.data(), got.size() * sizeof(float)) == 0;
            EXPECT_TRUE(same_bits) << w2 << ": " << other << " vs " << was << " heads per block";
            std::printf("[op] %s, %d vs %d heads per block: %s (16-block clusters resident at once: %d)\n", w2.c_str(), was,
                        other, same_bits ? "the same bits" : "DIFFERENT", cu::attend_cluster16_max_active());
          }
        }
      }
      cu::set_attend_cluster(-1);
      a.o = dout.p;
      EXPECT_EQ(derr.get()[0], 0);
    }
    if (tc) {
      // attend_tc.cuh's mma.sync kernels (DSV4_ATTEND_WG=0) vs the CPU, and the default wgmma kernel vs them.
      DBuf<float> dold(ref.size());
      cu::fill_f32(dold.p, static_cast<int64_t>(ref.size()), std::nanf(""), nullptr);
      cu::set_attend_wg(false);
      a.o = dold.p;
      cu::attend(a, nullptr);
      cu::set_attend_wg(true);
      const auto old_tc = dold.get();
      expect_close(old_tc, ref, official, (what + " (attend_tc mma.sync)").c_str());
      {
        const auto got = dout.get();
        const Stats st = cmp(got, old_tc);
        size_t same = 0;
        for (size_t e = 0; e < got.size(); ++e) same += got[e] == old_tc[e];
        std::printf("[op] attention wgmma vs mma.sync n=%d: rel L2 %.3g, bit-identical %.2f%%\n", n, st.rel,
                    100.0 * static_cast<double>(same) / static_cast<double>(got.size()));
        EXPECT_LE(st.rel, 1e-3);
      }
      // attn_out's inverse RoPE fused into the wgmma kernel's epilogue: o bit for bit norm_rope(inverse) of the
      // unfused o, at every query's position.
      {
        ASSERT_TRUE(cu::attend_derope_fusable(a));
        const int R = 64;
        vector<float> inv(R / 2);
        for (int k2 = 0; k2 < R / 2; ++k2) inv[k2] = 1.0f / std::pow(10000.0f, 2.0f * k2 / R);
        DBuf<float> dinv(inv), want_d(ref.size()), o_d(ref.size());
        cu::NormRopeArgs nr;
        nr.x = dout.p, nr.y = want_d.p, nr.rows = n * H, nr.rows_per_token = H, nr.len = D, nr.do_norm = false;
        nr.rope_dim = R, nr.inv_freq = dinv.p, nr.pos0 = pos0, nr.inverse = true, nr.official = official;
        cu::norm_rope(nr, nullptr);
        cu::AttendArgs b = a;
        b.o = o_d.p, b.derope_inv_freq = dinv.p, b.derope_dim = R;
        cu::fill_f32(o_d.p, static_cast<int64_t>(ref.size()), std::nanf(""), nullptr);
        cu::attend(b, nullptr);
        const vector<float> wd = want_d.get(), gd = o_d.get();
        EXPECT_EQ(std::memcmp(gd.data(), wd.data(), wd.size() * sizeof(float)), 0) << what << " + derope";
        EXPECT_NE(std::memcmp(wd.data(), dout.get().data(), wd.size() * sizeof(float)), 0) << what << ": the RoPE changed nothing";
      }
      // The split-KV kernels on the same inputs: the same function up to fp32 summation order, so only rare BF16
      // rounding flips (of p or of the output) may differ.
      DBuf<float> dsplit(ref.size());
      cu::set_prefill_gemm(false);
      a.o = dsplit.p;
      ASSERT_FALSE(cu::attend_uses_tc(a));
      cu::attend(a, nullptr);
      const auto got = dout.get(), split = dsplit.get();
      const Stats st = cmp(got, split);
      size_t same = 0;
      for (size_t e = 0; e < got.size(); ++e) same += got[e] == split[e];
      const double frac_same = static_cast<double>(same) / static_cast<double>(got.size());
      std::printf("[op] attention tensor cores vs split-KV n=%d: rel L2 %.3g, bit-identical %.2f%%\n", n, st.rel, 100 * frac_same);
      EXPECT_LE(st.rel, 1e-3);
      EXPECT_GE(frac_same, 0.98);  // the rest: BF16 rounding flips of p or o (CPU emulation of the kernels: ~0.1 %)
    }
    cu::set_prefill_gemm(was_on);
    cu::set_attend_wg(wg_was_on);
  }
}

TEST(CudaOps, AttentionWindowPlusTopk) { run_attention(1, 64, 4093, 3, 4); }
// Single-token decode (the decode step's attention) vs the CPU: CSA at a long position, HCA at a long context (828
// rows, ~50 chunks: the merge's 8-chunk batches and its remainder), partial head groups (20 heads), TP2's 32 heads,
// and a first token (one row).
TEST(CudaOps, AttentionDecodeOneToken) {
  run_attention(1, 64, 4093, 1, 4);
  run_attention(0, 64, 8191, 1, 4);  // sliding window only (V4-Flash's first layers)
  run_attention(2, 64, 128 * 700 - 1, 1, 128);
  run_attention(1, 20, 1000, 1, 4);
  run_attention(1, 32, 8191, 1, 4);
  run_attention(2, 64, 0, 1, 128);
}
// Prefill chunks in official numerics: all heads of a query per block on the tensor cores (attend_tc.cuh).
// Batched decode attention (attend_batch: every row's single token in one launch of the cluster kernel, grid.z = rows)
// vs attend() of each row alone: o and the fused window store bit for bit, with the fused inverse RoPE, official and
// reference, eager (host positions) and graph mode (device positions, capacity-sized scratch), for each layer kind:
// 4 rows of 4 sequences (own q, kv, ring, cache, top-k) at positions 5 / 130 / 3001 / 8191.
TEST(CudaOps, AttentionBatchMatchesOneLaunchPerRow) {
  const int H = 64, W = 128, K = 512, R = 64, n = 4;
  const int64_t D = 512, cap_ctx = 8192;
  const int64_t pos[n] = {5, 130, 3001, 8191};
  ASSERT_GT(cu::attend_cluster_size(D, H), 0) << "the batched launch needs the cluster kernel (an H100/H200 has it)";
  vector<float> inv(R / 2);
  for (int k2 = 0; k2 < R / 2; ++k2) inv[k2] = 1.0f / std::pow(10000.0f, 2.0f * k2 / R);
  DBuf<float> dinv(inv);
  for (int kind : {0, 1, 2}) {
    const int ratio = kind == 2 ? 128 : 4;
    std::mt19937 g(static_cast<unsigned>(41 + kind));
    vector<vector<float>> q(n), kv(n), ring(n), comp(n);
    vector<vector<int32_t>> topk(n);
    for (int i = 0; i < n; ++i) {
      const int64_t ncomp = (pos[i] + 1) / ratio;
      q[i] = randn(static_cast<size_t>(H * D), g), kv[i] = randn(static_cast<size_t>(D), g);
      ring[i] = randn(static_cast<size_t>(W * D), g), comp[i] = randn(static_cast<size_t>(std::max<int64_t>(1, ncomp) * D), g);
      for (auto* v : {&q[i], &kv[i], &ring[i], &comp[i]}) num::round_bf16(v->data(), static_cast<int64_t>(v->size()));
      topk[i].assign(K, -1);
      for (int j = 0; j < K && ncomp > 0; ++j) topk[i][j] = j % 50 == 49 ? -1 : static_cast<int32_t>((j * 7919 + i) % ncomp);
    }
    vector<float> sink = randn(H, g);
    DBuf<float> dsink(sink);
    DBuf<int32_t> derr(1);
    for (bool official : {false, true})
      for (bool graph : {false, true}) {
        const std::string what = std::string("attention batch kind ") + std::to_string(kind) + (official ? " official" : " reference") +
                                 (graph ? " graph" : " eager");
        vector<float> out[2][n], rings[2][n];
        for (int batched = 0; batched < 2; ++batched) {
          vector<std::unique_ptr<DBuf<float>>> keep;
          auto up = [&](const vector<float>& h) { keep.push_back(std::make_unique<DBuf<float>>(h)); return keep.back()->p; };
          vector<std::unique_ptr<DBuf<int32_t>>> keep_i;
          vector<int64_t> hpos(pos, pos + n);
          DBuf<int64_t> dpos(hpos);
          cu::AttendArgs a[n];
          cu::AttendBatch b;
          b.n = n;
          vector<float*> o(n), rg(n);
          for (int i = 0; i < n; ++i) {
            keep_i.push_back(std::make_unique<DBuf<int32_t>>(topk[i]));
            cu::AttendArgs& x = a[i];
            x.q = up(q[i]), x.kv = up(kv[i]), rg[i] = up(ring[i]), x.ring = rg[i], x.comp = up(comp[i]);
            x.topk = kind == 1 ? keep_i.back()->p : nullptr, x.sink = dsink.p;
            x.n = 1, x.H = H, x.window = W, x.topk_k = kind == 1 ? K : 0, x.ratio = ratio, x.kind = kind, x.D = D;
            x.pos0 = graph ? 0 : pos[i], x.n_comp = graph ? 0 : (pos[i] + 1) / ratio, x.official = official;
            x.dpos = graph ? dpos.p + i : nullptr;
            x.max_rows = cu::attend_max_rows(W, kind, x.topk_k, graph ? cap_ctx : pos[i] + 1, ratio);
            x.scratch = up(vector<float>(static_cast<size_t>(cu::attend_scratch_floats(x)), 0.0f));
            o[i] = up(vector<float>(static_cast<size_t>(H * D), std::nanf("")));
            x.o = o[i], x.err = derr.p, x.store_ring = rg[i], x.derope_inv_freq = dinv.p, x.derope_dim = R;
            ASSERT_TRUE(cu::attend_batch_ok(x));
            cu::AttendRow& r = b.r[i];
            r.q = x.q, r.kv = x.kv, r.ring = x.ring, r.comp = x.comp, r.topk = x.topk, r.o = x.o, r.store_ring = rg[i];
            r.scratch = x.scratch, r.pos0 = x.pos0, r.n_comp = x.n_comp, r.max_rows = x.max_rows, r.dpos = x.dpos;
          }
          if (batched) cu::attend_batch(a[0], b, nullptr);
          else
            for (int i = 0; i < n; ++i) cu::attend(a[i], nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          for (int i = 0; i < n; ++i) {
            out[batched][i].resize(static_cast<size_t>(H * D)), rings[batched][i].resize(static_cast<size_t>(W * D));
            cudaMemcpy(out[batched][i].data(), o[i], out[batched][i].size() * 4, cudaMemcpyDeviceToHost);
            cudaMemcpy(rings[batched][i].data(), rg[i], rings[batched][i].size() * 4, cudaMemcpyDeviceToHost);
          }
        }
        for (int i = 0; i < n; ++i) {
          for (float v : out[1][i]) ASSERT_TRUE(std::isfinite(v)) << what << " row " << i << ": an output was not written";
          EXPECT_EQ(std::memcmp(out[1][i].data(), out[0][i].data(), out[0][i].size() * 4), 0)
              << what << " row " << i << ": rel L2 " << cmp(out[1][i], out[0][i]).rel;
          EXPECT_EQ(std::memcmp(rings[1][i].data(), rings[0][i].data(), rings[0][i].size() * 4), 0) << what << " row " << i << " ring";
          EXPECT_NE(std::memcmp(rings[1][i].data(), ring[i].data(), ring[i].size() * 4), 0) << what << " row " << i << ": nothing stored";
        }
        EXPECT_EQ(derr.get()[0], 0) << what;
      }
  }
}

TEST(CudaOps, AttentionPrefillTensorCores) {
  run_attention(1, 64, 4093, 24, 4, true);
  run_attention(2, 64, 128 * 70 - 2, 20, 128, true);
  run_attention(2, 20, 128 * 40 + 5, 17, 128, true);  // partial head tiles
  run_attention(2, 64, 0, 40, 128, true);             // a prompt's first chunk: short windows, one partial tile
  run_attention(1, 64, 3, 24, 4, true);
  run_attention(1, 32, 8191, 20, 4, true);  // a TP2 rank's heads
}
TEST(CudaOps, AttentionHcaLongContext) {
  run_attention(2, 64, 128 * 700 - 2, 2, 128);
  run_attention(2, 20, 128 * 40 + 5, 3, 128);
}

// ---- decode attention with the window store fused into its merge kernel (AttendArgs::store_ring) ------------------
// The fused launch must leave exactly what attend + window_store leave: o and the ring compared bit for bit, eager
// (position from the arguments) and in graph mode (position from a device scalar, chunking launched for a larger
// capacity, so some chunks are empty), the graph replayed with o poisoned and the ring reset before every replay.
void run_attend_store(int kind, int H, int64_t pos0, int ratio) {
  std::mt19937 g(static_cast<unsigned>(11 + kind * 100 + H));
  const int W = 128, K = kind == 1 ? 512 : 0;
  const int64_t D = 512, cap = pos0 + 1000, ncomp = kind == 0 ? 0 : (pos0 + 1) / ratio;
  const vector<float> q = randn(static_cast<size_t>(H * D), g), kv = randn(static_cast<size_t>(D), g),
                      ring = randn(static_cast<size_t>(W * D), g), comp = randn(static_cast<size_t>(ncomp * D), g),
                      sink = randn(H, g);
  vector<int32_t> topk(static_cast<size_t>(std::max(1, K)), -1);
  for (int j = 0; j < K; ++j) topk[j] = j % 50 == 49 ? -1 : static_cast<int32_t>((j * 7919) % ncomp);
  DBuf<float> dq(q), dkv(kv), dring0(ring), dcomp(comp), dsink(sink);
  DBuf<int32_t> dtopk(topk), derr(1);
  DBuf<int64_t> dpos(vector<int64_t>{pos0});
  cudaStream_t s = nullptr;
  DSV4_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // The split kernels (cluster 0) and the one-launch cluster kernel (16; attend_cluster.cuh), each against itself.
  for (int cluster : {0, 16})
  for (bool official : {false, true})
    for (bool graph : {false, true}) {
      cu::set_attend_cluster(cluster);
      const std::string what = std::string("attend+store ") + std::to_string(H) + "h kind " + std::to_string(kind) +
                               " pos " + std::to_string(pos0) + (official ? " official" : " reference") +
                               (graph ? " graph" : " eager") + (cluster ? " cluster 16" : "");
      cu::AttendArgs a;
      a.q = dq.p, a.kv = dkv.p, a.comp = dcomp.p, a.topk = dtopk.p, a.sink = dsink.p;
      a.n = 1, a.H = H, a.window = W, a.topk_k = K, a.ratio = ratio, a.kind = kind, a.D = D, a.pos0 = pos0, a.n_comp = ncomp;
      a.official = official, a.err = derr.p, a.dpos = graph ? dpos.p : nullptr;
      a.max_rows = cu::attend_max_rows(W, kind, K, graph ? cap : pos0 + 1, ratio);
      DBuf<float> scr(static_cast<size_t>(cu::attend_scratch_floats(1, H, D, a.max_rows)));
      a.scratch = scr.p;
      // Today's two kernels' worth: attention, then the store.
      DBuf<float> ring_ref(ring), o_ref(static_cast<size_t>(H * D));
      DSV4_CU(cudaDeviceSynchronize());
      a.ring = ring_ref.p, a.o = o_ref.p;
      cu::attend(a, s);
      cu::window_store(dkv.p, 1, pos0, W, D, ring_ref.p, s, a.dpos);
      const vector<float> want_o = o_ref.get(), want_ring = ring_ref.get();
      ASSERT_EQ(std::memcmp(want_ring.data() + (pos0 % W) * D, kv.data(), D * sizeof(float)), 0) << what;
      // (The slot written holds position pos0 - W, outside this step's window, so o cannot show a store that came
      // too early; the ordering rests on the merge kernel's pdl_wait after pv and scores: see attend_merge_kernel.)
      // Fused.
      DBuf<float> ring_f(ring.size()), o_f(static_cast<size_t>(H * D));
      DSV4_CU(cudaDeviceSynchronize());  // their zeroing ran on the legacy stream; s does not wait for it
      a.ring = ring_f.p, a.store_ring = ring_f.p, a.o = o_f.p;
      cudaGraphExec_t exec = nullptr;
      if (graph) {
        cudaGraph_t gr = nullptr;
        DSV4_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        cu::attend(a, s);
        DSV4_CU(cudaStreamEndCapture(s, &gr));
        DSV4_CU(cudaGraphInstantiate(&exec, gr, 0));
        DSV4_CU(cudaGraphDestroy(gr));
      }
      for (int rep = 0; rep < 3; ++rep) {
        DSV4_CU(cudaMemcpyAsync(ring_f.p, dring0.p, ring.size() * sizeof(float), cudaMemcpyDeviceToDevice, s));
        cu::fill_f32(o_f.p, H * D, std::nanf(""), s);  // poison: every output rewritten
        if (graph) DSV4_CU(cudaGraphLaunch(exec, s));
        else cu::attend(a, s);
        const vector<float> got_o = o_f.get(), got_ring = ring_f.get();
        EXPECT_EQ(std::memcmp(got_o.data(), want_o.data(), want_o.size() * sizeof(float)), 0) << what << " rep " << rep;
        EXPECT_EQ(std::memcmp(got_ring.data(), want_ring.data(), want_ring.size() * sizeof(float)), 0) << what << " rep " << rep;
      }
      if (exec) DSV4_CU(cudaGraphExecDestroy(exec));
      {
        // The rows requested before griddepcontrol.wait (AttendArgs::rows_before_wait; the cluster kernel acts on
        // it, the split kernels ignore it): the same bits, after a kernel that writes the query on the same stream.
        cu::AttendArgs c = a;
        c.rows_before_wait = true;
        DBuf<float> qe(q.size());
        DSV4_CU(cudaMemcpyAsync(ring_f.p, dring0.p, ring.size() * sizeof(float), cudaMemcpyDeviceToDevice, s));
        cu::fill_f32(o_f.p, H * D, std::nanf(""), s);
        cu::fill_f32(qe.p, H * D, std::nanf(""), s);
        cu::NormRopeArgs cp;  // a PDL predecessor that writes q over the NaNs (a plain copy: no norm, no RoPE)
        cp.x = dq.p, cp.y = qe.p, cp.rows = H, cp.rows_per_token = H, cp.len = D, cp.do_norm = false;
        cu::norm_rope(cp, s);
        c.q = qe.p;
        cu::attend(c, s);
        const vector<float> got_o = o_f.get(), got_ring = ring_f.get();
        EXPECT_EQ(std::memcmp(got_o.data(), want_o.data(), want_o.size() * sizeof(float)), 0) << what << " rows before wait";
        EXPECT_EQ(std::memcmp(got_ring.data(), want_ring.data(), want_ring.size() * sizeof(float)), 0) << what << " rows before wait";
      }
      // And with attn_out's inverse RoPE fused too: o bit for bit norm_rope(inverse) of the unfused o.
      {
        const int R = 64;
        vector<float> inv(R / 2);
        for (int i = 0; i < R / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / R);
        DBuf<float> dinv(inv), want_d(static_cast<size_t>(H * D)), o_d(static_cast<size_t>(H * D)), ring_d(ring);
        DSV4_CU(cudaDeviceSynchronize());
        cu::NormRopeArgs nr;
        nr.x = o_ref.p, nr.y = want_d.p, nr.rows = H, nr.rows_per_token = H, nr.len = D, nr.do_norm = false;
        nr.rope_dim = R, nr.inv_freq = dinv.p, nr.pos0 = pos0, nr.inverse = true, nr.official = official, nr.dpos = a.dpos;
        cu::norm_rope(nr, s);
        cu::AttendArgs b = a;
        b.ring = ring_d.p, b.store_ring = ring_d.p, b.o = o_d.p, b.derope_inv_freq = dinv.p, b.derope_dim = R;
        cu::fill_f32(o_d.p, H * D, std::nanf(""), s);
        cu::attend(b, s);
        const vector<float> wd = want_d.get(), gd = o_d.get();
        EXPECT_EQ(std::memcmp(gd.data(), wd.data(), wd.size() * sizeof(float)), 0) << what << " + derope";
        EXPECT_NE(std::memcmp(wd.data(), want_o.data(), wd.size() * sizeof(float)), 0) << what << ": the RoPE changed nothing";
      }
      EXPECT_EQ(derr.get()[0], 0) << what;
      std::printf("[op] %s: o and ring bit-identical to attend + window_store (+ inverse RoPE)\n", what.c_str());
    }
  cu::set_attend_cluster(-1);
  DSV4_CU(cudaStreamDestroy(s));
}

// Flash: CSA (64 heads, TP2's 32), HCA, SWA; odd: a partial head group at a short window with no compressed entry.
TEST(CudaOps, AttentionDecodeFusedWindowStore) {
  run_attend_store(1, 64, 4093, 4);
  run_attend_store(1, 32, 4093, 4);
  run_attend_store(2, 64, 128 * 70 - 2, 128);
  run_attend_store(0, 64, 300, 1);
  run_attend_store(2, 20, 5, 128);
}

// ---- MoE slot sum: the routed slots, then the shared expert, in double (the CPU's sum), [official] BF16 ------------
// Against that sum formed here, bit for bit (a double sum of <= 10 of these floats is exact, so what this catches is
// a slot missed, read twice or from the wrong row, the shared row, the rounding -- not the order): k = 6 (Flash / Pro:
// every load issued before the sums), k = 9 (more slots than one batch of loads: the loop), k = 1, with and without a
// shared row, decode (1 token) and 5 tokens.
TEST(CudaOps, MoeReduceSumsEverySlot) {
  std::mt19937 g(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t d = 4096;
  for (const int k : {6, 9, 1})
    for (const int n : {1, 5})
      for (const bool shared : {true, false})
        for (const bool official : {false, true}) {
          vector<float> y(static_cast<size_t>(n) * k * d), ys(static_cast<size_t>(n) * d);
          for (auto& v : y) v = nd(g) * 1e3f;
          for (auto& v : ys) v = nd(g);
          vector<float> want(static_cast<size_t>(n) * d);
          for (int t = 0; t < n; ++t)
            for (int64_t j = 0; j < d; ++j) {
              double acc = 0.0;
              for (int sl = 0; sl < k; ++sl) acc += y[(static_cast<size_t>(t) * k + sl) * d + j];
              if (shared) acc += ys[static_cast<size_t>(t) * d + j];
              want[static_cast<size_t>(t) * d + j] = static_cast<float>(acc);
            }
          if (official) num::round_bf16(want.data(), static_cast<int64_t>(want.size()));
          DBuf<float> dy(y), dys(ys), dout(want.size());
          cu::moe_reduce(dy.p, shared ? dys.p : nullptr, n, k, d, official, dout.p, nullptr);
          const auto got = dout.get();
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4))
              << "k " << k << " n " << n << (shared ? " shared" : "") << (official ? " official" : "");
        }
}

// The GPU top-k's expected row for the CPU rule's ranked indices (score descending, lower index first on ties; -1
// padding): the same list when the GPU ranks (DSV4_TOPK_RANKED=1), else the same set in ascending index order.
vector<int32_t> topk_expected(vector<int32_t> ranked) {
  if (cu::topk_ranked()) return ranked;
  const auto end = std::find(ranked.begin(), ranked.end(), -1);
  std::sort(ranked.begin(), end);
  return ranked;
}
// Runs f() with the top-k unranked (the default) and ranked.
template <typename F>
void for_topk_modes(F f) {
  const bool was = cu::topk_ranked();
  for (const bool ranked : {false, true}) {
    cu::set_topk_ranked(ranked);
    f(ranked);
  }
  cu::set_topk_ranked(was);
}

// ---- top-k alone: the exact set (ties: the lower indices) and order against the CPU rule ---------------------------
// Scores drawn from few distinct values force long tie runs across the k boundary (all three radix passes and the
// tie cut); distinct values stop the select early; rows longer than the shared-memory cache take the uncached path;
// rows of exactly k and shorter than k (padded with -1). Each case runs as 2 rows (decode: ranked, the ordering split
// over blocks) and as 6 rows (one block per row), unranked (ascending index order) and ranked (the CPU's order).
TEST(CudaOps, TopkExactTies) {
  for_topk_modes([](bool ranked) {
    SCOPED_TRACE(ranked ? "ranked" : "unranked");
    std::mt19937 g(77);
    struct Case {
      int64_t ld;
      int k, distinct;  // distinct 0: normal floats; -1: normal floats rounded to BF16 (official scores: ties of both
                        // signs, the low key bits constant per sign, so the top-k skips its last radix pass)
    };
    for (const Case c : {Case{2048, 512, -1}, Case{4096, 512, -1}, Case{70000, 512, -1}, Case{2048, 512, 0}, Case{2048, 512, 7}, Case{2048, 512, 1}, Case{2049, 512, 3}, Case{4096, 512, 7},
                         Case{4096, 512, 100000}, Case{8192, 512, 0}, Case{70000, 512, 13}, Case{70000, 512, 0},
                         Case{513, 512, 4}, Case{513, 512, 0}, Case{300, 512, 5}, Case{5000, 4, 3}, Case{3000, 2048, 0}})
      for (const int n : {2, 6}) {
        const int ratio = 4;
        const int64_t pos0 = c.ld * ratio - n;  // query n-1 sees all ld entries, query n-2 one fewer (ld 513: k)
        std::uniform_int_distribution<int> pick(0, std::max(c.distinct - 1, 0));
        std::normal_distribution<float> nd(0.0f, 3.0f);
        vector<float> sc(static_cast<size_t>(n * c.ld));
        for (auto& v : sc) {
          if (c.distinct <= 0) {
            v = nd(g);
            if (c.distinct < 0) num::round_bf16(&v, 1);
            continue;
          }
          const int p = pick(g);
          v = p == 0 ? -0.0f : static_cast<float>(p - c.distinct / 2) * 0.37f;  // includes -0.0 (equal to +0.0)
        }
        DBuf<float> dsc(sc);
        DBuf<int32_t> dtop(static_cast<size_t>(n * c.k));
        DSV4_CU(cudaMemset(dtop.p, 0x55, dtop.n * sizeof(int32_t)));  // every slot must be written
        cu::topk_rows(dsc.p, n, c.ld, pos0, ratio, c.k, dtop.p, nullptr);
        auto got = dtop.get();
        for (int i = 0; i < n; ++i) {
          const int64_t V = std::min<int64_t>((pos0 + i + 1) / ratio, c.ld);
          vector<int32_t> order(static_cast<size_t>(V));
          std::iota(order.begin(), order.end(), 0);
          const float* s = sc.data() + i * c.ld;
          const int64_t kk = std::min<int64_t>(V, c.k);
          std::partial_sort(order.begin(), order.begin() + kk, order.end(),
                            [&](int a, int b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
          vector<int32_t> want(order.begin(), order.begin() + kk);
          want.resize(static_cast<size_t>(c.k), -1);
          want = topk_expected(want);
          vector<int32_t> gi(got.begin() + i * c.k, got.begin() + (i + 1) * c.k);
          EXPECT_EQ(gi, want) << "top-" << c.k << " of " << V << " (" << c.distinct << " distinct values), " << n
                              << " rows, query " << i;
        }
      }
  });
}

// ---- lightning indexer: 64 heads x 128 dims over 2048 (8K context) and 4096 keys, top-512 ------------------------
// n tokens (prefill kernel) against the CPU; the last token alone (decode kernel) must give the same bits. Official
// keys are FP4-grid values, as the model caches them (Hadamard + MXFP4 simulation). A prefill-sized n in official
// numerics takes the wgmma kernel (indexer_wg.cuh), which must also give the FMA kernel's bits.
void run_indexer(int64_t nkeys, int n = 2) {
  std::mt19937 g(9);
  const int Hi = 64, K = 512, ratio = 4, R = 64;
  const int64_t Di = 128, pos0 = nkeys * 4 - n;
  vector<float> inv(R / 2);
  for (int i = 0; i < R / 2; ++i) inv[i] = 1.0f / std::pow(160000.0f, 2.0f * i / R);
  vector<float> q0 = randn(static_cast<size_t>(n * Hi * Di), g), wts = randn(static_cast<size_t>(n * Hi), g),
                keys0 = randn(static_cast<size_t>(nkeys * Di), g);
  for (bool official : {false, true}) {
    vector<float> q = q0, w = wts, keys = keys0;
    if (official) num::round_bf16(w.data(), static_cast<int64_t>(w.size()));
    if (official)
      for (int64_t kk = 0; kk < nkeys; ++kk) num::fp4_sim(keys.data() + kk * Di, Di);
    const int64_t ld = (pos0 + n) / ratio;
    vector<float> ref(static_cast<size_t>(n * ld), -std::numeric_limits<float>::infinity());
    for (int i = 0; i < n; ++i) {
      const int64_t t = pos0 + i;
      for (int h = 0; h < Hi; ++h) {
        float* qh = q.data() + (i * Hi + h) * Di;
        for (int p = 0; p < R / 2; ++p) {
          float ang = static_cast<float>(t) * inv[p], c = std::cos(ang), s = std::sin(ang);
          float a = qh[Di - R + 2 * p], b = qh[Di - R + 2 * p + 1];
          qh[Di - R + 2 * p] = a * c - b * s;
          qh[Di - R + 2 * p + 1] = a * s + b * c;
        }
        if (official) {
          num::round_bf16(qh, Di);
          num::hadamard(qh, static_cast<int>(Di));
          num::round_bf16(qh, Di);
          num::fp4_sim(qh, Di);
        }
      }
      const int64_t vis = (t + 1) / ratio;
      for (int64_t kk = 0; kk < vis; ++kk) {
        double s = 0;
        for (int h = 0; h < Hi; ++h) {
          float dd = cpu::dot(q.data() + (i * Hi + h) * Di, keys.data() + kk * Di, Di);
          if (dd > 0) s += static_cast<double>(dd) * (1.0f / std::sqrt(128.0f)) * (w[i * Hi + h] * (1.0f / 8.0f));
        }
        float sf = static_cast<float>(s);
        ref[i * ld + kk] = official ? num::decode_bf16(num::encode_bf16(sf)) : sf;
      }
    }
    DBuf<float> dq(q0), dw(w), dk(keys), dinv(inv), dsc(ref.size());
    DBuf<int32_t> dtop(static_cast<size_t>(n * K));
    cu::indexer_q_prep(dq.p, n, Hi, Di, R, dinv.p, pos0, official, nullptr);
    auto qg = dq.get();
    expect_close(qg, q, official, "indexer q prep (rope/hadamard/sim4)");
    if (n * Hi >= 256) {  // the chunk took the warp-per-row kernel: one token at a time (the block kernel), same bits
      DBuf<float> dq1(q0);
      for (int i = 0; i < n; ++i) cu::indexer_q_prep(dq1.p + i * Hi * Di, 1, Hi, Di, R, dinv.p, pos0 + i, official, nullptr);
      const auto q1 = dq1.get();
      EXPECT_EQ(std::memcmp(q1.data(), qg.data(), qg.size() * sizeof(float)), 0) << "indexer q prep: warp vs block kernel";
      // Both warp kernels (rows in registers, DSV4_INDEXER_Q_REG, and in shared memory) against the block kernel.
      const bool was = cu::indexer_q_reg();
      cu::set_indexer_q_reg(!was);
      DBuf<float> dq2(q0);
      cu::indexer_q_prep(dq2.p, n, Hi, Di, R, dinv.p, pos0, official, nullptr);
      cu::set_indexer_q_reg(was);
      const auto q2 = dq2.get();
      EXPECT_EQ(std::memcmp(q1.data(), q2.data(), q2.size() * sizeof(float)), 0)
          << "indexer q prep: the other warp kernel (DSV4_INDEXER_Q_REG toggled) vs the block kernel";
    }
    const bool wg = cu::indexer_uses_wg(n, Hi, Di, official, nullptr);
    EXPECT_EQ(wg, official && n >= cu::kGemmMinTokens && cu::prefill_gemm_enabled()) << "official prefill: the wgmma kernel";
    cu::indexer_scores(dq.p, dw.p, dk.p, n, Hi, Di, pos0, ratio, nkeys, official, dsc.p, ld, nullptr);
    cu::topk_rows(dsc.p, n, ld, pos0, ratio, K, dtop.p, nullptr);
    auto sg = dsc.get();
    if (wg) {  // the FMA kernel on the same inputs: the same bits
      DBuf<float> dv2(ref.size());
      cu::set_indexer_wg(false);
      cu::indexer_scores(dq.p, dw.p, dk.p, n, Hi, Di, pos0, ratio, nkeys, official, dv2.p, ld, nullptr);
      cu::set_indexer_wg(true);
      const auto v2 = dv2.get();
      size_t same = 0;
      for (size_t e = 0; e < v2.size(); ++e) same += std::memcmp(&v2[e], &sg[e], sizeof(float)) == 0;
      EXPECT_EQ(same, v2.size()) << "indexer wgmma vs FMA kernel, " << nkeys << " keys, n " << n;
      std::printf("[op] indexer wgmma vs FMA kernel n=%d, %lld keys: %zu of %zu scores bit-identical\n", n,
                  static_cast<long long>(nkeys), same, v2.size());
    }
    vector<float> fin_g, fin_r;
    for (size_t i = 0; i < ref.size(); ++i)
      if (std::isfinite(ref[i])) fin_g.push_back(sg[i]), fin_r.push_back(ref[i]);
    expect_close(fin_g, fin_r, official, "indexer scores 64x128 over 4096 keys");
    // Top-k: the GPU's set must be exactly the top-k of its own scores, and overlap the CPU's set (score ties at the
    // boundary may legitimately differ after BF16 rounding of order-dependent sums).
    auto tg = dtop.get();
    for (int i = 0; i < n; ++i) {
      vector<int32_t> order(static_cast<size_t>(ld));
      std::iota(order.begin(), order.end(), 0);
      const float* s = ref.data() + i * ld;
      std::partial_sort(order.begin(), order.begin() + K, order.end(),
                        [&](int a, int b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
      std::set<int32_t> want(order.begin(), order.begin() + K), got(tg.begin() + i * K, tg.begin() + (i + 1) * K);
      size_t common = 0;
      for (int32_t v : got) common += want.count(v);
      EXPECT_GE(common, static_cast<size_t>(0.98 * K)) << "top-k overlap, query " << i;
      const float* sgi = sg.data() + i * ld;
      for (int j = 1; j < K; ++j)
        if (cu::topk_ranked()) EXPECT_GE(sgi[tg[i * K + j - 1]], sgi[tg[i * K + j]]) << "top-k order (ranked)";
        else EXPECT_LT(tg[i * K + j - 1], tg[i * K + j]) << "top-k order (ascending indices)";
    }
    // Decode: the last token alone (KEYS = 16 blocks) reproduces its prefill row and top-k exactly.
    DBuf<float> dsc1(static_cast<size_t>(ld));
    DBuf<int32_t> dtop1(static_cast<size_t>(K));
    const int last = n - 1;
    cu::indexer_scores(dq.p + last * Hi * Di, dw.p + last * Hi, dk.p, 1, Hi, Di, pos0 + last, ratio, nkeys, official,
                       dsc1.p, ld, nullptr);
    cu::topk_rows(dsc1.p, 1, ld, pos0 + last, ratio, K, dtop1.p, nullptr);
    auto s1 = dsc1.get();
    auto t1 = dtop1.get();
    EXPECT_EQ(0, std::memcmp(s1.data(), sg.data() + last * ld, static_cast<size_t>(ld) * sizeof(float)))
        << "decode scores differ from prefill's, " << nkeys << " keys";
    EXPECT_TRUE(std::equal(t1.begin(), t1.end(), tg.begin() + last * K)) << "decode top-k differs from prefill's";
  }
}
TEST(CudaOps, IndexerScoresAndTopk) {
  run_indexer(2048);
  run_indexer(4096);
  cu::set_topk_ranked(true);  // the CPU's order (A/B switch)
  run_indexer(2048);
  cu::set_topk_ranked(false);
}
// The single-token indexer as one launch (indexer_topk_fused) against indexer_scores + topk_rows: the same score bits
// for every visible key and the same top-k, at Flash's 64 x 128 over 2048 keys (8K context) and over 4096 keys of a
// longer score row (a graph step's whole capacity), a row shorter than k (-1 padding), a row longer than the top-k's
// shared-memory cache (the uncached path, ~4,400 scoring blocks), both numerics. A quarter of the key rows repeat
// others, so equal scores straddle the k-th place (the tie rule). Each case runs three times eagerly and three
// times as a replayed graph with the position read from the device (the counters must come back to zero each
// time), after a kernel that writes the queries (a PDL predecessor).
TEST(CudaOps, IndexerTopkFused) {
  std::mt19937 g(123);
  const int Hi = 64, K = 512, ratio = 4;
  const int64_t Di = 128;
  struct Case {
    int64_t nkeys, ld, pos;  // keys in the cache, the score row's length, the query position
  };
  cudaStream_t s = nullptr;
  DSV4_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DBuf<int> counters(3);
  for (const Case c : {Case{2048, 2048, 8191}, Case{4096, 8192, 16383}, Case{4096, 8192, 1203}, Case{70000, 70000, 279999},
                       Case{300, 2048, 1202}})
    for (bool official : {false, true})
     for (const bool ranked : {false, true}) {  // unranked (one top-k block) and ranked (kTopkSplit blocks)
      cu::set_topk_ranked(ranked);
      const std::string what = std::to_string(c.nkeys) + " keys, row " + std::to_string(c.ld) + ", position " +
                               std::to_string(c.pos) + (official ? ", official" : ", reference") +
                               (ranked ? ", ranked" : ", unranked");
      vector<float> q = randn(static_cast<size_t>(Hi * Di), g), w = randn(static_cast<size_t>(Hi), g),
                    keys = randn(static_cast<size_t>(c.nkeys * Di), g);
      std::uniform_int_distribution<int64_t> pick(0, c.nkeys - 1);
      for (int64_t r = 0; r < c.nkeys / 4; ++r) {
        const int64_t a = pick(g), b = pick(g);
        std::copy(keys.begin() + a * Di, keys.begin() + (a + 1) * Di, keys.begin() + b * Di);
      }
      if (official) num::round_bf16(w.data(), Hi);
      const int64_t V = std::min<int64_t>({(c.pos + 1) / ratio, c.ld, c.nkeys});
      ASSERT_EQ(V, std::min<int64_t>((c.pos + 1) / ratio, c.ld)) << what << ": the case needs every visible key cached";
      DBuf<float> dq(q), dw(w), dk(keys), want_sc(static_cast<size_t>(c.ld)), got_sc(static_cast<size_t>(c.ld));
      DBuf<int32_t> want_top(K), got_top(K);
      DBuf<int64_t> dpos(vector<int64_t>{c.pos});
      cu::indexer_scores(dq.p, dw.p, dk.p, 1, Hi, Di, c.pos, ratio, c.nkeys, official, want_sc.p, c.ld, nullptr);
      cu::topk_rows(want_sc.p, 1, c.ld, c.pos, ratio, K, want_top.p, nullptr);
      const auto ws = want_sc.get();
      const auto wt = want_top.get();
      ASSERT_TRUE(cu::indexer_topk_fused_ok(Hi, Di, K));
      cu::IndexerTopkArgs a;
      a.q = dq.p, a.wts = dw.p, a.keys = dk.p, a.heads = Hi, a.Di = Di, a.pos0 = c.pos, a.ratio = ratio;
      a.n_keys = c.nkeys, a.official = official, a.scores = got_sc.p, a.ld = c.ld, a.k = K, a.topk = got_top.p;
      a.counters = counters.p;
      DBuf<float> qe(q.size());  // the PDL predecessor's output: the queries the fused kernel reads
      cu::NormRopeArgs cp;  // a plain copy (no norm, no RoPE)
      cp.x = dq.p, cp.y = qe.p, cp.rows = Hi, cp.rows_per_token = Hi, cp.len = Di, cp.do_norm = false;
      for (int graph = 0; graph < 2; ++graph) {
        cu::IndexerTopkArgs b = a;
        b.q = qe.p;
        if (graph) b.dpos = dpos.p, b.pos0 = 0, b.n_keys = 0;  // both from the device position (graph mode)
        cudaGraphExec_t exec = nullptr;
        if (graph) {
          cudaGraph_t gr = nullptr;
          DSV4_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          cu::norm_rope(cp, s);
          cu::indexer_topk_fused(b, s);
          DSV4_CU(cudaStreamEndCapture(s, &gr));
          DSV4_CU(cudaGraphInstantiate(&exec, gr, 0));
          DSV4_CU(cudaGraphDestroy(gr));
        }
        for (int rep = 0; rep < 3; ++rep) {
          cu::fill_f32(qe.p, Hi * Di, std::nanf(""), s);
          cu::fill_f32(got_sc.p, c.ld, std::nanf(""), s);  // poison: every visible score rewritten
          DSV4_CU(cudaMemsetAsync(got_top.p, 0x55, K * sizeof(int32_t), s));  // and every top-k slot
          if (graph) {
            DSV4_CU(cudaGraphLaunch(exec, s));
          } else {
            cu::norm_rope(cp, s);
            cu::indexer_topk_fused(b, s);
          }
          DSV4_CU(cudaStreamSynchronize(s));
          const auto gs = got_sc.get();
          const auto gt = got_top.get();
          const auto cnt = counters.get();
          const std::string where = what + (graph ? ", graph" : ", eager") + " rep " + std::to_string(rep);
          EXPECT_EQ(std::memcmp(gs.data(), ws.data(), static_cast<size_t>(V) * sizeof(float)), 0) << where << ": scores";
          EXPECT_EQ(gt, wt) << where << ": top-k";
          EXPECT_EQ(cnt, (vector<int>{0, 0, 0})) << where << ": the counters are left zero";
        }
        if (exec) DSV4_CU(cudaGraphExecDestroy(exec));
      }
      // The top-k really is the CPU rule's on these scores (ties included), so the comparison above is not vacuous.
      vector<int32_t> order(static_cast<size_t>(V));
      std::iota(order.begin(), order.end(), 0);
      const int64_t kk = std::min<int64_t>(V, K);
      std::partial_sort(order.begin(), order.begin() + kk, order.end(),
                        [&](int x, int y) { return ws[x] > ws[y] || (ws[x] == ws[y] && x < y); });
      vector<int32_t> rule(order.begin(), order.begin() + kk);
      rule.resize(K, -1);
      EXPECT_EQ(wt, topk_expected(rule)) << what << ": topk_rows vs the CPU rule";
    }
  cu::set_topk_ranked(false);
  cu::IndexerTopkArgs bad;
  bad.heads = 32, bad.Di = 128, bad.k = 512, bad.ld = 2048, bad.counters = counters.p;
  EXPECT_ANY_THROW(cu::indexer_topk_fused(bad, s)) << "32 heads";
  bad.heads = 64, bad.counters = nullptr;
  EXPECT_ANY_THROW(cu::indexer_topk_fused(bad, s)) << "no counters";
  DSV4_CU(cudaStreamDestroy(s));
}

// Prefill chunks (official: the wgmma kernel): a chunk not a multiple of the kernel's 4 queries, keys not a multiple
// of its 64-key tiles; the CPU, the FMA kernel's bits, decode's bits.
TEST(CudaOps, IndexerScoresPrefillChunk) {
  const bool was_on = cu::prefill_gemm_enabled();
  cu::set_prefill_gemm(true);
  run_indexer(2048, 37);
  run_indexer(1000, 18);
  cu::set_prefill_gemm(was_on);
}

// ---- mHC pre (Sinkhorn + collapse + RMSNorm) and post ----------------------------------------------------------
// The CPU twins (cpu_backend.cpp's math written out). Pre: x [n, d], post [n, hc], comb [n, hc, hc] from X [n, hc, d].
struct MhcPreRef {
  vector<float> x, post, comb;
};
MhcPreRef mhc_pre_ref(const vector<float>& X, int n, int hc, int64_t d, const vector<float>& fn, const vector<float>& base,
                      const vector<float>& scale, const vector<float>& nw, int iters, float eps, bool official) {
  const int mixn = (2 + hc) * hc;
  auto sig = [](float v) { return 1.0f / (1.0f + std::exp(-v)); };
  MhcPreRef r{vector<float>(static_cast<size_t>(n * d)), vector<float>(static_cast<size_t>(n * hc)),
              vector<float>(static_cast<size_t>(n * hc * hc))};
  for (int t = 0; t < n; ++t) {
    const float* Xt = X.data() + t * hc * d;
    double ss = 0;
    for (int64_t j = 0; j < hc * d; ++j) ss += static_cast<double>(Xt[j]) * Xt[j];
    float rs = static_cast<float>(1.0 / std::sqrt(ss / (hc * d) + 1e-6));
    vector<float> mix(mixn), pre(hc);
    for (int i = 0; i < mixn; ++i) mix[i] = cpu::dot(fn.data() + i * hc * d, Xt, hc * d) * rs;
    for (int s = 0; s < hc; ++s) pre[s] = sig(mix[s] * scale[0] + base[s]) + eps;
    for (int s = 0; s < hc; ++s) r.post[t * hc + s] = 2.0f * sig(mix[hc + s] * scale[1] + base[hc + s]);
    float* C = r.comb.data() + t * hc * hc;
    for (int j = 0; j < hc; ++j) {
      vector<float> row(hc);
      float mx = -INFINITY, sum = 0;
      for (int k = 0; k < hc; ++k) mx = std::max(mx, row[k] = mix[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]);
      for (int k = 0; k < hc; ++k) sum += (row[k] = std::exp(row[k] - mx));
      for (int k = 0; k < hc; ++k) C[j * hc + k] = row[k] / sum + eps;
    }
    for (int it = 0; it < iters; ++it) {
      if (it)
        for (int j = 0; j < hc; ++j) {
          float s = 0;
          for (int k = 0; k < hc; ++k) s += C[j * hc + k];
          for (int k = 0; k < hc; ++k) C[j * hc + k] /= (s + eps);
        }
      for (int k = 0; k < hc; ++k) {
        float s = 0;
        for (int j = 0; j < hc; ++j) s += C[j * hc + k];
        for (int j = 0; j < hc; ++j) C[j * hc + k] /= (s + eps);
      }
    }
    vector<float> xin(d, 0.0f);
    for (int s = 0; s < hc; ++s)
      for (int64_t j = 0; j < d; ++j) xin[j] += pre[s] * Xt[s * d + j];
    if (official) num::round_bf16(xin.data(), d);
    cpu::rms_norm(xin.data(), d, nw.data(), 1e-6, r.x.data() + t * d);
    if (official) num::round_bf16(r.x.data() + t * d, d);
  }
  return r;
}
// Post: X_k = post_k * y + sum_i comb[i, k] X_i.
vector<float> mhc_post_ref(const vector<float>& X, const vector<float>& y, const vector<float>& post,
                           const vector<float>& comb, int n, int hc, int64_t d, bool official) {
  vector<float> Xr = X;
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < hc; ++k)
      for (int64_t j = 0; j < d; ++j) {
        float v = post[t * hc + k] * y[t * d + j];
        for (int i = 0; i < hc; ++i) v += comb[t * hc * hc + i * hc + k] * X[(t * hc + i) * d + j];
        Xr[(t * hc + k) * d + j] = official ? num::decode_bf16(num::encode_bf16(v)) : v;
      }
  return Xr;
}

// Random weights of one mHC pre site: fn [mix, hc*d], base [mix], scale [3], norm weight [d].
struct MhcSite {
  vector<float> fn, base, scale, nw;
  MhcSite(std::mt19937& g, int hc, int64_t d) {
    const int mixn = (2 + hc) * hc;
    fn = randn(static_cast<size_t>(mixn * hc * d), g, 0.01f), base = randn(mixn, g, 0.1f), scale = randn(3, g, 0.5f);
    nw = randn(d, g, 0.1f);
    for (auto& v : nw) v += 1.0f;
  }
};

TEST(CudaOps, MhcPrePost) {
  std::mt19937 g(21);
  const int hc = 4, n = 3, iters = 20;
  const int64_t d = 4096;
  const float eps = 1e-6f;
  const vector<float> X = randn(static_cast<size_t>(n * hc * d), g);
  const MhcSite w(g, hc, d);
  const vector<float> y = randn(static_cast<size_t>(n * d), g);
  for (bool official : {false, true}) {
    const MhcPreRef ref = mhc_pre_ref(X, n, hc, d, w.fn, w.base, w.scale, w.nw, iters, eps, official);
    DBuf<float> dX(X), dfn(w.fn), dbase(w.base), dscale(w.scale), dnw(w.nw), dx(ref.x.size()), dpost(ref.post.size()),
        dcomb(ref.comb.size());
    cu::HcPreArgs a;
    a.X = dX.p, a.n = n, a.hc = hc, a.d = d, a.fn = dfn.p, a.base = dbase.p, a.scale = dscale.p, a.norm_w = dnw.p;
    a.hc_eps = eps, a.rms_eps = 1e-6, a.sinkhorn_iters = iters, a.official = official, a.x = dx.p, a.post = dpost.p,
    a.comb = dcomb.p;
    DBuf<float> dpart(static_cast<size_t>(cu::hc_pre_scratch_floats(n, hc, d)));
    a.partial = dpart.p;
    cu::hc_pre(a, nullptr);
    expect_close(dx.get(), ref.x, official, "mhc pre x (hc=4, d=4096)");
    expect_close(dpost.get(), ref.post, false, "mhc pre post");
    expect_close(dcomb.get(), ref.comb, false, "mhc pre comb (sinkhorn)");
    DBuf<float> dy(y), dpost2(ref.post), dcomb2(ref.comb);
    cu::hc_post(dy.p, dpost2.p, dcomb2.p, n, hc, d, official, dX.p, nullptr);
    expect_close(dX.get(), mhc_post_ref(X, y, ref.post, ref.comb, n, hc, d, official), official, "mhc post (hc=4, d=4096)");
  }
}

// Deferred Sinkhorn (decode): a pre that leaves comb's logits and posts that form comb from them (hc_post_pre's mix
// kernel, hc_post) against the same chain with the Sinkhorn in the pre: bit-identical streams, x and post, at both
// models' widths; the comb buffer between pre and post must differ (it holds logits: the deferral really happened).
TEST(CudaOps, MhcDeferredSinkhorn) {
  const int hc = 4, iters = 20, n = 1;
  const float eps = 1e-6f;
  for (int64_t d : {int64_t{4096}, int64_t{7168}}) {
    std::mt19937 g(static_cast<unsigned>(d + 5));
    const MhcSite first(g, hc, d), second(g, hc, d);
    const vector<float> X = randn(static_cast<size_t>(hc * d), g), y1 = randn(static_cast<size_t>(d), g),
                        y2 = randn(static_cast<size_t>(d), g);
    for (bool official : {false, true}) {
      SCOPED_TRACE(testing::Message() << "d=" << d << (official ? " official" : " reference"));
      struct Out {
        vector<float> comb_mid, x, post, X;
      };
      auto run = [&](bool defer) {
        DBuf<float> dX(X), dx(static_cast<size_t>(d)), dpost(hc), dcomb(hc * hc), dy1(y1), dy2(y2);
        DBuf<float> f1(first.fn), b1(first.base), s1(first.scale), n1(first.nw), f2(second.fn), b2(second.base),
            s2(second.scale), n2(second.nw);
        DBuf<float> dpart(static_cast<size_t>(cu::hc_pre_scratch_floats(n, hc, d)));
        auto args = [&](const DBuf<float>& fn, const DBuf<float>& base, const DBuf<float>& scale, const DBuf<float>& nw) {
          cu::HcPreArgs a;
          a.X = dX.p, a.n = n, a.hc = hc, a.d = d, a.fn = fn.p, a.base = base.p, a.scale = scale.p, a.norm_w = nw.p;
          a.hc_eps = eps, a.rms_eps = 1e-6, a.sinkhorn_iters = iters, a.official = official, a.x = dx.p;
          a.post = dpost.p, a.comb = dcomb.p, a.partial = dpart.p, a.comb_logits = defer;
          return a;
        };
        cu::HcCombIn ci;
        if (defer) ci.sinkhorn_iters = iters, ci.eps = eps;
        cu::hc_pre(args(f1, b1, s1, n1), nullptr);
        Out o;
        o.comb_mid = dcomb.get();
        cu::hc_post_pre(dy1.p, dpost.p, dcomb.p, dX.p, args(f2, b2, s2, n2), nullptr, ci);
        o.x = dx.get(), o.post = dpost.get();
        cu::hc_post(dy2.p, dpost.p, dcomb.p, n, hc, d, official, dX.p, nullptr, ci);
        o.X = dX.get();
        return o;
      };
      const Out base = run(false), deferred = run(true);
      EXPECT_NE(std::memcmp(base.comb_mid.data(), deferred.comb_mid.data(), base.comb_mid.size() * 4), 0)
          << "the pre left the same comb: nothing was deferred";
      EXPECT_EQ(std::memcmp(base.x.data(), deferred.x.data(), base.x.size() * 4), 0) << "second pre's x";
      EXPECT_EQ(std::memcmp(base.post.data(), deferred.post.data(), base.post.size() * 4), 0) << "second pre's post";
      EXPECT_EQ(std::memcmp(base.X.data(), deferred.X.data(), base.X.size() * 4), 0) << "streams after both posts";
    }
  }
}

// The outputs of an mHC post and the pre after it, compared bit for bit with another path's (vs: that path).
struct MhcOut {
  vector<float> X, x, post, comb;
};
void expect_same_mhc(const MhcOut& got, const MhcOut& want, const std::string& vs) {
  const std::pair<const char*, std::pair<const vector<float>*, const vector<float>*>> parts[] = {
      {"X", {&got.X, &want.X}}, {"x", {&got.x, &want.x}}, {"post", {&got.post, &want.post}}, {"comb", {&got.comb, &want.comb}}};
  for (const auto& [name, ab] : parts) {
    ASSERT_EQ(ab.first->size(), ab.second->size()) << name;
    EXPECT_EQ(std::memcmp(ab.first->data(), ab.second->data(), ab.first->size() * sizeof(float)), 0)
        << name << " differs from " << vs;
  }
}

// hc_post_pre (the post fused into the next pre's mix kernel) against hc_post then hc_pre: bit-identical streams and
// pre outputs, at both models' widths, for a decode step and a prefill chunk; and against the CPU twins. post/comb
// come from an earlier pre (realistic values) and are read and overwritten in place, as the forward does.
TEST(CudaOps, MhcPostPreFused) {
  const int hc = 4, iters = 20;
  const float eps = 1e-6f;
  for (int64_t d : {int64_t{4096}, int64_t{7168}})
    for (int n : {1, 37, 100}) {  // 100: prefill (>= 64 tokens): hc_post + hc_pre, the Sinkhorns one thread per token
      std::mt19937 g(static_cast<unsigned>(d + n));
      const MhcSite prev(g, hc, d), next(g, hc, d);
      const vector<float> X = randn(static_cast<size_t>(n * hc * d), g), y = randn(static_cast<size_t>(n * d), g);
      for (bool official : {false, true}) {
        SCOPED_TRACE(testing::Message() << "d=" << d << " n=" << n << (official ? " official" : " reference"));
        const MhcPreRef in = mhc_pre_ref(X, n, hc, d, prev.fn, prev.base, prev.scale, prev.nw, iters, eps, official);
        DBuf<float> dfn(next.fn), dbase(next.base), dscale(next.scale), dnw(next.nw), dy(y);
        using Out = MhcOut;
        auto run = [&](bool fused) {
          DBuf<float> dX(X), dx(static_cast<size_t>(n * d)), dpost(in.post), dcomb(in.comb);
          DBuf<float> dpart(static_cast<size_t>(cu::hc_pre_scratch_floats(n, hc, d)));
          cu::HcPreArgs a;
          a.X = dX.p, a.n = n, a.hc = hc, a.d = d, a.fn = dfn.p, a.base = dbase.p, a.scale = dscale.p, a.norm_w = dnw.p;
          a.hc_eps = eps, a.rms_eps = 1e-6, a.sinkhorn_iters = iters, a.official = official, a.x = dx.p,
          a.post = dpost.p, a.comb = dcomb.p, a.partial = dpart.p;
          if (fused) {
            cu::hc_post_pre(dy.p, dpost.p, dcomb.p, dX.p, a, nullptr);
          } else {
            cu::hc_post(dy.p, dpost.p, dcomb.p, n, hc, d, official, dX.p, nullptr);
            cu::hc_pre(a, nullptr);
          }
          return Out{dX.get(), dx.get(), dpost.get(), dcomb.get()};
        };
        const Out split = run(false), fused = run(true);
        expect_same_mhc(fused, split, "hc_post + hc_pre");
        // CPU twins: the post from the same inputs, the pre from the streams the GPU wrote (so that a last-bit BF16
        // difference in the post is not counted twice).
        expect_close(fused.X, mhc_post_ref(X, y, in.post, in.comb, n, hc, d, official), official, "mhc fused post X");
        const MhcPreRef out = mhc_pre_ref(fused.X, n, hc, d, next.fn, next.base, next.scale, next.nw, iters, eps, official);
        expect_close(fused.x, out.x, official, "mhc fused pre x");
        expect_close(fused.post, out.post, false, "mhc fused pre post");
        expect_close(fused.comb, out.comb, false, "mhc fused pre comb");
      }
    }
}

// The router's extra block finishing a deferred comb (RouterArgs::comb; the decode step's FFN comb): a one-token pre
// that leaves comb's logits, then the router with comb, must leave exactly the comb of a pre that ran the Sinkhorn
// itself, and the same selection and weights as the router alone. Hash routing too (tid2eid), at Flash's widths.
// A one-token pre's comb both ways (Flash's width, hc 4, 20 Sinkhorn iterations, eps 1e-6): `final` as a pre with its
// own Sinkhorn leaves it, `logits` as a deferring pre (HcPreArgs::comb_logits) does.
struct DeferredCombCase {
  vector<float> final, logits;
};
DeferredCombCase deferred_comb_case(bool official, unsigned seed) {
  const int hc = 4;
  const int64_t d = 4096;
  std::mt19937 g(seed);
  const MhcSite site(g, hc, d);
  const vector<float> X = randn(static_cast<size_t>(hc * d), g);
  DBuf<float> dX(X), dfn(site.fn), dbase(site.base), dscale(site.scale), dnw(site.nw);
  auto pre = [&](bool logits_only) {
    DBuf<float> dx(static_cast<size_t>(d)), dpost(hc), dcomb(hc * hc);
    DBuf<float> dpart(static_cast<size_t>(cu::hc_pre_scratch_floats(1, hc, d)));
    cu::HcPreArgs a;
    a.X = dX.p, a.n = 1, a.hc = hc, a.d = d, a.fn = dfn.p, a.base = dbase.p, a.scale = dscale.p, a.norm_w = dnw.p;
    a.hc_eps = 1e-6f, a.rms_eps = 1e-6, a.sinkhorn_iters = 20, a.official = official, a.x = dx.p;
    a.post = dpost.p, a.comb = dcomb.p, a.partial = dpart.p, a.comb_logits = logits_only;
    cu::hc_pre(a, nullptr);
    return dcomb.get();
  };
  DeferredCombCase c{pre(false), pre(true)};
  EXPECT_NE(std::memcmp(c.final.data(), c.logits.data(), c.final.size() * 4), 0) << "the pre left the final comb: nothing deferred";
  return c;
}

TEST(CudaOps, RouterFinalizesDeferredComb) {
  const int iters = 20, E = 256, k = 6;
  const float eps = 1e-6f;
  std::mt19937 g(83);
  const vector<float> logits = randn(E, g);
  vector<int32_t> tid2eid(static_cast<size_t>(50) * k), ids{17};
  for (size_t i = 0; i < tid2eid.size(); ++i) tid2eid[i] = static_cast<int32_t>((i * 37) % E);
  DBuf<float> dlog(logits);
  DBuf<int32_t> dt2e(tid2eid), dids(ids);
  for (bool hash : {false, true})
    for (bool official : {false, true}) {
      SCOPED_TRACE(testing::Message() << (hash ? "hash" : "score") << (official ? " official" : " reference"));
      const DeferredCombCase cc = deferred_comb_case(official, 84);
      const vector<float>&want = cc.final, &lg = cc.logits;
      auto route = [&](float* comb, vector<int32_t>& sel, vector<float>& wts) {
        DBuf<float> dwts(static_cast<size_t>(k));
        DBuf<int32_t> dsel(static_cast<size_t>(k));
        cu::RouterArgs r;
        r.logits = dlog.p, r.n = 1, r.E = E, r.k = k, r.func = 0, r.norm_topk = true, r.scaling = 1.5f;
        if (hash) r.tid2eid = dt2e.p, r.ids = dids.p;
        r.sel = dsel.p, r.wts = dwts.p;
        if (comb) r.comb = cu::DeferredComb{comb, eps, iters};
        cu::router(r, nullptr);
        sel = dsel.get(), wts = dwts.get();
      };
      DBuf<float> dcomb(lg);
      vector<int32_t> sel0, sel1;
      vector<float> w0, w1;
      route(nullptr, sel0, w0);
      route(dcomb.p, sel1, w1);
      EXPECT_EQ(std::memcmp(dcomb.get().data(), want.data(), want.size() * 4), 0) << "comb after the router";
      EXPECT_EQ(sel0, sel1);
      EXPECT_EQ(std::memcmp(w0.data(), w1.data(), w0.size() * 4), 0) << "routing weights";
    }
}

// hc_post_pre summing the MoE's expert rows itself (MoeSlots: the decode step's moe_post_pre) against moe_reduce into
// y and then hc_post_pre reading y: bit-identical streams and pre outputs at both models' widths, for one token (the
// deferred Sinkhorn too) and a batched step's rows, with and without a shared expert row. The expert rows are large
// and of mixed sign so that a dropped, repeated or reordered slot changes the sum's bits.
TEST(CudaOps, MhcPostPreSumsMoeSlots) {
  const int hc = 4, iters = 20, k = 6;
  const float eps = 1e-6f;
  for (int64_t d : {int64_t{4096}, int64_t{7168}})
    for (int n : {1, 5})
      for (bool defer : {false, true}) {
        if (defer && n != 1) continue;
        std::mt19937 g(static_cast<unsigned>(d + 3 * n + defer));
        const MhcSite prev(g, hc, d), next(g, hc, d);
        const vector<float> X = randn(static_cast<size_t>(n * hc * d), g);
        vector<float> ye = randn(static_cast<size_t>(n) * k * d, g), ys = randn(static_cast<size_t>(n * d), g);
        for (auto& v : ye) v *= 300.0f;
        for (bool shared : {true, false})
          for (bool official : {false, true}) {
            SCOPED_TRACE(testing::Message() << "d=" << d << " n=" << n << (defer ? " deferred" : "") << (shared ? " shared" : "")
                                            << (official ? " official" : " reference"));
            const MhcPreRef in = mhc_pre_ref(X, n, hc, d, prev.fn, prev.base, prev.scale, prev.nw, iters, eps, official);
            DBuf<float> dfn(next.fn), dbase(next.base), dscale(next.scale), dnw(next.nw), dye(ye), dys(ys);
            using Out = MhcOut;
            auto run = [&](bool slots) {
              DBuf<float> dX(X), dx(static_cast<size_t>(n * d)), dpost(in.post), dcomb(in.comb), dy(static_cast<size_t>(n * d));
              DBuf<float> dpart(static_cast<size_t>(cu::hc_pre_scratch_floats(n, hc, d)));
              cu::HcPreArgs a;
              a.X = dX.p, a.n = n, a.hc = hc, a.d = d, a.fn = dfn.p, a.base = dbase.p, a.scale = dscale.p, a.norm_w = dnw.p;
              a.hc_eps = eps, a.rms_eps = 1e-6, a.sinkhorn_iters = iters, a.official = official, a.x = dx.p,
              a.post = dpost.p, a.comb = dcomb.p, a.partial = dpart.p;
              cu::HcCombIn ci;
              if (defer) ci.sinkhorn_iters = iters, ci.eps = eps;  // comb then holds an earlier pre's logits: fine for both
              EXPECT_TRUE(cu::hc_post_pre_sums_slots(a, ci));
              if (slots) {
                cu::fill_f32(dy.p, n * d, std::nanf(""), nullptr);  // y must not be read
                cu::hc_post_pre(dy.p, dpost.p, dcomb.p, dX.p, a, nullptr, ci, cu::MoeSlots{dye.p, shared ? dys.p : nullptr, k});
              } else {
                cu::moe_reduce(dye.p, shared ? dys.p : nullptr, n, k, d, official, dy.p, nullptr);
                cu::hc_post_pre(dy.p, dpost.p, dcomb.p, dX.p, a, nullptr, ci);
              }
              return Out{dX.get(), dx.get(), dpost.get(), dcomb.get()};
            };
            const Out reduced = run(false), summed = run(true);
            expect_same_mhc(summed, reduced, "moe_reduce + hc_post_pre");
          }
      }
  // Where the post does not sum slots (a prefill-sized chunk), passing them is an error, not a silent y read.
  cu::HcPreArgs a;
  a.n = 100, a.hc = hc, a.d = 4096;
  EXPECT_FALSE(cu::hc_post_pre_sums_slots(a, cu::HcCombIn{}));
  DBuf<float> dummy(static_cast<size_t>(16));
  EXPECT_ANY_THROW(cu::hc_post_pre(dummy.p, dummy.p, dummy.p, nullptr, a, nullptr, cu::HcCombIn{}, cu::MoeSlots{dummy.p, nullptr, 6}));
}

// A prefill-sized pre (>= 64 tokens: comb's Sinkhorns one thread per token, hc_sinkhorn_rows_kernel) against the same
// tokens in a small pre (warp 0 of each token's finish block runs the Sinkhorn): bit-identical x, post and comb.
TEST(CudaOps, MhcRowSinkhornMatchesWarp) {
  const int hc = 4, iters = 20, n = 100, few = 5;
  const int64_t d = 4096;
  std::mt19937 g(77);
  const MhcSite w(g, hc, d);
  const vector<float> X = randn(static_cast<size_t>(n * hc * d), g);
  for (bool official : {false, true}) {
    auto run = [&](int rows) {
      DBuf<float> dX(vector<float>(X.begin(), X.begin() + static_cast<int64_t>(rows) * hc * d)), dfn(w.fn),
          dbase(w.base), dscale(w.scale), dnw(w.nw), dx(static_cast<size_t>(rows * d)), dpost(static_cast<size_t>(rows * hc)),
          dcomb(static_cast<size_t>(rows * hc * hc)), dpart(static_cast<size_t>(cu::hc_pre_scratch_floats(rows, hc, d)));
      cu::HcPreArgs a;
      a.X = dX.p, a.n = rows, a.hc = hc, a.d = d, a.fn = dfn.p, a.base = dbase.p, a.scale = dscale.p, a.norm_w = dnw.p;
      a.hc_eps = 1e-6f, a.rms_eps = 1e-6, a.sinkhorn_iters = iters, a.official = official, a.x = dx.p, a.post = dpost.p,
      a.comb = dcomb.p, a.partial = dpart.p;
      cu::hc_pre(a, nullptr);
      return std::array<vector<float>, 3>{dx.get(), dpost.get(), dcomb.get()};
    };
    const auto big = run(n), small = run(few);
    const char* what[3] = {"x", "post", "comb"};
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(0, std::memcmp(big[i].data(), small[i].data(), small[i].size() * 4))
          << what[i] << (official ? " (official)" : " (reference)") << ": row Sinkhorns differ from the warp's";
    // The mix kernel with several tokens per barrier step (DSV4_HC_MIX_T): the same bits, also for a token count
    // that leaves a partial last step in a block (n = 100 = 3 x 32 + 4, and 5 tokens).
    const bool was = cu::hc_mix_t();
    cu::set_hc_mix_t(!was);
    const auto big_t = run(n), small_t = run(few);
    cu::set_hc_mix_t(was);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(0, std::memcmp(big_t[i].data(), big[i].data(), big[i].size() * 4)) << what[i] << ": DSV4_HC_MIX_T toggled, 100 tokens";
      EXPECT_EQ(0, std::memcmp(small_t[i].data(), small[i].data(), small[i].size() * 4)) << what[i] << ": DSV4_HC_MIX_T toggled, 5 tokens";
    }
  }
}

// The mix kernel with a thread per token (DSV4_HC_MIX_TOK, from 32 tokens) against the block-per-slice kernel: the
// same bits of x, post and comb, at both models' widths (32 and 56 slices), for token counts inside one block's 512
// (40: a partial stage; 300 = 2 x 128 + 44: partial last stage group) and spanning two blocks (700). Also the
// finish kernel with the streams in shared memory (DSV4_HC_FINISH_SX, from 64 tokens: here 300 and 700; at d 7168 one
// block per SM) against the register one.
TEST(CudaOps, MhcMixPerTokenMatchesSlices) {
  const int hc = 4, iters = 20;
  for (int64_t d : {int64_t{4096}, int64_t{7168}})
    for (int n : {40, 300, 700}) {
      std::mt19937 g(static_cast<unsigned>(d * 3 + n));
      const MhcSite w(g, hc, d);
      const vector<float> X = randn(static_cast<size_t>(n * hc * d), g);
      for (bool official : {false, true}) {
        auto run = [&](bool tok, bool sx) {
          DBuf<float> dX(X), dfn(w.fn), dbase(w.base), dscale(w.scale), dnw(w.nw), dx(static_cast<size_t>(n * d)),
              dpost(static_cast<size_t>(n * hc)), dcomb(static_cast<size_t>(n * hc * hc)),
              dpart(static_cast<size_t>(cu::hc_pre_scratch_floats(n, hc, d)));
          cu::HcPreArgs a;
          a.X = dX.p, a.n = n, a.hc = hc, a.d = d, a.fn = dfn.p, a.base = dbase.p, a.scale = dscale.p, a.norm_w = dnw.p;
          a.hc_eps = 1e-6f, a.rms_eps = 1e-6, a.sinkhorn_iters = iters, a.official = official, a.x = dx.p,
          a.post = dpost.p, a.comb = dcomb.p, a.partial = dpart.p;
          const bool was = cu::hc_mix_tok(), was_sx = cu::hc_finish_sx();
          cu::set_hc_mix_tok(tok);
          cu::set_hc_finish_sx(sx);
          cu::hc_pre(a, nullptr);
          cu::set_hc_mix_tok(was);
          cu::set_hc_finish_sx(was_sx);
          return std::array<vector<float>, 3>{dx.get(), dpost.get(), dcomb.get()};
        };
        const auto slices = run(false, false), tok = run(true, false), tok_sx = run(true, true);
        const char* what[3] = {"x", "post", "comb"};
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(0, std::memcmp(tok[i].data(), slices[i].data(), slices[i].size() * 4))
              << what[i] << " d=" << d << " n=" << n << (official ? " (official)" : " (reference)")
              << ": the per-token mix differs from the per-slice mix";
          // The finish with the streams staged in shared memory (DSV4_HC_FINISH_SX; from 64 tokens) vs in registers.
          EXPECT_EQ(0, std::memcmp(tok_sx[i].data(), tok[i].data(), tok[i].size() * 4))
              << what[i] << " d=" << d << " n=" << n << (official ? " (official)" : " (reference)")
              << ": the finish with streams in shared memory differs from the register one";
        }
        // And against the CPU twin (the per-token path's own numerics, not only agreement with the old kernel).
        const MhcPreRef ref = mhc_pre_ref(X, n, hc, d, w.fn, w.base, w.scale, w.nw, iters, 1e-6f, official);
        expect_close(tok_sx[0], ref.x, official, "mhc per-token mix, streams in smem: pre x");
        expect_close(tok[0], ref.x, official, "mhc per-token mix: pre x");
        expect_close(tok[1], ref.post, false, "mhc per-token mix: pre post");
        expect_close(tok[2], ref.comb, false, "mhc per-token mix: pre comb");
      }
    }
}

// ---- compressor: CSA (ratio 4, overlapping, c=512), HCA (ratio 128, c=512), indexer (ratio 4, c=128) -------------
void run_compressor(int m, int64_t c, bool overlap, bool main, bool official, int windows = 2) {
  std::mt19937 g(static_cast<unsigned>(m * 1000 + c + overlap + windows));
  const int64_t W = (overlap ? 2 : 1) * c, R = 64;
  const int n = windows * m + 3;
  const int64_t pos0 = 0;
  vector<float> K = randn(static_cast<size_t>(n * W), g), Z = randn(static_cast<size_t>(n * W), g),
                ape = randn(static_cast<size_t>(m * W), g, 0.1f), nw = randn(c, g, 0.1f), inv(R / 2);
  for (auto& v : nw) v += 1.0f;
  for (int i = 0; i < R / 2; ++i) inv[i] = 1.0f / std::pow(160000.0f, 2.0f * i / R);
  const int64_t rows = (overlap ? 2 : 1) * m;
  vector<float> sK(static_cast<size_t>(rows * W), 0.0f), sZ(static_cast<size_t>(rows * W), -INFINITY), ref;
  for (int i = 0; i < n; ++i) {
    const int64_t t = pos0 + i;
    const int r = static_cast<int>(t % m);
    const int64_t row = overlap ? m + r : r;
    for (int64_t j = 0; j < W; ++j) sK[row * W + j] = K[i * W + j], sZ[row * W + j] = Z[i * W + j] + ape[r * W + j];
    if ((t + 1) % m) continue;
    vector<float> e(c);
    for (int64_t j = 0; j < c; ++j) {
      vector<float> z, kv;
      for (int s = 0; s < m; ++s) z.push_back(sZ[s * W + j]), kv.push_back(sK[s * W + j]);
      if (overlap)
        for (int s = 0; s < m; ++s) z.push_back(sZ[(m + s) * W + c + j]), kv.push_back(sK[(m + s) * W + c + j]);
      float zmax = *std::max_element(z.begin(), z.end());
      double den = 0, num = 0;
      for (size_t s = 0; s < z.size(); ++s) {
        double ex = z[s] == -INFINITY ? 0.0 : std::exp(static_cast<double>(z[s] - zmax));
        den += ex, num += ex * kv[s];
      }
      e[j] = static_cast<float>(num / den);
    }
    if (overlap) {
      std::copy(sK.begin() + m * W, sK.begin() + 2 * m * W, sK.begin());
      std::copy(sZ.begin() + m * W, sZ.begin() + 2 * m * W, sZ.begin());
    }
    if (official) num::round_bf16(e.data(), c);
    cpu::rms_norm(e.data(), c, nw.data(), 1e-6, e.data());
    if (official) num::round_bf16(e.data(), c);
    const int64_t pos = (t / m) * m;
    for (int p = 0; p < R / 2; ++p) {
      float ang = static_cast<float>(pos) * inv[p], cs = std::cos(ang), sn = std::sin(ang);
      float a = e[c - R + 2 * p], b = e[c - R + 2 * p + 1];
      e[c - R + 2 * p] = a * cs - b * sn;
      e[c - R + 2 * p + 1] = a * sn + b * cs;
    }
    if (official) {
      num::round_bf16(e.data() + c - R, R);
      if (main) num::fp8_sim(e.data(), c - R, 64);
      else num::hadamard(e.data(), static_cast<int>(c)), num::round_bf16(e.data(), c), num::fp4_sim(e.data(), c);
    }
    ref.insert(ref.end(), e.begin(), e.end());
  }
  DBuf<float> dK(K), dZ(Z), dape(ape), dnw(nw), dinv(inv), dsK(sK.size()), dsZ(sZ.size()), dcache(ref.size());
  cu::fill_f32(dsZ.p, static_cast<int64_t>(sZ.size()), -INFINITY, nullptr);
  cu::CompressorArgs a;
  // Two calls (chunk split at m + 1) to exercise the state carried across chunks.
  const int split = m + 1;
  a.K = dK.p, a.Z = dZ.p, a.n = split, a.pos0 = 0, a.ratio = m, a.width = c, a.overlap = overlap, a.ape = dape.p;
  a.norm_w = dnw.p, a.eps = 1e-6, a.rope_dim = R, a.inv_freq = dinv.p, a.official = official, a.main = main;
  a.sK = dsK.p, a.sZ = dsZ.p, a.cache = dcache.p, a.count0 = 0;
  cu::compressor(a, nullptr);
  a.K = dK.p + split * W, a.Z = dZ.p + split * W, a.n = n - split, a.pos0 = split, a.count0 = (split) / m;
  cu::compressor(a, nullptr);
  const std::string what = std::string("compressor ") + (main ? "main" : "indexer") + " m=" + std::to_string(m) +
                           " c=" + std::to_string(c) + " n=" + std::to_string(n);
  expect_close(dcache.get(), ref, official, what.c_str());
  // The same tokens one at a time (the decode kernel, compressor_kernel) vs the two chunks above (the prefill
  // kernels, compressor_emit_kernel + compressor_state_kernel): bit-identical entries and final state.
  DBuf<float> tsK(sK.size()), tsZ(sZ.size()), tcache(ref.size());
  cu::fill_f32(tsZ.p, static_cast<int64_t>(sZ.size()), -INFINITY, nullptr);
  cu::CompressorArgs b = a;
  b.sK = tsK.p, b.sZ = tsZ.p, b.cache = tcache.p, b.n = 1;
  for (int i = 0; i < n; ++i) {
    b.K = dK.p + i * W, b.Z = dZ.p + i * W, b.pos0 = i, b.count0 = i / m;
    cu::compressor(b, nullptr);
  }
  const auto tok_cache = tcache.get(), tok_K = tsK.get(), tok_Z = tsZ.get();
  EXPECT_EQ(0, std::memcmp(tok_cache.data(), dcache.get().data(), ref.size() * 4)) << what << ": chunked vs token by token";
  EXPECT_EQ(0, std::memcmp(tok_K.data(), dsK.get().data(), sK.size() * 4)) << what << ": state K";
  EXPECT_EQ(0, std::memcmp(tok_Z.data(), dsZ.get().data(), sZ.size() * 4)) << what << ": state Z";
  // Other chunkings: chunks starting on window boundaries with pos0 > 0 (the usual prefill), chunks that emit nothing
  // (n < m), and several entries per chunk; each must leave the token-by-token entries and final state.
  for (const vector<int>& sizes : {vector<int>{m, m, 2 * m + 1}, vector<int>{std::max(2, m / 3), 3, 2 * m + 1, m},
                                   vector<int>{2, 3 * m, 5}}) {
    DBuf<float> csK(sK.size()), csZ(sZ.size()), ccache(ref.size());
    cu::fill_f32(csZ.p, static_cast<int64_t>(sZ.size()), -INFINITY, nullptr);
    cu::CompressorArgs c2 = a;
    c2.sK = csK.p, c2.sZ = csZ.p, c2.cache = ccache.p;
    int p0 = 0;
    for (size_t ci = 0; p0 < n; ++ci) {
      const int len = std::min(n - p0, sizes[ci % sizes.size()]);
      c2.K = dK.p + p0 * W, c2.Z = dZ.p + p0 * W, c2.n = len, c2.pos0 = p0, c2.count0 = p0 / m;
      cu::compressor(c2, nullptr);
      p0 += len;
    }
    std::string chunks;
    for (int v : sizes) chunks += std::to_string(v) + ",";
    EXPECT_EQ(0, std::memcmp(ccache.get().data(), tok_cache.data(), ref.size() * 4)) << what << ": chunks " << chunks;
    EXPECT_EQ(0, std::memcmp(csK.get().data(), tok_K.data(), sK.size() * 4)) << what << ": state K, chunks " << chunks;
    EXPECT_EQ(0, std::memcmp(csZ.get().data(), tok_Z.data(), sZ.size() * 4)) << what << ": state Z, chunks " << chunks;
  }
}
TEST(CudaOps, Compressors) {
  for (bool off : {false, true}) {
    run_compressor(4, 512, true, true, off);
    run_compressor(128, 512, false, true, off);
    run_compressor(4, 128, true, false, off);
    run_compressor(4, 512, true, true, off, 9);   // several entries per chunk (prefill kernels)
    run_compressor(4, 128, true, false, off, 9);
    run_compressor(128, 512, false, true, off, 5);  // HCA: several entries per chunk, chunks that emit none
  }
}

// ---- many rows (prefill's query heads): a warp per row, the block kernel's bits -----------------------------------
// norm_rope takes norm_rope_warp_kernel from 256 rows of len % 128 == 0 (no SIM8); norm_rope2 always the block
// kernel. Queries (64 heads per token: norm without weight, RoPE), the inverse RoPE alone (attn_out), a weighted
// norm without RoPE at len 1024; reference and official numerics; in place and not; and the CPU for the first case.
TEST(CudaOps, NormRopeWarpPerRow) {
  std::mt19937 g(14);
  const int R = 64;
  vector<float> inv(R / 2);
  for (int i = 0; i < R / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / R);
  struct Case {
    int rows, per_token;
    int64_t len;
    bool norm, weight, rope, inverse;
  };
  for (const Case& c : {Case{64 * 9, 64, 512, true, false, true, false}, Case{32 * 10, 32, 512, false, false, true, true},
                        Case{300, 1, 1024, true, true, false, false}})
    for (bool official : {false, true})
      for (bool in_place : {false, true}) {
        vector<float> x = randn(static_cast<size_t>(c.rows * c.len), g, 2.0f), w = randn(static_cast<size_t>(c.len), g, 0.1f);
        for (auto& v : w) v += 1.0f;
        DBuf<float> dx(x), dx2(x), dw(w), dinv(inv), dy(x.size()), dy2(x.size());
        cu::NormRopeArgs a;
        a.x = dx.p, a.y = in_place ? dx.p : dy.p, a.rows = c.rows, a.rows_per_token = c.per_token, a.len = c.len;
        a.do_norm = c.norm, a.w = c.weight ? dw.p : nullptr, a.eps = 1e-6, a.rope_dim = c.rope ? R : 0;
        a.inv_freq = c.rope ? dinv.p : nullptr, a.pos0 = 4090, a.inverse = c.inverse, a.official = official;
        cu::norm_rope(a, nullptr);
        cu::NormRopeArgs b = a;
        b.x = dx2.p, b.y = in_place ? dx2.p : dy2.p;
        cu::norm_rope2(b, cu::NormRopeArgs{}, nullptr);
        const vector<float> got = in_place ? dx.get() : dy.get(), want = in_place ? dx2.get() : dy2.get();
        const std::string what = std::string("norm_rope warp per row: rows ") + std::to_string(c.rows) + " len " +
                                 std::to_string(c.len) + (official ? " official" : " reference") + (in_place ? " in place" : "");
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
        {  // round_x (the producer's BF16 rounding deferred to the load), warp and block kernels, vs rounding first
          vector<float> xr = x;
          num::round_bf16(xr.data(), static_cast<int64_t>(xr.size()));
          DBuf<float> dr(xr), d3(x), d4(x), dyr(x.size()), dy3(x.size()), dy4(x.size());
          cu::NormRopeArgs r = a, q3 = a;
          r.x = dr.p, r.y = dyr.p;
          q3.x = d3.p, q3.y = dy3.p, q3.round_x = true;
          cu::norm_rope(r, nullptr);
          cu::norm_rope(q3, nullptr);
          cu::NormRopeArgs q4 = q3;
          q4.x = d4.p, q4.y = dy4.p;
          cu::norm_rope2(q4, cu::NormRopeArgs{}, nullptr);  // the block kernel
          const vector<float> want_r = dyr.get();
          EXPECT_EQ(std::memcmp(dy3.get().data(), want_r.data(), want_r.size() * 4), 0) << what << ": round_x (warp)";
          EXPECT_EQ(std::memcmp(dy4.get().data(), want_r.data(), want_r.size() * 4), 0) << what << ": round_x (block)";
          if (c.norm) {  // a NaN (the GPU's canonical 0x7FFFFFFF) read with round_x stays a NaN: its row is all NaN
            vector<float> xn = x;
            const uint32_t qnan = 0x7FFFFFFFu;
            std::memcpy(&xn[3], &qnan, 4);
            DBuf<float> d5(xn), dy5(x.size());
            cu::NormRopeArgs q5 = q3;
            q5.x = d5.p, q5.y = dy5.p;
            cu::norm_rope(q5, nullptr);
            const vector<float> got5 = dy5.get();
            for (int64_t i = 0; i < c.len; ++i) ASSERT_TRUE(std::isnan(got5[static_cast<size_t>(i)])) << what << ": NaN lost at " << i;
          }
        }
        if (c.per_token == 64) {  // the CPU: per-head RMS norm (no weight), RoPE at the token's position
          vector<float> ref = x;
          for (int r = 0; r < c.rows; ++r) {
            float* k = ref.data() + r * c.len;
            cpu::rms_norm(k, c.len, nullptr, 1e-6, k);
            if (official) num::round_bf16(k, c.len);
            for (int p = 0; p < R / 2; ++p) {
              float ang = static_cast<float>(4090 + r / 64) * inv[p], cs = std::cos(ang), sn = std::sin(ang);
              float a0 = k[c.len - R + 2 * p], b0 = k[c.len - R + 2 * p + 1];
              k[c.len - R + 2 * p] = a0 * cs - b0 * sn;
              k[c.len - R + 2 * p + 1] = a0 * sn + b0 * cs;
            }
            if (official) num::round_bf16(k + c.len - R, R);
          }
          expect_close(got, ref, official, what.c_str());
        }
      }
}

// The prefetching warp loop (DSV4_NORM_ROPE_PF) against the one-row warps: the same bits, with enough rows that every
// warp loops (12,800 rows of 512: a query chunk of 200 tokens x 64 heads), official and reference, in place and not,
// with round_x.
TEST(CudaOps, NormRopePrefetchLoop) {
  std::mt19937 g(15);
  const int R = 64, rows = 64 * 200;
  const int64_t len = 512;
  vector<float> inv(R / 2);
  for (int i = 0; i < R / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / R);
  const vector<float> x = randn(static_cast<size_t>(rows * len), g, 2.0f);
  for (bool official : {false, true})
    for (bool in_place : {false, true}) {
      auto run = [&](bool pf) {
        DBuf<float> dx(x), dinv(inv), dy(x.size());
        cu::NormRopeArgs a;
        a.x = dx.p, a.y = in_place ? dx.p : dy.p, a.rows = rows, a.rows_per_token = 64, a.len = len, a.w = nullptr;
        a.eps = 1e-6, a.rope_dim = R, a.inv_freq = dinv.p, a.pos0 = 4090, a.official = official, a.round_x = official;
        const bool was = cu::norm_rope_pf();
        cu::set_norm_rope_pf(pf);
        cu::norm_rope(a, nullptr);
        cu::set_norm_rope_pf(was);
        return in_place ? dx.get() : dy.get();
      };
      const vector<float> base = run(false), pf = run(true);
      EXPECT_EQ(0, std::memcmp(base.data(), pf.data(), base.size() * 4))
          << "prefetching warp loop" << (official ? " official" : " reference") << (in_place ? " in place" : "");
    }
}

// ---- per-row norm + RoPE (+ SIM8): the kv path at D=512 ----------------------------------------------------------
TEST(CudaOps, NormRopeSim8Kv) {
  std::mt19937 g(4);
  const int n = 5, R = 64;
  const int64_t D = 512, pos0 = 1000;
  vector<float> x = randn(static_cast<size_t>(n * D), g), w = randn(D, g, 0.1f), inv(R / 2);
  for (auto& v : w) v += 1.0f;
  for (int i = 0; i < R / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / R);
  for (bool official : {false, true}) {
    vector<float> ref(x.size());
    for (int t = 0; t < n; ++t) {
      float* k = ref.data() + t * D;
      cpu::rms_norm(x.data() + t * D, D, w.data(), 1e-6, k);
      if (official) num::round_bf16(k, D);
      for (int p = 0; p < R / 2; ++p) {
        float ang = static_cast<float>(pos0 + t) * inv[p], c = std::cos(ang), s = std::sin(ang);
        float a = k[D - R + 2 * p], b = k[D - R + 2 * p + 1];
        k[D - R + 2 * p] = a * c - b * s;
        k[D - R + 2 * p + 1] = a * s + b * c;
      }
      if (official) num::round_bf16(k + D - R, R), num::fp8_sim(k, D - R, 64);
    }
    DBuf<float> dx(x), dw(w), dinv(inv), dy(x.size());
    cu::NormRopeArgs a;
    a.x = dx.p, a.y = dy.p, a.rows = n, a.len = D, a.w = dw.p, a.eps = 1e-6, a.rope_dim = R, a.inv_freq = dinv.p;
    a.pos0 = pos0, a.official = official, a.sim8_block = 64;
    cu::norm_rope(a, nullptr);
    expect_close(dy.get(), ref, official, "kv norm+rope+sim8 D=512");
    // Two row sets in one launch (attn_qkv: a q_lora-like norm of other rows, then these): each set bit for bit as
    // norm_rope alone.
    const int64_t L2 = 1536;
    vector<float> x2 = randn(static_cast<size_t>(3 * L2), g), w2 = randn(L2, g, 0.1f);
    DBuf<float> dx2(x2), dw2(w2), dy2(x2.size()), dy2b(x2.size()), dyb(x.size());
    cu::NormRopeArgs q;
    q.x = dx2.p, q.y = dy2.p, q.rows = 3, q.len = L2, q.w = dw2.p, q.eps = 1e-6, q.official = official;
    cu::norm_rope(q, nullptr);
    cu::NormRopeArgs q2 = q, a2 = a;
    q2.y = dy2b.p, a2.y = dyb.p;
    cu::norm_rope2(q2, a2, nullptr);
    EXPECT_EQ(dy2.get(), dy2b.get()) << "norm_rope2: first set";
    EXPECT_EQ(dy.get(), dyb.get()) << "norm_rope2: second set";
    // ... and with an extra block finishing a deferred comb (DeferredComb; decode's attention pre): the same rows,
    // and the comb a pre with its own Sinkhorn leaves, bit for bit.
    const DeferredCombCase cc = deferred_comb_case(official, 85);
    DBuf<float> dcomb(cc.logits), dy2c(x2.size()), dyc(x.size());
    q2.y = dy2c.p, a2.y = dyc.p;
    cu::norm_rope2(q2, a2, nullptr, cu::DeferredComb{dcomb.p, 1e-6f, 20});
    EXPECT_EQ(dy2.get(), dy2c.get()) << "norm_rope2 with a deferred comb: first set";
    EXPECT_EQ(dy.get(), dyc.get()) << "norm_rope2 with a deferred comb: second set";
    EXPECT_EQ(std::memcmp(dcomb.get().data(), cc.final.data(), cc.final.size() * 4), 0) << "norm_rope2's deferred comb";
  }
}

}  // namespace
}  // namespace dsv4::test
