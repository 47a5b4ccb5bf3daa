#pragma once
// Independent reference for the codec tests. Decoding follows the textbook formula (-1)^s * (1 + m/2^M) * 2^(e-bias)
// evaluated in double with std::exp2 (the codecs use ldexp on integer significands or bit tricks); rounding is a
// table search for the nearest representable value with ties going to the even code. Nothing here calls the codecs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace dsv4::num::testref {

struct Format {
  int ebits, mbits, bias;
  bool ieee_specials;  // top exponent = inf/NaN (E5M2, F16, BF16); otherwise only all-ones = NaN (E4M3fn)
};

constexpr Format kE4M3{4, 3, 7, false};
constexpr Format kE5M2{5, 2, 15, true};
constexpr Format kF16{5, 10, 15, true};
constexpr Format kBF16{8, 7, 127, true};

inline double ref_decode(const Format& f, uint32_t code) {
  const uint32_t mmask = (1u << f.mbits) - 1, emask = (1u << f.ebits) - 1;
  const uint32_t m = code & mmask, e = (code >> f.mbits) & emask, s = (code >> (f.mbits + f.ebits)) & 1;
  const double sign = s ? -1.0 : 1.0;
  if (f.ieee_specials && e == emask)
    return m ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (!f.ieee_specials && e == emask && m == mmask) return std::numeric_limits<double>::quiet_NaN();
  const double frac = static_cast<double>(m) / std::exp2(f.mbits);
  if (e == 0) return sign * frac * std::exp2(1 - f.bias);
  return sign * (1.0 + frac) * std::exp2(static_cast<int>(e) - f.bias);
}

// Hand table for E2M1 (MODEL.md Appendix B), codes 0..7; bit 3 is the sign.
inline double ref_decode_e2m1(uint32_t code) {
  static const double kMag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}

// Non-negative representable values in ascending order, each with its code. For formats whose overflow goes to
// infinity, the table ends with a virtual entry: the value the next binade would start at, carrying the inf code,
// so that values past max finite round to inf exactly as IEEE RNE does (ties at the boundary go to the even code).
struct Grid {
  std::vector<std::pair<double, uint32_t>> pts;
  uint32_t sign_bit;
  bool saturate;  // |x| beyond the last point -> last point (E4M3fn, E2M1); else -> last (inf) code
};

inline Grid make_grid(const Format& f) {
  Grid g;
  g.sign_bit = 1u << (f.ebits + f.mbits);
  g.saturate = !f.ieee_specials;
  for (uint32_t c = 0; c < g.sign_bit; ++c) {
    double v = ref_decode(f, c);
    if (std::isnan(v)) continue;
    if (std::isinf(v)) {
      // Next value after max finite: (1 + 1) * 2^(emax) where emax is the largest finite exponent.
      g.pts.push_back({std::exp2(static_cast<int>((1u << f.ebits) - 1) - f.bias), c});
      continue;
    }
    g.pts.push_back({v, c});
  }
  std::sort(g.pts.begin(), g.pts.end());
  return g;
}

inline Grid make_grid_e2m1() {
  Grid g;
  g.sign_bit = 8;
  g.saturate = true;
  for (uint32_t c = 0; c < 8; ++c) g.pts.push_back({ref_decode_e2m1(c), c});
  return g;
}

// Round x (not NaN) to the grid: nearest value, ties to the even code; the sign bit is copied from x (so a small
// negative value rounds to -0, as IEEE does).
inline uint32_t ref_round(const Grid& g, float x) {
  const uint32_t sign = std::signbit(x) ? g.sign_bit : 0;
  const double a = std::fabs(static_cast<double>(x));
  const auto& p = g.pts;
  if (a >= p.back().first) return sign | p.back().second;
  auto hi = std::lower_bound(p.begin(), p.end(), std::make_pair(a, 0u),
                             [](const auto& l, const auto& r) { return l.first < r.first; });
  if (hi->first == a) return sign | hi->second;
  auto lo = hi - 1;
  const double dl = a - lo->first, dh = hi->first - a;
  if (dl < dh) return sign | lo->second;
  if (dh < dl) return sign | hi->second;
  return sign | ((lo->second % 2 == 0) ? lo->second : hi->second);
}

}  // namespace dsv4::num::testref
