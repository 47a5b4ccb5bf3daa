// BF16 and F16: all 65536 codes decoded against the reference formula, encode(decode(c)) == c, every midpoint
// between neighbours rounds to the even code, overflow to inf, NaN stays NaN, random inputs against the reference.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "numeric/codecs.h"
#include "reference.h"

namespace dsv4::num {
namespace {

using testref::Grid;

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

struct Codec16 {
  const testref::Format* fmt;
  float (*dec)(uint16_t);
  uint16_t (*enc)(float);
};

void exhaustive(const Codec16& c, int expect_nan_codes) {
  int nan_codes = 0, mismatches = 0;
  for (uint32_t code = 0; code < 65536; ++code) {
    const double want = testref::ref_decode(*c.fmt, code);
    const float got = c.dec(static_cast<uint16_t>(code));
    if (std::isnan(want)) {
      ++nan_codes;
      if (!std::isnan(got)) ++mismatches;
      EXPECT_TRUE(std::isnan(c.dec(c.enc(got)))) << "NaN code 0x" << std::hex << code << " re-encodes as non-NaN";
      continue;
    }
    if (!same_bits(got, static_cast<float>(want)) && ++mismatches < 10)
      ADD_FAILURE() << "decode 0x" << std::hex << code << ": got " << got << ", want " << want;
    if (c.enc(got) != code && ++mismatches < 10)
      ADD_FAILURE() << "encode(decode(0x" << std::hex << code << ")) = 0x" << c.enc(got);
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(nan_codes, expect_nan_codes);
}

const Codec16 kBf16{&testref::kBF16, decode_bf16, encode_bf16};
const Codec16 kF16{&testref::kF16, decode_f16, encode_f16};

TEST(BF16, HandPickedCodes) {
  EXPECT_EQ(decode_bf16(0x3F80), 1.0f);
  EXPECT_EQ(decode_bf16(0xC000), -2.0f);
  EXPECT_EQ(decode_bf16(0x0001), std::exp2(-133.0f));  // smallest subnormal
  EXPECT_TRUE(std::isinf(decode_bf16(0x7F80)));
  EXPECT_EQ(encode_bf16(1.0f), 0x3F80);
  EXPECT_EQ(encode_bf16(1.00390625f), 0x3F80);       // 1 + 2^-8: halfway 1.0 | 1+2^-7 -> 1.0 (even)
  EXPECT_EQ(encode_bf16(1.01171875f), 0x3F82);       // 1 + 3*2^-8: halfway -> 1+2^-6 (even)
  EXPECT_EQ(encode_bf16(3.4e38f), 0x7F80);           // past the last tie -> inf
  EXPECT_EQ(encode_bf16(-INFINITY), 0xFF80);
}

TEST(BF16, ExhaustiveDecodeAndIdentity) { exhaustive(kBf16, 2 * 127); }

TEST(F16, HandPickedCodes) {
  EXPECT_EQ(decode_f16(0x3C00), 1.0f);
  EXPECT_EQ(decode_f16(0x7BFF), 65504.0f);
  EXPECT_EQ(decode_f16(0x0001), std::exp2(-24.0f));
  EXPECT_EQ(decode_f16(0x0400), std::exp2(-14.0f));
  EXPECT_EQ(decode_f16(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(decode_f16(0x8000)));
  EXPECT_EQ(encode_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(encode_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(encode_f16(65520.0f), 0x7C00);           // tie with odd max -> inf
  EXPECT_EQ(encode_f16(std::exp2(-25.0f)), 0x0000);  // halfway 0 | 2^-24 -> 0
  EXPECT_EQ(encode_f16(-std::exp2(-25.0f)), 0x8000);
  EXPECT_EQ(encode_f16(1.00048828125f), 0x3C00);     // 1 + 2^-11: halfway -> 1.0
  EXPECT_TRUE(std::isnan(decode_f16(encode_f16(NAN))));
}

TEST(F16, ExhaustiveDecodeAndIdentity) { exhaustive(kF16, 2 * 1023); }

void all_midpoints(const Grid& g, uint16_t (*enc)(float)) {
  int bad = 0;
  for (size_t i = 0; i + 1 < g.pts.size(); ++i) {
    const auto [a, ca] = g.pts[i];
    const auto [b, cb] = g.pts[i + 1];
    const float mid = static_cast<float>((a + b) / 2);
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
    const uint32_t even = (ca % 2 == 0) ? ca : cb;
    bad += enc(mid) != even;
    bad += enc(-mid) != (g.sign_bit | even);
    bad += enc(std::nextafter(mid, 0.0f)) != ca;
    bad += enc(std::nextafter(mid, INFINITY)) != cb;
    if (bad) FAIL() << "rounding near the midpoint of " << a << " and " << b;
  }
}

TEST(BF16, AllMidpointsRoundToEven) { all_midpoints(testref::make_grid(testref::kBF16), encode_bf16); }
TEST(F16, AllMidpointsRoundToEven) { all_midpoints(testref::make_grid(testref::kF16), encode_f16); }

void random_inputs(const Grid& g, uint16_t (*enc)(float), uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> in_range(-1.1 * g.pts.back().first, 1.1 * g.pts.back().first);
  for (int i = 0; i < 400000; ++i) {
    float x = (i & 1) ? std::bit_cast<float>(static_cast<uint32_t>(rng())) : static_cast<float>(in_range(rng));
    if (std::isnan(x)) continue;
    ASSERT_EQ(enc(x), testref::ref_round(g, x)) << "x = " << x;
  }
}

TEST(BF16, RandomInputsMatchReference) { random_inputs(testref::make_grid(testref::kBF16), encode_bf16, 3); }
TEST(F16, RandomInputsMatchReference) { random_inputs(testref::make_grid(testref::kF16), encode_f16, 4); }

}  // namespace
}  // namespace dsv4::num
