// Tensor parallelism (issue 8) on the 2-GPU machine: TP2 vs TP1 (whole forward) on TP-ready tiny models in every stored
// format and both layer schedules, in reference and official numerics; TP2 single-token decode (CUDA graphs,
// collectives captured) and chunked prefill vs TP2 whole prefill of the same tokens.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <cstring>

#include "../model/fixture_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/peer_allreduce.h"
#include "model/tiny_model.h"
#include "numeric/quant_sim.h"

namespace dsv4::test {
namespace tp_tests {

int gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

double top1_agreement(const std::vector<float>& a, const std::vector<float>& b, size_t V) {
  const size_t T = a.size() / V;
  size_t same = 0;
  for (size_t t = 0; t < T; ++t) {
    auto am = std::max_element(a.begin() + t * V, a.begin() + (t + 1) * V) - (a.begin() + t * V);
    auto bm = std::max_element(b.begin() + t * V, b.begin() + (t + 1) * V) - (b.begin() + t * V);
    same += am == bm;
  }
  return static_cast<double>(same) / static_cast<double>(T);
}

// Token-by-token decode (graph replays after the first two steps) of all ids.
std::vector<float> decode_logits(Model& m, const std::vector<int32_t>& ids) {
  Forward fwd(m, 1);
  auto st = m.backend().new_sequence(static_cast<int64_t>(ids.size()));
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  std::vector<float> out(ids.size() * V);
  for (size_t t = 0; t < ids.size(); ++t) fwd.forward(*st, &ids[t], 1, static_cast<int64_t>(t), out.data() + t * V);
  return out;
}

// The peer one-shot all-reduce on its own: random partials on every GPU, several counts and repeated calls (both
// parities, and replays of one CUDA graph of three all-reduces), each result equal bit for bit to the host's
// rank-order sum, on every rank.
TEST(PeerAllReduce, MatchesRankOrderSumEagerAndInGraphs) {
  const int n = gpus() >= 8 ? 8 : (gpus() >= 4 ? 4 : 2);
  if (gpus() < 2) {
    if (std::getenv("DSV4_REQUIRE_TP")) FAIL() << "DSV4_REQUIRE_TP is set but only " << gpus() << " GPU(s) are visible";
    GTEST_SKIP() << "needs 2 GPUs";
  }
  std::vector<int> dev;
  for (int d = 0; d < n; ++d) dev.push_back(d);
  ASSERT_TRUE(cuda::PeerReduce::available(dev)) << "the GPUs have no peer access";
  const size_t cap = 65536;
  cuda::PeerReduce pr(dev, cap);
  std::vector<float*> buf(static_cast<size_t>(n));
  std::vector<cudaStream_t> st(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    DSV4_CU(cudaSetDevice(r));
    DSV4_CU(cudaMalloc(&buf[static_cast<size_t>(r)], cap * 4));
    DSV4_CU(cudaStreamCreateWithFlags(&st[static_cast<size_t>(r)], cudaStreamNonBlocking));
  }
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto check = [&](size_t count, int calls, bool graph) {
    // Each call reduces the previous result again: expected = the same rank-order recurrence on the host.
    std::vector<std::vector<float>> h(static_cast<size_t>(n), std::vector<float>(count));
    for (auto& v : h)
      for (auto& x : v) x = nd(g);
    for (int r = 0; r < n; ++r) {
      DSV4_CU(cudaSetDevice(r));
      DSV4_CU(cudaMemcpy(buf[static_cast<size_t>(r)], h[static_cast<size_t>(r)].data(), count * 4, cudaMemcpyHostToDevice));
    }
    std::vector<cudaGraphExec_t> exec(static_cast<size_t>(n), nullptr);
    if (graph) {
      for (int r = 0; r < n; ++r) {
        DSV4_CU(cudaSetDevice(r));
        cudaGraph_t gr;
        DSV4_CU(cudaStreamBeginCapture(st[static_cast<size_t>(r)], cudaStreamCaptureModeThreadLocal));
        for (int c = 0; c < 3; ++c) cuda::peer_all_reduce(pr.rank(static_cast<size_t>(r)), buf[static_cast<size_t>(r)], count, st[static_cast<size_t>(r)]);
        DSV4_CU(cudaStreamEndCapture(st[static_cast<size_t>(r)], &gr));
        DSV4_CU(cudaGraphInstantiate(&exec[static_cast<size_t>(r)], gr, 0));
        DSV4_CU(cudaGraphDestroy(gr));
      }
    }
    std::vector<float> want(count);
    int done = 0;
    while (done < calls) {
      for (int r = 0; r < n; ++r) {
        DSV4_CU(cudaSetDevice(r));
        if (graph) DSV4_CU(cudaGraphLaunch(exec[static_cast<size_t>(r)], st[static_cast<size_t>(r)]));
        else cuda::peer_all_reduce(pr.rank(static_cast<size_t>(r)), buf[static_cast<size_t>(r)], count, st[static_cast<size_t>(r)]);
      }
      for (int c = 0; c < (graph ? 3 : 1); ++c, ++done) {
        for (size_t i = 0; i < count; ++i) {
          float s = 0.0f;
          for (int q = 0; q < n; ++q) s += h[static_cast<size_t>(q)][i];
          want[i] = s;
        }
        for (auto& v : h) v = want;
      }
    }
    for (int r = 0; r < n; ++r) {
      DSV4_CU(cudaSetDevice(r));
      DSV4_CU(cudaStreamSynchronize(st[static_cast<size_t>(r)]));
      std::vector<float> got(count);
      DSV4_CU(cudaMemcpy(got.data(), buf[static_cast<size_t>(r)], count * 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), count * 4)) << "rank " << r << " count " << count << (graph ? " graph" : " eager");
      if (exec[static_cast<size_t>(r)]) cudaGraphExecDestroy(exec[static_cast<size_t>(r)]);
    }
  };
  check(4096, 1, false);
  check(28672, 5, false);
  check(4, 3, false);  // two lines: one block, most of its threads idle
  check(cap, 2, false);
  check(4096, 6, true);
  check(28672, 3, true);
  // The epilogues (what finish_collective launched after the sum): Round = round_bf16 of the sums in place; SumRows
  // = moe_reduce of the rows' [official: BF16-rounded] sums into out (buf left as it was). Expected on the host with
  // the CPU's round_bf16 and the same rank order / double row sum.
  auto check_ep = [&](cuda::PeerEpilogue::Kind kind, int rows, size_t count, bool official) {
    std::vector<std::vector<float>> h(static_cast<size_t>(n), std::vector<float>(count));
    for (auto& v : h)
      for (auto& x : v) x = nd(g);
    const size_t cols = count / static_cast<size_t>(rows);
    std::vector<float*> out(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      DSV4_CU(cudaSetDevice(r));
      DSV4_CU(cudaMemcpy(buf[static_cast<size_t>(r)], h[static_cast<size_t>(r)].data(), count * 4, cudaMemcpyHostToDevice));
      DSV4_CU(cudaMalloc(&out[static_cast<size_t>(r)], cols * 4));
      DSV4_CU(cudaMemset(out[static_cast<size_t>(r)], 0xFF, cols * 4));
    }
    for (int r = 0; r < n; ++r) {
      DSV4_CU(cudaSetDevice(r));
      cuda::PeerEpilogue ep;
      ep.kind = kind, ep.out = out[static_cast<size_t>(r)], ep.rows = rows, ep.official = official;
      cuda::peer_all_reduce(pr.rank(static_cast<size_t>(r)), buf[static_cast<size_t>(r)], count, st[static_cast<size_t>(r)], ep);
    }
    std::vector<float> sum(count);
    for (size_t i = 0; i < count; ++i) {
      float s = 0.0f;
      for (int q = 0; q < n; ++q) s += h[static_cast<size_t>(q)][i];
      sum[i] = s;
    }
    if (kind == cuda::PeerEpilogue::Round || official) num::round_bf16(sum.data(), static_cast<int64_t>(count));
    std::vector<float> want_out(cols);
    for (size_t j = 0; j < cols; ++j) {
      double acc = 0.0;
      for (int r = 0; r < rows; ++r) acc += sum[static_cast<size_t>(r) * cols + j];
      want_out[j] = static_cast<float>(acc);
    }
    if (official) num::round_bf16(want_out.data(), static_cast<int64_t>(cols));
    const std::string what = std::string(kind == cuda::PeerEpilogue::Round ? "round" : "sum rows") + " count " +
                             std::to_string(count) + (official ? " official" : " reference");
    for (int r = 0; r < n; ++r) {
      DSV4_CU(cudaSetDevice(r));
      DSV4_CU(cudaStreamSynchronize(st[static_cast<size_t>(r)]));
      std::vector<float> got(count), got_out(cols);
      DSV4_CU(cudaMemcpy(got.data(), buf[static_cast<size_t>(r)], count * 4, cudaMemcpyDeviceToHost));
      DSV4_CU(cudaMemcpy(got_out.data(), out[static_cast<size_t>(r)], cols * 4, cudaMemcpyDeviceToHost));
      if (kind == cuda::PeerEpilogue::Round) {
        EXPECT_EQ(0, std::memcmp(got.data(), sum.data(), count * 4)) << "rank " << r << " " << what;
      } else {
        EXPECT_EQ(0, std::memcmp(got.data(), h[static_cast<size_t>(r)].data(), count * 4)) << "rank " << r << " " << what << ": buf changed";
        EXPECT_EQ(0, std::memcmp(got_out.data(), want_out.data(), cols * 4)) << "rank " << r << " " << what;
      }
      cudaFree(out[static_cast<size_t>(r)]);
    }
  };
  check_ep(cuda::PeerEpilogue::Round, 1, 4096, true);
  check_ep(cuda::PeerEpilogue::SumRows, 7, 28672, true);
  check_ep(cuda::PeerEpilogue::SumRows, 7, 28672, false);
  check_ep(cuda::PeerEpilogue::SumRows, 3, 12, true);
  check(4096, 2, false);  // plain again after the epilogues (the epochs stay in step)
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    cudaFree(buf[static_cast<size_t>(r)]);
    cudaStreamDestroy(st[static_cast<size_t>(r)]);
  }
  std::printf("[tp] peer one-shot all-reduce over %d GPUs: bit-identical to the rank-order sum (eager and graphs)\n", n);
}

struct Case {
  const char* format;
  const char* schedule;
};

class TpTiny : public ::testing::TestWithParam<Case> {};

TEST_P(TpTiny, Tp2MatchesTp1AndDecodeMatchesPrefill) {
  if (gpus() < 2) {
    if (std::getenv("DSV4_REQUIRE_TP")) FAIL() << "DSV4_REQUIRE_TP is set but only " << gpus() << " GPU(s) are visible";
    GTEST_SKIP() << "needs 2 GPUs (" << gpus() << " visible); tools/gpu/check.sh runs it on nvidia-h200-x2";
  }
  const Case c = GetParam();
  const std::string dir = std::string(DSV4_BINARY_DIR) + "/tp_tiny_" + c.format + "_" + c.schedule + "_" + std::to_string(::getpid());
  TinySpec sp;
  sp.format = c.format;
  sp.schedule = c.schedule;
  sp.layers = 6;
  sp.seed = 5;
  sp.tp_ready = true;
  write_tiny_model(dir, sp);
  std::vector<int32_t> ids;
  uint64_t x = 12345;
  for (int i = 0; i < 150; ++i) {  // crosses ratio-4/16 boundaries and the 16-token window many times
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ids.push_back(static_cast<int32_t>((x >> 33) % 129000));
  }
  const size_t V = 129280;
  // Reference numerics (fp32 everywhere): TP only changes fp32 summation order, so TP2 must equal TP1 to ~1e-6.
  // Official numerics: TP keeps every rounding point of TP1 (partial sums stay fp32 through the all-reduce; the BF16
  // roundings of wo_b's output and of each expert's output run after it), so again only the fp32 summation order
  // differs. But activations are quantized to FP8, and on these tiny random models a last-bit difference can flip an
  // FP8 rounding that later layers amplify: two valid implementations, the CPU reference and the CUDA backend, differ
  // by rel L2 0.08-0.2 here. Measured on the H200 pair: TP2 vs TP1 is bit-identical on some models and 0.05-0.08 on
  // others, depending only on the random weights. So the official bar is the (top-1 >= 99.5 %, rel L2 <= 2e-2)
  // or, where the model's own noise floor is above it, that floor: TP2 may not deviate from TP1 more than the CPU and
  // CUDA backends deviate from each other on the same model.
  // The widest split the machine allows (the TP-ready model splits up to 8 ways): TP2 on nvidia-h200-x2.
  const int tp = gpus() >= 8 ? 8 : (gpus() >= 4 ? 4 : 2);
  std::vector<int> devices;
  for (int d = 0; d < tp; ++d) devices.push_back(d);
  // Official numerics run with the prefill GEMM paths off (cuda::set_prefill_gemm): the GEMV and the per-slot
  // experts sum every row in decode's order, so decode vs prefill stays a strict check of the state handling instead
  // of a sample of the model's amplification of last-bit differences (with the GEMM on, decode vs prefill measured
  // 0.07-0.22 rel L2 here, the size of the CPU-vs-CUDA floor). Reference numerics run with it on and stay strict (the
  // GEMM differs from the GEMV by ~1e-6), so they also cover the GEMM on sharded weights. For the same reason the
  // official pass keeps decode's FP8 GEMVs off the tensor cores (cuda::set_gemv_tc), whose summation order differs
  // from the prefill GEMV's; the tensor-core GEMV is checked by the op tests and the official model tests.
  for (Numerics nm : {Numerics::Reference, Numerics::Official}) {
    cuda::set_prefill_gemm(nm == Numerics::Reference);
    cuda::set_gemv_tc(nm == Numerics::Reference);
    std::vector<float> one, two, two_chunked, two_decode, cpu;
    {
      Model m1(dir, make_cuda_backend(), nm);
      one = run_logits(m1, ids, 0);
    }
    {
      Model m2(dir, make_tp_backend(devices), nm);
      two = run_logits(m2, ids, 0);
      two_chunked = run_logits(m2, ids, 37);
      two_decode = decode_logits(m2, ids);
    }
    double floor_err = 0, floor_top1 = 1;
    if (nm == Numerics::Official) {
      Model mc(dir, make_cpu_backend(), nm);
      cpu = run_logits(mc, ids, 0);
      floor_err = rel_l2(one, cpu);
      floor_top1 = top1_agreement(one, cpu, V);
    }
    const double agree = top1_agreement(two, one, V), err = rel_l2(two, one);
    const double agree_dec = top1_agreement(two_decode, two, V), err_dec = rel_l2(two_decode, two);
    const double err_chunk = rel_l2(two_chunked, two);
    std::printf("[tp] %s/%s %-9s TP%d vs TP1 top-1 %.4f rel L2 %.3e | decode vs prefill top-1 %.4f rel L2 %.3e | "
                "chunk 37 rel L2 %.3e | TP1 CUDA vs CPU top-1 %.4f rel L2 %.3e\n",
                c.format, c.schedule, numerics_name(nm), tp, agree, err, agree_dec, err_dec, err_chunk, floor_top1, floor_err);
    if (nm == Numerics::Reference) {
      EXPECT_EQ(agree, 1.0);
      EXPECT_LE(err, 1e-5);
      EXPECT_EQ(agree_dec, 1.0);
      EXPECT_LE(err_dec, 1e-5);
      EXPECT_LE(err_chunk, 1e-5);
    } else {
      EXPECT_LE(err, std::max(2e-2, floor_err));
      EXPECT_GE(agree, std::min(0.995, floor_top1));
      EXPECT_GE(agree_dec, 0.995);
      EXPECT_LE(err_dec, 2e-2);
      EXPECT_LE(err_chunk, 2e-2);
    }
  }
  cuda::set_prefill_gemm(true);
  cuda::set_gemv_tc(true);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Formats, TpTiny,
                         ::testing::Values(Case{"fp8", "flash"}, Case{"nvfp4", "flash"}, Case{"base", "pro"},
                                           Case{"bf16", "pro"}),
                         [](const auto& i) { return std::string(i.param.format) + "_" + i.param.schedule; });

}  // namespace tp_tests
}  // namespace dsv4::test
