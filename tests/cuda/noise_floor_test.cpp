// CPU only (runs without a GPU): the official-numerics noise floor (noise_floor.h) of every checkpoint the CUDA
// model tests compare on, printed as "[noise-floor] name rel L2 ... top-1 disagreement ...", and the check that the
// CUDA-vs-CPU official limits of model_test.cpp are 2x these floors.
#include <gtest/gtest.h>

#include <cstdio>

#include "noise_floor.h"
#include "official_limits.h"

namespace dsv4::test {
namespace {

void report(const std::string& label, const std::string& dir, const std::vector<int32_t>& ids) {
  const std::string scratch = std::string(DSV4_BINARY_DIR) + "/noise_floor_scratch";
  const NoiseFloor nf = measure_noise_floor(dir, ids, scratch);
  const OfficialLimit lim = official_limit(label);
  std::printf("[noise-floor] %-14s %2d F32 tensors  rel L2 %.3g  top-1 disagreement %.1f%%  -> limit rel L2 %.3g, top-1 >= %.1f%%\n",
              label.c_str(), nf.tensors, nf.rel, 100 * nf.disagree, lim.rel, 100 * lim.top1);
  EXPECT_GT(nf.tensors, 0) << label;
  // The limit is 2x the floor (or the global 0.1 / 90 % where that is larger), never tighter than the floor itself.
  EXPECT_GE(lim.rel, 2 * nf.rel * 0.999) << label;
  EXPECT_LE(lim.top1, 1.0 - 2 * nf.disagree + 1e-9) << label;
}

TEST(NoiseFloor, FixturesOfficialNumerics) {
  for (const auto& name : fixture_cases()) {
    const std::string dir = fixtures_dir() + "/" + name;
    report(name, dir, read_bin<int32_t>(dir + "/ids.bin"));
  }
}
// (Both tests are CPU only and take ~3 min together: tools/gpu/check.sh leaves them to the dev machine.)

TEST(NoiseFloor, TinyModelsOfficialNumerics) {
  for (auto [format, schedule] : {std::pair<const char*, const char*>{"bf16", "flash"}, {"fp8", "flash"}, {"base", "pro"},
                                  {"nvfp4", "flash"}})
    report(std::string(format) + "/" + schedule, tiny_model_dir(format, schedule), tiny_ids());
}

}  // namespace
}  // namespace dsv4::test
