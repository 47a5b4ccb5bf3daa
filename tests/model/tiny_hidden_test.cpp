// make-tiny's --hidden (TinySpec::hidden): a tiny checkpoint with hidden 128 and TP-ready widths loads with those
// shapes and runs on the CPU reference in both numerics with finite logits that do not depend on the chunking (the
// shapes the CUDA backend's MMA decode experts take: whole 128-column steps; tests/cuda runs it against the GPU).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "fixture_util.h"
#include "model/tiny_model.h"

namespace dsv4::test {
namespace {

TEST(TinyModel, HiddenOptionShapesAndRuns) {
  const std::string dir = std::string(DSV4_BINARY_DIR) + "/test_tiny_hidden_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  TinySpec sp;
  sp.vocab = 512;
  sp.layers = 3;
  sp.tp_ready = true;
  sp.hidden = 128;
  write_tiny_model(dir, sp);
  const ModelConfig cfg = load_model_config(dir + "/config.json");
  EXPECT_EQ(cfg.hidden, 128);
  EXPECT_EQ(cfg.moe_inter % 128, 0) << "expert width in whole 128-column steps";
  const std::vector<int32_t> ids = {1, 17, 300, 42, 99, 7, 256, 11, 3, 500, 64, 128, 5, 77, 401, 2, 9, 310, 45, 8};
  for (Numerics nm : {Numerics::Reference, Numerics::Official}) {
    Model m(dir, make_cpu_backend(), nm);
    const auto whole = run_logits(m, ids, 0);
    const auto step = run_logits(m, ids, 1);
    ASSERT_EQ(whole.size(), ids.size() * 512u);
    for (float v : whole) ASSERT_TRUE(std::isfinite(v));
    double num = 0, den = 0;
    for (size_t i = 0; i < whole.size(); ++i) num += (step[i] - whole[i]) * (step[i] - whole[i]), den += whole[i] * whole[i];
    EXPECT_LE(std::sqrt(num / den), nm == Numerics::Reference ? 1e-5 : 1e-1) << numerics_name(nm);
  }
  sp.hidden = 96;
  EXPECT_THROW(write_tiny_model(dir + "_bad", sp), Error) << "hidden must be a multiple of 64";
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir + "_bad");
}

}  // namespace
}  // namespace dsv4::test
