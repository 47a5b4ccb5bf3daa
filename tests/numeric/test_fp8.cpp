// E4M3fn and E5M2: every code decoded against the reference formula, encode(decode(c)) == c, every midpoint
// between neighbours rounds to the even code, saturation/overflow, and random inputs against the reference rounder.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "numeric/codecs.h"
#include "reference.h"

namespace dsv4::num {
namespace {

using testref::Grid;

// Bitwise equality so that -0 and +0 are told apart.
::testing::AssertionResult SameFloat(float got, double want) {
  if (std::isnan(want)) {
    if (std::isnan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "got " << got << ", want NaN";
  }
  if (std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(static_cast<float>(want)))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", want " << want;
}

TEST(E4M3, HandPickedCodes) {
  EXPECT_EQ(decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(decode_e4m3(0xFE), -448.0f);
  EXPECT_EQ(decode_e4m3(0x01), 1.0f / 512.0f);    // smallest subnormal 2^-9
  EXPECT_EQ(decode_e4m3(0x07), 7.0f / 512.0f);    // largest subnormal
  EXPECT_EQ(decode_e4m3(0x08), 1.0f / 64.0f);     // smallest normal 2^-6
  EXPECT_EQ(decode_e4m3(0x38), 1.0f);
  EXPECT_EQ(decode_e4m3(0x3A), 1.25f);
  EXPECT_EQ(decode_e4m3(0x77), 240.0f);           // 1.875 * 2^7
  EXPECT_TRUE(std::isnan(decode_e4m3(0x7F)));
  EXPECT_TRUE(std::isnan(decode_e4m3(0xFF)));
  EXPECT_TRUE(std::signbit(decode_e4m3(0x80)) && decode_e4m3(0x80) == 0.0f);
  EXPECT_EQ(encode_e4m3(448.0f), 0x7E);
  EXPECT_EQ(encode_e4m3(-0.0f), 0x80);
  EXPECT_EQ(encode_e4m3(0.0f), 0x00);
}

TEST(E4M3, ExhaustiveDecodeAndIdentity) {
  int nan_codes = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const double want = testref::ref_decode(testref::kE4M3, c);
    const float got = decode_e4m3(static_cast<uint8_t>(c));
    EXPECT_TRUE(SameFloat(got, want)) << "code 0x" << std::hex << c;
    if (std::isnan(want)) {
      ++nan_codes;
      continue;
    }
    EXPECT_EQ(encode_e4m3(got), c) << "code 0x" << std::hex << c;
  }
  EXPECT_EQ(nan_codes, 2);  // only S.1111.111
}

TEST(E4M3, RneTiesByHand) {
  EXPECT_EQ(encode_e4m3(1.0625f), 0x38);   // halfway 1.0 | 1.125 -> 1.0 (even)
  EXPECT_EQ(encode_e4m3(1.1875f), 0x3A);   // halfway 1.125 | 1.25 -> 1.25 (even)
  EXPECT_EQ(encode_e4m3(-1.0625f), 0xB8);
  EXPECT_EQ(encode_e4m3(1.0f / 1024.0f), 0x00);        // halfway 0 | 2^-9 -> 0
  EXPECT_EQ(encode_e4m3(3.0f / 1024.0f), 0x02);        // halfway 2^-9 | 2^-8 -> 2*2^-9 (even)
  EXPECT_EQ(encode_e4m3(15.0f / 1024.0f), 0x08);       // halfway largest subnormal | 2^-6 -> 2^-6 (even)
  EXPECT_EQ(encode_e4m3(1.07f), 0x39);                 // just past the tie -> up
}

TEST(E4M3, Saturation) {
  EXPECT_EQ(encode_e4m3(449.0f), 0x7E);
  EXPECT_EQ(encode_e4m3(464.0f), 0x7E);
  EXPECT_EQ(encode_e4m3(1e30f), 0x7E);
  EXPECT_EQ(encode_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(encode_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(encode_e4m3(-1000.0f), 0xFE);
  EXPECT_EQ(encode_e4m3(NAN) & 0x7F, 0x7F);
}

TEST(E5M2, HandPickedCodes) {
  EXPECT_EQ(decode_e5m2(0x3C), 1.0f);
  EXPECT_EQ(decode_e5m2(0x7B), 57344.0f);
  EXPECT_EQ(decode_e5m2(0x01), std::exp2(-16.0f));
  EXPECT_EQ(decode_e5m2(0x04), std::exp2(-14.0f));
  EXPECT_TRUE(std::isinf(decode_e5m2(0x7C)) && decode_e5m2(0x7C) > 0);
  EXPECT_TRUE(std::isinf(decode_e5m2(0xFC)) && decode_e5m2(0xFC) < 0);
  EXPECT_TRUE(std::isnan(decode_e5m2(0x7D)));
  EXPECT_TRUE(std::isnan(decode_e5m2(0xFF)));
}

TEST(E5M2, ExhaustiveDecodeAndIdentity) {
  int nan_codes = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const double want = testref::ref_decode(testref::kE5M2, c);
    const float got = decode_e5m2(static_cast<uint8_t>(c));
    EXPECT_TRUE(SameFloat(got, want)) << "code 0x" << std::hex << c;
    if (std::isnan(want)) {
      ++nan_codes;
      continue;
    }
    EXPECT_EQ(encode_e5m2(got), c) << "code 0x" << std::hex << c;
  }
  EXPECT_EQ(nan_codes, 6);
}

TEST(E5M2, Overflow) {
  EXPECT_EQ(encode_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(encode_e5m2(61439.0f), 0x7B);
  EXPECT_EQ(encode_e5m2(61440.0f), 0x7C);  // tie with odd max -> inf (even)
  EXPECT_EQ(encode_e5m2(-1e30f), 0xFC);
  EXPECT_TRUE(std::isnan(decode_e5m2(encode_e5m2(NAN))));
}

// For every pair of neighbouring non-negative values (a, b): the midpoint goes to the even code, one float ulp
// either side goes to the nearer one; the same for the negatives.
void check_all_midpoints(const Grid& g, uint32_t (*enc)(float)) {
  for (size_t i = 0; i + 1 < g.pts.size(); ++i) {
    const auto [a, ca] = g.pts[i];
    const auto [b, cb] = g.pts[i + 1];
    const double mid = (a + b) / 2;
    const float midf = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(midf), mid) << "midpoint not representable in float";
    const uint32_t even = (ca % 2 == 0) ? ca : cb;
    ASSERT_NE(ca % 2, cb % 2);
    EXPECT_EQ(enc(midf), even) << "tie between " << a << " and " << b;
    EXPECT_EQ(enc(-midf), g.sign_bit | even) << "tie between " << -a << " and " << -b;
    EXPECT_EQ(enc(std::nextafter(midf, 0.0f)), ca) << "just below mid of " << a << ", " << b;
    EXPECT_EQ(enc(std::nextafter(midf, INFINITY)), cb) << "just above mid of " << a << ", " << b;
  }
}

uint32_t enc_e4m3(float x) { return encode_e4m3(x); }
uint32_t enc_e5m2(float x) { return encode_e5m2(x); }

TEST(E4M3, AllMidpointsRoundToEven) { check_all_midpoints(testref::make_grid(testref::kE4M3), enc_e4m3); }
TEST(E5M2, AllMidpointsRoundToEven) { check_all_midpoints(testref::make_grid(testref::kE5M2), enc_e5m2); }

// Random floats (arbitrary bit patterns, values in range, and values near grid points) against the reference.
void check_random(const Grid& g, uint32_t (*enc)(float), uint32_t seed) {
  std::mt19937 rng(seed);
  const double top = g.pts.back().first;
  std::uniform_real_distribution<double> in_range(-1.2 * top, 1.2 * top);
  std::uniform_int_distribution<size_t> pick(0, g.pts.size() - 1);
  std::uniform_real_distribution<double> jitter(-0.6, 0.6);
  for (int i = 0; i < 300000; ++i) {
    float x;
    switch (i % 3) {
      case 0: x = std::bit_cast<float>(static_cast<uint32_t>(rng())); break;
      case 1: x = static_cast<float>(in_range(rng)); break;
      default: {
        const size_t k = pick(rng);
        const double step = k + 1 < g.pts.size() ? g.pts[k + 1].first - g.pts[k].first : g.pts[k].first / 8;
        x = static_cast<float>(g.pts[k].first + jitter(rng) * step);
        if (rng() & 1) x = -x;
      }
    }
    if (std::isnan(x)) continue;
    ASSERT_EQ(enc(x), testref::ref_round(g, x)) << "x = " << x << " (bits 0x" << std::hex
                                                << std::bit_cast<uint32_t>(x) << ")";
  }
}

TEST(E4M3, RandomInputsMatchReference) { check_random(testref::make_grid(testref::kE4M3), enc_e4m3, 1); }
TEST(E5M2, RandomInputsMatchReference) { check_random(testref::make_grid(testref::kE5M2), enc_e5m2, 2); }

}  // namespace
}  // namespace dsv4::num
