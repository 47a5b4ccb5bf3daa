// Whole-model CUDA vs CPU: every golden fixture and a random tiny model of each storage format, both numerics,
// chunkings whole / 1 / 7. Tolerances: reference numerics differ only by fp32 summation order (rel L2 <= 1e-4, same
// argmax everywhere). Official numerics round to BF16/FP8/FP4 grids with power-of-two block scales, which makes the
// tiny random fixtures chaotic: measured on the CPU alone (flash_fp8), moving half of the F32 weights by ONE ulp
// changes official logits by rel L2 5.3e-2 (top-1 126/128) while reference logits move by 7e-7. CUDA vs CPU official
// is held to each checkpoint's own noise floor with a 2x margin (official_limits.h, re-measured by
// noise_floor_test.cpp). (Issue 6's acceptance, 2e-2 / 99.5%, needs a bit-exact summation order or real-model data;
// see docs/BENCHMARKS.md "CUDA ops".)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "../model/fixture_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops.h"
#include "core/error.h"
#include "model/tiny_model.h"
#include "noise_floor.h"
#include "official_limits.h"

namespace dsv4::test {
namespace {

struct Cmp {
  double rel = 0;
  size_t agree = 0, T = 0;
};

Cmp compare(const std::vector<float>& got, const std::vector<float>& ref, size_t V) {
  Cmp c;
  c.T = ref.size() / V;
  double num = 0, den = 0;
  for (size_t t = 0; t < c.T; ++t) {
    size_t a = 0, b = 0;
    for (size_t v = 0; v < V; ++v) {
      const double d = static_cast<double>(got[t * V + v]) - ref[t * V + v];
      num += d * d;
      den += static_cast<double>(ref[t * V + v]) * ref[t * V + v];
      if (got[t * V + v] > got[t * V + a]) a = v;
      if (ref[t * V + v] > ref[t * V + b]) b = v;
    }
    c.agree += a == b;
  }
  c.rel = std::sqrt(num / std::max(den, 1e-30));
  return c;
}

void check_model_dir(const std::string& label, const std::string& dir, const std::vector<int32_t>& ids,
                     std::initializer_list<Numerics> numerics = {Numerics::Reference, Numerics::Official}) {
  for (Numerics nm : numerics) {
    Model cpu(dir, make_cpu_backend(), nm);
    Model gpu(dir, make_cuda_backend(), nm);
    const size_t V = static_cast<size_t>(cpu.config().vocab_size);
    const auto ref = run_logits(cpu, ids, 0);
    for (int chunk : {0, 1, 7}) {
      const auto got = run_logits(gpu, ids, chunk);
      ASSERT_EQ(got.size(), ref.size());
      for (float v : got) ASSERT_TRUE(std::isfinite(v)) << label << ": non-finite CUDA logit";
      const Cmp c = compare(got, ref, V);
      std::printf("[cuda-vs-cpu] %-14s %-9s chunk=%-5s rel L2 %.3g  top-1 %zu/%zu\n", label.c_str(), numerics_name(nm),
                  chunk ? std::to_string(chunk).c_str() : "whole", c.rel, c.agree, c.T);
      if (nm == Numerics::Reference) {
        EXPECT_LE(c.rel, 1e-4) << label << " chunk " << chunk;
        EXPECT_EQ(c.agree, c.T) << label << " chunk " << chunk;
      } else {
        const OfficialLimit lim = official_limit(label);
        EXPECT_LE(c.rel, lim.rel) << label << " chunk " << chunk;
        EXPECT_GE(static_cast<double>(c.agree), lim.top1 * static_cast<double>(c.T)) << label << " chunk " << chunk;
      }
    }
  }
}

TEST(CudaModel, FixturesArePresent) { EXPECT_GE(fixture_cases().size(), 5u) << fixtures_dir(); }

class CudaFixture : public ::testing::TestWithParam<std::string> {};
TEST_P(CudaFixture, MatchesCpuBothNumericsEveryChunking) {
  const std::string dir = fixtures_dir() + "/" + GetParam();
  check_model_dir(GetParam(), dir, read_bin<int32_t>(dir + "/ids.bin"));
}
INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixture, ::testing::ValuesIn(fixture_cases()),
                         [](const auto& info) { return info.param; });

// Random tiny checkpoints (src/model/tiny_model.cpp): every storage format and both layer schedules; a sequence long
// enough to wrap the window and fill several compressed entries of every ratio.
class CudaTiny : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};
TEST_P(CudaTiny, MatchesCpu) {
  const auto [format, schedule] = GetParam();
  check_model_dir(format + "/" + schedule, tiny_model_dir(format, schedule), tiny_ids());
}
INSTANTIATE_TEST_SUITE_P(Formats, CudaTiny,
                         ::testing::Values(std::make_pair("bf16", "flash"), std::make_pair("fp8", "flash"),
                                           std::make_pair("base", "pro"), std::make_pair("nvfp4", "flash")),
                         [](const auto& info) { return info.param.first + "_" + info.param.second; });

// TP-ready widths (q_lora 128, expert width 1024): the CUDA backend stores FP8 wq_a|wkv and shared w1|w3 back to back
// and runs each pair as one GEMV in single-token steps (chunk 1); the other widths above take the separate GEMVs.
// Reference numerics, so any layout slip shows far above the 1e-4 bound.
TEST(CudaTiny, StackedLinearPairsMatchCpu) {
  for (auto [format, schedule] : {std::pair<const char*, const char*>{"fp8", "flash"}, {"base", "pro"}, {"nvfp4", "flash"}}) {
    const std::string dir = std::string(DSV4_BINARY_DIR) + "/cuda_tiny_tp_" + format + "_" + schedule;
    TinySpec sp;
    sp.format = format;
    sp.schedule = schedule;
    sp.seed = 9;
    sp.vocab = 512;
    sp.tp_ready = true;
    write_tiny_model(dir, sp);
    check_model_dir(std::string("tp-ready ") + format, dir, tiny_ids(), {Numerics::Reference});
  }
}

// The MMA decode experts (expert_mma.cuh) inside the whole model: a tiny checkpoint whose routed experts have whole
// 128-column steps (hidden 128, expert width 1024; the fixtures' 64 / 32 never take that path), official numerics,
// decoded one token at a time (chunk 1: the ring expert launches), with the MMA walk on vs off and vs the CPU.
// Whether the walk ran is counted (expert_mma_launches), not inferred from different logits: here the two walks gave
// bit-identical logits (GPU run, session 8: MMA vs FMA rel L2 0; the products are exact in both and small partial
// sums rarely round, and what differs rarely survives the BF16 output rounding). The bounds vs the CPU are the
// official limits of the tiny chaotic models (one changed BF16 rounding anywhere moves their logits by ~5e-2; the
// FMA walk measured rel L2 0.095, top-1 134/150).
TEST(CudaTiny, MmaDecodeExpertsMatchCpu) {
  const std::string dir = std::string(DSV4_BINARY_DIR) + "/cuda_tiny_mma";
  TinySpec sp;
  sp.seed = 13;
  sp.vocab = 512;
  sp.tp_ready = true;
  sp.hidden = 128;
  write_tiny_model(dir, sp);
  const auto ids = tiny_ids();
  Model cpu(dir, make_cpu_backend(), Numerics::Official);
  const size_t V = static_cast<size_t>(cpu.config().vocab_size);
  const auto ref = run_logits(cpu, ids, 0);
  std::vector<float> got[2];
  int64_t launches[2];
  for (int on = 0; on < 2; ++on) {
    cuda::set_expert_mma(on == 1);
    const int64_t before = cuda::expert_mma_launches();
    Model gpu(dir, make_cuda_backend(), Numerics::Official);
    got[on] = run_logits(gpu, ids, 1);
    launches[on] = cuda::expert_mma_launches() - before;
  }
  cuda::set_expert_mma(true);
  const Cmp c_on = compare(got[1], ref, V), c_off = compare(got[0], ref, V), c_ab = compare(got[1], got[0], V);
  std::printf("[cuda-vs-cpu] tiny-mma        official  chunk=1     MMA walk (%lld launches) rel L2 %.3g top-1 %zu/%zu; FMA walk "
              "rel L2 %.3g top-1 %zu/%zu; MMA vs FMA rel L2 %.3g\n", static_cast<long long>(launches[1]), c_on.rel, c_on.agree,
              c_on.T, c_off.rel, c_off.agree, c_off.T, c_ab.rel);
  EXPECT_GT(launches[1], 0) << "the MMA walk did not engage";
  EXPECT_EQ(launches[0], 0) << "the MMA walk ran while switched off";
  for (float v : got[1]) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LE(c_on.rel, 0.15);
  EXPECT_GE(static_cast<double>(c_on.agree), 0.85 * static_cast<double>(c_on.T));
  EXPECT_LE(c_ab.rel, 0.1);
}

}  // namespace
}  // namespace dsv4::test
