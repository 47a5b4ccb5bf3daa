// E2M1 (FP4) and E8M0: all codes against hand tables / 2^(b-127), RNE ties on the FP4 grid, saturation, the
// packed-nibble order, the ceil encoder for E8M0, and the UE8M0 scale rule of MODEL.md §4.1.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "numeric/codecs.h"
#include "reference.h"

namespace dsv4::num {
namespace {

TEST(E2M1, AllSixteenCodes) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (uint8_t c = 0; c < 16; ++c) {
    EXPECT_EQ(std::bit_cast<uint32_t>(decode_e2m1(c)), std::bit_cast<uint32_t>(want[c])) << int(c);
    EXPECT_EQ(encode_e2m1(want[c]), c) << int(c);
  }
  // Only the low nibble is a code.
  EXPECT_EQ(decode_e2m1(0xF7), 6.0f);
}

TEST(E2M1, RneTiesByHand) {
  EXPECT_EQ(encode_e2m1(0.25f), 0);   // 0 | 0.5 -> 0
  EXPECT_EQ(encode_e2m1(0.75f), 2);   // 0.5 | 1.0 -> 1.0
  EXPECT_EQ(encode_e2m1(1.25f), 2);   // 1.0 | 1.5 -> 1.0
  EXPECT_EQ(encode_e2m1(1.75f), 4);   // 1.5 | 2.0 -> 2.0
  EXPECT_EQ(encode_e2m1(2.5f), 4);    // 2 | 3 -> 2
  EXPECT_EQ(encode_e2m1(3.5f), 6);    // 3 | 4 -> 4
  EXPECT_EQ(encode_e2m1(5.0f), 6);    // 4 | 6 -> 4
  EXPECT_EQ(encode_e2m1(-5.0f), 14);
  EXPECT_EQ(encode_e2m1(-0.25f), 8);  // -0
  EXPECT_EQ(encode_e2m1(5.01f), 7);
  EXPECT_EQ(encode_e2m1(0.26f), 1);
}

TEST(E2M1, Saturation) {
  EXPECT_EQ(encode_e2m1(6.5f), 7);
  EXPECT_EQ(encode_e2m1(1e9f), 7);
  EXPECT_EQ(encode_e2m1(INFINITY), 7);
  EXPECT_EQ(encode_e2m1(-7.0f), 15);
  EXPECT_EQ(encode_e2m1(-INFINITY), 15);
}

TEST(E2M1, RandomInputsMatchReference) {
  const auto g = testref::make_grid_e2m1();
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> d(-8.0, 8.0);
  for (int i = 0; i < 200000; ++i) {
    const float x = (i & 1) ? static_cast<float>(d(rng)) : std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(encode_e2m1(x), testref::ref_round(g, x)) << "x = " << x;
  }
  // All midpoints of the grid (x8 so they are exact multiples of 0.25).
  for (size_t i = 0; i + 1 < g.pts.size(); ++i) {
    const float mid = static_cast<float>((g.pts[i].first + g.pts[i + 1].first) / 2);
    EXPECT_EQ(encode_e2m1(mid), testref::ref_round(g, mid)) << mid;
    EXPECT_EQ(testref::ref_round(g, mid) % 2, 0u);
  }
}

TEST(E2M1, PackedNibbleOrder) {
  // Element k is the low nibble of byte k/2 when k is even (MODEL.md §3.4).
  const uint8_t row[3] = {0x21, 0xF7, 0x0A};
  const uint8_t want[6] = {0x1, 0x2, 0x7, 0xF, 0xA, 0x0};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(fp4_nibble(row, k), want[k]) << k;
}

TEST(E8M0, AllCodes) {
  for (int b = 0; b < 255; ++b) {
    const float v = decode_e8m0(static_cast<uint8_t>(b));
    EXPECT_EQ(static_cast<double>(v), std::exp2(static_cast<double>(b) - 127.0)) << b;
    EXPECT_EQ(encode_e8m0_ceil(v), b) << b;
    // Just above a power of two needs the next one; just below still fits under this one.
    if (b < 254) {
      EXPECT_EQ(encode_e8m0_ceil(std::nextafter(v, INFINITY)), b + 1) << b;
    }
    if (b > 0) {
      EXPECT_EQ(encode_e8m0_ceil(std::nextafter(v, 0.0f)), b) << b;
    }
  }
  EXPECT_TRUE(std::isnan(decode_e8m0(255)));
  EXPECT_EQ(decode_e8m0(127), 1.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(decode_e8m0(0)), 0x00400000u);  // 2^-127, a float subnormal
  EXPECT_EQ(decode_e8m0(254), std::exp2(127.0f));
}

TEST(E8M0, CeilEncoderEdgeCases) {
  EXPECT_EQ(encode_e8m0_ceil(0.0f), 255);
  EXPECT_EQ(encode_e8m0_ceil(-1.0f), 255);
  EXPECT_EQ(encode_e8m0_ceil(NAN), 255);
  EXPECT_EQ(encode_e8m0_ceil(INFINITY), 255);
  EXPECT_EQ(encode_e8m0_ceil(0.75f), 127);
  EXPECT_EQ(encode_e8m0_ceil(3.0f), 129);
  EXPECT_EQ(encode_e8m0_ceil(std::exp2(-140.0f)), 0);  // below 2^-127: the smallest scale still covers it
  EXPECT_EQ(encode_e8m0_ceil(1e38f * 3), 254);        // above 2^127: clamped (255 would be NaN)
}

TEST(E8M0, CeilIsSmallestPowerOfTwoAbove) {
  std::mt19937 rng(6);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng()) & 0x7FFFFFFFu);
    if (!(x > 0.0f) || std::isinf(x) || std::isnan(x)) continue;
    const uint8_t b = encode_e8m0_ceil(x);
    ASSERT_NE(b, 255);
    const double s = std::exp2(static_cast<double>(b) - 127.0);
    if (b == 254 && x > s) continue;  // clamp above 2^127, checked above
    ASSERT_GE(s, static_cast<double>(x)) << x;
    if (b > 0) {
      ASSERT_LT(s / 2, static_cast<double>(x)) << x;
    }
  }
}

TEST(Ue8m0Scale, Examples) {
  EXPECT_EQ(ue8m0_scale(448.0f, 448.0f), 1.0f);
  EXPECT_EQ(ue8m0_scale(449.0f, 448.0f), 2.0f);
  EXPECT_EQ(ue8m0_scale(224.0f, 448.0f), 0.5f);
  EXPECT_EQ(ue8m0_scale(225.0f, 448.0f), 1.0f);
  EXPECT_EQ(ue8m0_scale(6.0f, 6.0f), 1.0f);
  EXPECT_EQ(ue8m0_scale(7.0f, 6.0f), 2.0f);
  EXPECT_EQ(ue8m0_scale(1e-4f, 448.0f), std::exp2(-22.0f));   // FP8 activation floor: 2.2e-7 -> 2^-22
  EXPECT_EQ(ue8m0_scale(6.0f * std::exp2(-126.0f), 6.0f), std::exp2(-126.0f));  // FP4 floor
}

TEST(Ue8m0Scale, BoundsQuantizedRange) {
  // s = 2^ceil(log2(amax/qmax)): amax/s lands in (qmax/2, qmax], computed on the fp32 quotient.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> e(-20.0f, 20.0f);
  for (float qmax : {448.0f, 6.0f}) {
    for (int i = 0; i < 100000; ++i) {
      const float amax = std::exp2(e(rng));
      const float s = ue8m0_scale(amax, qmax);
      ASSERT_EQ(std::bit_cast<uint32_t>(s) & 0x7FFFFFu, 0u) << "not a power of two: " << s;
      const double r = static_cast<double>(amax / qmax);
      ASSERT_GE(static_cast<double>(s), r);
      ASSERT_LT(static_cast<double>(s) / 2, r);
    }
  }
}

}  // namespace
}  // namespace dsv4::num
