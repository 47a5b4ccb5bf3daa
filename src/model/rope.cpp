#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace dsv4 {

std::vector<float> rope_inv_freq(const ModelConfig& c, RopeProfile p) {
  const int dim = static_cast<int>(c.rope_dim);
  const int pairs = dim / 2;
  const bool compress = p == RopeProfile::Compress;
  const float base = static_cast<float>(compress ? c.compress_rope_theta : c.rope_theta);
  std::vector<float> inv(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) {
    float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    inv[static_cast<size_t>(i)] = 1.0f / pos_freq;
  }
  if (compress && c.yarn.enabled) {
    // YaRN: pairs below `low` keep the base frequency, pairs above `high` are divided by `factor`, linear blend in
    // between. low/high from the correction-dim formula, truncated (floor/ceil) and clamped to [0, dim-1].
    const double L = static_cast<double>(c.yarn.original_max_position_embeddings);
    auto corr = [&](double rot) { return dim * std::log(L / (rot * 2 * M_PI)) / (2 * std::log(static_cast<double>(base))); };
    double low = std::max(std::floor(corr(c.yarn.beta_fast)), 0.0);
    double high = std::min(std::ceil(corr(c.yarn.beta_slow)), static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    const float factor = static_cast<float>(c.yarn.factor);
    for (int i = 0; i < pairs; ++i) {
      float ramp = static_cast<float>((static_cast<double>(i) - low) / (high - low));
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
      float extrap = 1.0f / pos_freq, interp = 1.0f / (factor * pos_freq);
      inv[static_cast<size_t>(i)] = interp * ramp + extrap * (1.0f - ramp);
    }
  }
  return inv;
}

void rope_rotate(float* x, const float* inv_freq, int pairs, int64_t pos, bool inverse) {
  const float fp = static_cast<float>(pos);
  for (int i = 0; i < pairs; ++i) {
    float ang = fp * inv_freq[i];  // fp32 product, as the reference forms the angle
    float c = std::cos(ang), s = std::sin(ang);
    if (inverse) s = -s;
    float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

}  // namespace dsv4
