// RoPE frequency tables vs MODEL.md Appendix A (computed independently in fp64 there).
#include <gtest/gtest.h>

#include <cmath>

#include "model/rope.h"

namespace dsv4 {
namespace {

ModelConfig flash_rope() {
  ModelConfig c;
  c.rope_dim = 64;
  c.head_dim = 512;
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.yarn = YarnConfig{true, 16.0, 65536, 32.0, 1.0};
  return c;
}

TEST(Rope, MainProfileMatchesAppendixA) {
  auto inv = rope_inv_freq(flash_rope(), RopeProfile::Main);
  ASSERT_EQ(inv.size(), 32u);
  const double want[] = {1.0, 7.498942093e-01, 5.623413252e-01, 1.0e-01, 1.0e-02, 1.333521432e-04};
  const int idx[] = {0, 1, 2, 8, 16, 31};
  for (int k = 0; k < 6; ++k) EXPECT_NEAR(inv[idx[k]], want[k], 2e-7 * want[k] + 1e-12) << "pair " << idx[k];
}

TEST(Rope, CompressProfileYarnBlendMatchesAppendixA) {
  auto inv = rope_inv_freq(flash_rope(), RopeProfile::Compress);
  // Pairs 0-15 keep theta=160000 frequencies, 16-24 blend, 25-31 are divided by 16.
  const int idx[] = {1, 8, 15, 16, 17, 24, 25, 31};
  const double want[] = {6.876560219e-01, 5.0e-02,        3.635538584e-03, 2.265625e-03,
                         1.396801295e-03, 1.953125e-05,   5.372312671e-06, 5.680529037e-07};
  for (int k = 0; k < 8; ++k) EXPECT_NEAR(inv[idx[k]], want[k], 1e-6 * want[k]) << "pair " << idx[k];
}

TEST(Rope, RotationIsInterleavedAndInvertible) {
  float inv[2] = {1.0f, 0.5f};
  float x[4] = {1.0f, 0.0f, 0.0f, 1.0f};
  rope_rotate(x, inv, 2, 1, false);
  // pair 0 rotated by 1 rad: (cos1, sin1); pair 1 (0,1) by 0.5 rad: (-sin.5, cos.5).
  EXPECT_NEAR(x[0], std::cos(1.0f), 1e-6);
  EXPECT_NEAR(x[1], std::sin(1.0f), 1e-6);
  EXPECT_NEAR(x[2], -std::sin(0.5f), 1e-6);
  EXPECT_NEAR(x[3], std::cos(0.5f), 1e-6);
  rope_rotate(x, inv, 2, 1, true);
  EXPECT_NEAR(x[0], 1.0f, 1e-6);
  EXPECT_NEAR(x[1], 0.0f, 1e-6);
  EXPECT_NEAR(x[2], 0.0f, 1e-6);
  EXPECT_NEAR(x[3], 1.0f, 1e-6);
}

}  // namespace
}  // namespace dsv4
