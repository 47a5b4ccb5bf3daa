// Synthetic full-size weights for `dsv4 bench --synthetic` (issue 6): the real V4-Flash inventory resolves into model
// weights, every stored format decodes to finite values, hash-routing rows name distinct experts, bad requests fail.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "model/model_weights.h"
#include "model/synthetic_weights.h"

namespace dsv4 {
namespace {

TEST(SyntheticWeights, FlashLayersResolveAndDecodeFinite) {
  for (const char* format : {"instruct", "nvfp4"}) {
    SyntheticCheckpoint s = make_synthetic_checkpoint("flash", 3, format);
    EXPECT_EQ(s.cfg.n_layers, 3);
    EXPECT_EQ(s.cfg.n_mtp_layers, 0);
    EXPECT_EQ(s.cfg.hidden, 4096);
    ModelWeights w = resolve_model_weights(s.ckpt, s.cfg);
    ASSERT_EQ(w.layers.size(), 3u);
    EXPECT_FALSE(w.mtp.has_value());
    EXPECT_EQ(w.layers[2].kind, AttnKind::CSA);
    EXPECT_EQ(w.layers[0].experts.size(), 256u);
    EXPECT_EQ(w.layers[0].experts[0].w1.fmt, std::string(format) == "nvfp4" ? WeightFormat::NVFP4 : WeightFormat::MXFP4);
    EXPECT_EQ(w.layers[0].wq_b.fmt, WeightFormat::FP8_E8M0);
    size_t checked = 0;
    for (const LinearRef* r : w.all_linears()) {
      std::vector<float> row(static_cast<size_t>(r->in));
      dequantize_rows(*r, r->out - 1, r->out, row.data());  // the last row: scales of the last tile too
      double sum = 0;
      for (float v : row) {
        ASSERT_TRUE(std::isfinite(v)) << r->name;
        sum += std::fabs(v);
      }
      ASSERT_GT(sum, 0.0) << r->name << " is all zeros";
      ++checked;
    }
    EXPECT_GT(checked, 3u * 256 * 3);
    // Hash layers: 6 distinct experts per token.
    const std::vector<int32_t> t = read_tid2eid(*w.layers[0].tid2eid, s.cfg.n_routed_experts);
    for (size_t v = 0; v < 1000; ++v) {
      std::set<int32_t> e(t.begin() + static_cast<long>(v * 6), t.begin() + static_cast<long>(v * 6 + 6));
      ASSERT_EQ(e.size(), 6u) << "token " << v;
    }
  }
}

TEST(SyntheticWeights, RefusesBadRequests) {
  EXPECT_THROW(make_synthetic_checkpoint("huge", 2), Error);
  EXPECT_THROW(make_synthetic_checkpoint("flash", 0), Error);
  EXPECT_THROW(make_synthetic_checkpoint("flash", 44), Error);
  EXPECT_THROW(make_synthetic_checkpoint("flash", 2, "int3"), Error);
}

}  // namespace
}  // namespace dsv4
