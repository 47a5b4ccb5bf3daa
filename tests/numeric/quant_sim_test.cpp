// The official release's quantization-simulation primitives (MODEL.md §4.1) against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "numeric/quant_sim.h"

namespace dsv4::num {
namespace {

TEST(QuantSim, Fp8BlockScaleIsPowerOfTwoCeil) {
  // Block of 4 with amax 896: s = 2^ceil(log2(896/448)) = 2. Values /2 -> {448, 1.5, -3.25, 0.3}, E4M3 RNE ->
  // {448, 1.5, -3.25, 0.3125} (3.25 = 1.625*2 exact; 0.3 -> nearest of 0.296875/0.3125 (step 2^-6*... ) is 0.3125),
  // then *2.
  std::vector<float> x{896.0f, 3.0f, -6.5f, 0.6f};
  fp8_sim(x.data(), 4, 4);
  EXPECT_EQ(x[0], 896.0f);
  EXPECT_EQ(x[1], 3.0f);
  EXPECT_EQ(x[2], -6.5f);
  EXPECT_FLOAT_EQ(x[3], 0.625f);
}

TEST(QuantSim, Fp8ExactlyAtQmaxKeepsScaleOne) {
  // amax = 448 -> s = 1; 1.0625 is halfway between 1.0 and 1.125: ties to even -> 1.0. 17 -> 16 (step 2 at [16,32)).
  std::vector<float> x{448.0f, 1.0625f, 17.0f, -0.0f};
  fp8_sim(x.data(), 4, 4);
  EXPECT_EQ(x[0], 448.0f);
  EXPECT_EQ(x[1], 1.0f);
  EXPECT_EQ(x[2], 16.0f);
  EXPECT_EQ(x[3], 0.0f);
}

TEST(QuantSim, Fp8AmaxFloorAppliesToTinyBlocks) {
  // amax floored at 1e-4: s = 2^ceil(log2(1e-4/448)) = 2^-22. 1e-6 / 2^-22 = 4.194304 -> E4M3 step 0.5 at [4,8): 4.0.
  std::vector<float> x{1e-6f, 0.0f};
  fp8_sim(x.data(), 2, 2);
  EXPECT_FLOAT_EQ(x[0], 4.0f * std::ldexp(1.0f, -22));
  EXPECT_EQ(x[1], 0.0f);
}

TEST(QuantSim, Fp8BlocksAreIndependent) {
  std::vector<float> x{1000.0f, 1.0f, 1.0f, 1.0f};  // blocks of 2: {1000, 1} and {1, 1}
  fp8_sim(x.data(), 4, 2);
  // First block: s = 2^ceil(log2(1000/448)) = 4; 1000/4 = 250 -> E4M3 step 16 at [128,256): 256 -> 1024; 1/4 -> 0.25.
  EXPECT_EQ(x[0], 1024.0f);
  EXPECT_EQ(x[1], 1.0f);
  EXPECT_EQ(x[2], 1.0f);  // second block s = 2^ceil(log2(1/448)) = 2^-8: 256 -> representable exactly
}

TEST(QuantSim, Fp4Sim) {
  // amax = 3 -> s = 2^ceil(log2(3/6)) = 0.5. x/s = {6, 1.25, -0.5, 5} -> E2M1 RNE {6, 1 (tie 1.25 -> even 1.0), -0.5, 4 (tie)}.
  std::vector<float> x(32, 0.0f);
  x[0] = 3.0f;
  x[1] = 0.625f;
  x[2] = -0.25f;
  x[3] = 2.5f;
  fp4_sim(x.data(), 32);
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(x[1], 0.5f);
  EXPECT_EQ(x[2], -0.25f);
  EXPECT_EQ(x[3], 2.0f);
  for (int i = 4; i < 32; ++i) EXPECT_EQ(x[i], 0.0f);
}

TEST(QuantSim, Fp4ScaleRoundsUp) {
  // amax = 7 -> 7/6 -> s = 2. x/s = 3.5 -> tie between 3 and 4 -> even mantissa (4) -> 8.
  std::vector<float> x(32, 0.0f);
  x[5] = 7.0f;
  fp4_sim(x.data(), 32);
  EXPECT_EQ(x[5], 8.0f);
}

TEST(QuantSim, HadamardSylvesterOrder) {
  // n = 4, Sylvester H4 = [[1,1,1,1],[1,-1,1,-1],[1,1,-1,-1],[1,-1,-1,1]] / 2.
  std::vector<float> x{1.0f, 2.0f, 3.0f, 4.0f};
  hadamard(x.data(), 4);
  EXPECT_FLOAT_EQ(x[0], 5.0f);
  EXPECT_FLOAT_EQ(x[1], -1.0f);
  EXPECT_FLOAT_EQ(x[2], -2.0f);
  EXPECT_FLOAT_EQ(x[3], 0.0f);
}

TEST(QuantSim, Hadamard128IsOrthonormalAndMapsBasisToRows) {
  // e_0 -> all entries 1/sqrt(128); e_1 -> alternating signs; applying twice is the identity.
  std::vector<float> e0(128, 0.0f), e1(128, 0.0f);
  e0[0] = 1.0f;
  e1[1] = 1.0f;
  hadamard(e0.data(), 128);
  hadamard(e1.data(), 128);
  const float v = 1.0f / std::sqrt(128.0f);
  for (int i = 0; i < 128; ++i) {
    EXPECT_FLOAT_EQ(e0[i], v);
    EXPECT_FLOAT_EQ(e1[i], (i % 2 ? -v : v));
  }
  std::vector<float> x(128);
  for (int i = 0; i < 128; ++i) x[i] = std::sin(0.37f * i);
  auto y = x;
  hadamard(y.data(), 128);
  hadamard(y.data(), 128);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], x[i], 1e-5f);
}

TEST(QuantSim, RoundBf16) {
  std::vector<float> x{1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f, 3.0f};
  round_bf16(x.data(), 3);
  EXPECT_EQ(x[0], 1.0f);                 // halfway -> even
  EXPECT_EQ(x[1], 1.0f + 4.0f / 256.0f);  // halfway -> even (up)
  EXPECT_EQ(x[2], 3.0f);
}

TEST(QuantSim, RejectsBadSizes) {
  std::vector<float> x(10, 1.0f);
  EXPECT_THROW(fp8_sim(x.data(), 10, 4), std::exception);
  EXPECT_THROW(fp4_sim(x.data(), 10), std::exception);
  EXPECT_THROW(hadamard(x.data(), 10), std::exception);
}

}  // namespace
}  // namespace dsv4::num
