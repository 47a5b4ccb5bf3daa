// Sampling: penalties -> temperature -> top-k -> top-p -> min-p -> draw (in token order when nothing truncates). Greedy (temperature 0) takes the argmax
// of the penalised logits with the lowest id winning ties, so it is deterministic.
//
// The passes over the whole vocabulary (NaN check + max, the softmax normaliser, the exponentials of the untruncated
// draw) run once per token of every request, so they are vectorised (AVX2 when the build targets it) with a fixed
// arithmetic: the same values for a given build whatever the vector width, the C library or the batch.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "dsv4/engine.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DSV4_SAMPLER_AVX2 1
#endif

namespace dsv4 {
namespace {

// exp(x) for x <= 0 in single precision (about 1 ulp): x = k ln2 + r with |r| <= ln2/2 (ln2 split in two, Cody-Waite),
// e^r by a degree-7 polynomial (1 + r + r^2 (c5 + c4 r + ... + c0 r^5)), times 2^k built in the exponent bits. Below
// -87 (where expf is denormal) it returns 0. The scalar and the 8-lane versions perform the same operations, so a token
// gets the same value in the vector body and in the tail.
constexpr float kExpMin = -87.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: (v + kRound) - kRound rounds v to an integer
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kC[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float fmadd(float a, float b, float c) {
#ifdef DSV4_SAMPLER_AVX2
  return std::fma(a, b, c);  // one vfmadd, as in the vector version
#else
  return a * b + c;  // no FMA in this build's target: never fused
#endif
}

inline float exp_le0(float x) {
  const float xc = x < kExpMin ? kExpMin : x;
  const float kf = fmadd(xc, kLog2e, kRound) - kRound;
  float r = fmadd(kf, -kLn2Hi, xc);
  r = fmadd(kf, -kLn2Lo, r);
  float p = kC[0];
  for (int i = 1; i < 6; ++i) p = fmadd(p, r, kC[i]);
  const float y = fmadd(p, r * r, r) + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(kf) + 127) << 23);
  return x < kExpMin ? 0.0f : y * scale;
}

#ifdef DSV4_SAMPLER_AVX2
inline __m256 exp_le0(__m256 x) {
  const __m256 lo = _mm256_set1_ps(kExpMin), rnd = _mm256_set1_ps(kRound);
  const __m256 xc = _mm256_max_ps(x, lo);
  const __m256 kf = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(kLog2e), rnd), rnd);
  __m256 r = _mm256_fmadd_ps(kf, _mm256_set1_ps(-kLn2Hi), xc);
  r = _mm256_fmadd_ps(kf, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC[i]));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(kf), _mm256_set1_epi32(127)), 23);
  const __m256 v = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), v);
}
#endif

// Max of w[0..V); fails on a NaN.
float checked_max(const float* w, int V) {
  float mx = -std::numeric_limits<float>::infinity();
  bool nan = false;
  int i = 0;
#ifdef DSV4_SAMPLER_AVX2
  __m256 m = _mm256_set1_ps(mx), bad = _mm256_setzero_ps();
  for (; i + 8 <= V; i += 8) {
    const __m256 v = _mm256_loadu_ps(w + i);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (float v : lanes) mx = std::max(mx, v);
  nan = _mm256_movemask_ps(bad) != 0;
#endif
  for (; i < V; ++i) {
    nan |= std::isnan(w[i]);
    mx = std::max(mx, w[i]);
  }
  if (nan) fail("model produced NaN logits");
  return mx;
}

// First i with w[i] == v (V if none).
int first_equal(const float* w, int V, float v) {
  int i = 0;
#ifdef DSV4_SAMPLER_AVX2
  const __m256 vv = _mm256_set1_ps(v);
  for (; i + 8 <= V; i += 8)
    if (const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(w + i), vv, _CMP_EQ_OQ))) return i + std::countr_zero(static_cast<unsigned>(m));
#endif
  for (; i < V; ++i)
    if (w[i] == v) return i;
  return V;
}

// Appends to `out` every t with w[t] >= cut, in token order, and returns the sum of their e[t] (in that order).
double collect_at_least(const float* w, int V, float cut, const float* e, std::vector<int32_t>& out) {
  out.clear();
  double mass = 0;
  int t = 0;
#ifdef DSV4_SAMPLER_AVX2
  const __m256 vc = _mm256_set1_ps(cut);
  for (; t + 8 <= V; t += 8)
    for (unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(w + t), vc, _CMP_GE_OQ))); m; m &= m - 1) {
      const int i = t + std::countr_zero(m);
      out.push_back(i);
      mass += e[i];
    }
#endif
  for (; t < V; ++t)
    if (w[t] >= cut) out.push_back(t), mass += e[t];
  return mass;
}

// S = sum of e_i = exp_le0((w_i - mx) * s) in double, in a fixed order: the vocabulary in blocks of kBlock tokens, a
// block summed in 8 lanes (token i into lane i % 8) joined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then the block's
// last (< 8) tokens in order; S is the block sums in order. Writes e to `out` and the block sums to `blocks` if given.
constexpr int kBlock = 1024;
int n_blocks(int V) { return (V + kBlock - 1) / kBlock; }

double exp_sum(const float* w, int V, float mx, float s, float* out, double* blocks) {
  double total = 0;
  for (int b0 = 0, b = 0; b0 < V; b0 += kBlock, ++b) {
    const int end = std::min(V, b0 + kBlock);
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = b0;
#ifdef DSV4_SAMPLER_AVX2
    const __m256 vmx = _mm256_set1_ps(mx), vs = _mm256_set1_ps(s);
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    for (; i + 8 <= end; i += 8) {
      const __m256 e = exp_le0(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(w + i), vmx), vs));
      if (out) _mm256_storeu_ps(out + i, e);
      a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
      a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    _mm256_storeu_pd(lane, a0);
    _mm256_storeu_pd(lane + 4, a1);
#else
    for (; i + 8 <= end; i += 8)
      for (int j = 0; j < 8; ++j) {
        const float e = exp_le0((w[i + j] - mx) * s);
        if (out) out[i + j] = e;
        lane[j] += e;
      }
#endif
    double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < end; ++i) {
      const float e = exp_le0((w[i] - mx) * s);
      if (out) out[i] = e;
      sum += e;
    }
    if (blocks) blocks[b] = sum;
    total += sum;
  }
  return total;
}

}  // namespace

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
  if (p.temperature < 0 || !std::isfinite(p.temperature)) fail("temperature must be >= 0 (got ", p.temperature, ")");
  if (p.top_p <= 0 || p.top_p > 1) fail("top_p must be in (0, 1] (got ", p.top_p, ")");
  if (p.min_p < 0 || p.min_p > 1) fail("min_p must be in [0, 1] (got ", p.min_p, ")");
  if (p.top_k < 0) fail("top_k must be >= 0 (got ", p.top_k, ")");
  if (p.repetition_penalty <= 0) fail("repetition_penalty must be > 0 (got ", p.repetition_penalty, ")");
  if (p.top_logprobs < 0 || p.top_logprobs > 20) fail("top_logprobs must be in [0, 20] (got ", p.top_logprobs, ")");
}

SampledToken Sampler::sample(const std::vector<float>& logits, const std::vector<int32_t>& generated) {
  const int V = static_cast<int>(logits.size());
  const float* w = logits.data();  // the penalised logits
  // Penalties over the generated tokens (OpenAI semantics for presence/frequency; CTRL-style repetition penalty).
  if (p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    work_.assign(logits.begin(), logits.end());
    // The counts are kept across calls and advanced by the tokens appended since the last one (a generation grows by
    // one token a step): recounting the whole list cost ~70 us per 1,000 generated tokens, every token (session 37).
    // Anything but an extension of what was counted starts over.
    const bool extends = counts_.size() == static_cast<size_t>(V) && generated.size() >= counted_.size() &&
                         std::equal(counted_.begin(), counted_.end(), generated.begin());
    if (!extends) {
      counts_.assign(static_cast<size_t>(V), 0);
      counted_.clear(), distinct_.clear();
    }
    for (size_t i = counted_.size(); i < generated.size(); ++i) {
      const int32_t t = generated[i];
      counted_.push_back(t);
      if (t >= 0 && t < V && counts_[static_cast<size_t>(t)]++ == 0) distinct_.push_back(t);
    }
    for (int32_t t : distinct_) {
      float& v = work_[static_cast<size_t>(t)];
      if (p_.repetition_penalty != 1.0f) v = v > 0 ? v / p_.repetition_penalty : v * p_.repetition_penalty;
      v -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(counts_[static_cast<size_t>(t)]);
    }
    w = work_.data();
  }
  const float mx = checked_max(w, V);  // (a NaN logit stays NaN through the penalties)
  // The whole distribution in token order (no truncation): O(V), no sort (sorting a 129k vocabulary per token would
  // cost more than a decode step of a small model).
  const bool whole = p_.temperature != 0.0f && (p_.top_k == 0 || p_.top_k >= V) && p_.top_p >= 1.0f && p_.min_p == 0.0f;
  double z = 0;  // softmax normaliser at temperature 1 (relative to mx), for the reported log-probabilities
  int32_t chosen;
  if (p_.temperature == 0.0f) {
    z = exp_sum(w, V, mx, 1.0f, nullptr, nullptr);
    chosen = first_equal(w, V, mx);
  } else if (whole) {
    const float inv_t = 1.0f / p_.temperature;
    exps_.resize(static_cast<size_t>(V));
    blocks_.resize(static_cast<size_t>(n_blocks(V)));
    const double total = exp_sum(w, V, mx, inv_t, exps_.data(), blocks_.data());
    z = p_.temperature == 1.0f ? total : exp_sum(w, V, mx, 1.0f, nullptr, nullptr);  // same sum at temperature 1
    int32_t last = V - 1;  // the last token with a non-zero probability (where rounding may leave the draw)
    while (last > 0 && !(exps_[static_cast<size_t>(last)] > 0)) --last;
    // Token order: skip whole blocks by their sums, then walk the tokens.
    double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
    int32_t i = 0;
    for (size_t b = 0; b < blocks_.size() && r >= blocks_[b]; ++b) {
      r -= blocks_[b];
      i += kBlock;
    }
    chosen = last;
    for (; i < last; ++i) {
      const double e = exps_[static_cast<size_t>(i)];
      if (e > 0 && r < e) {
        chosen = i;
        break;
      }
      r -= e;
    }
  } else {
    auto by_logit = [&](int32_t a, int32_t b) {
      float va = w[a], vb = w[b];
      return va > vb || (va == vb && a < b);
    };
    std::vector<double>& probs = probs_;
    size_t keep = 0;  // candidates, in order_[0..keep) sorted by logit (then id)
    double sum = 0;   // the mass top_p is a fraction of
    if (p_.top_k > 0 && p_.top_k < V) {
      z = exp_sum(w, V, mx, 1.0f, nullptr, nullptr);
      keep = static_cast<size_t>(p_.top_k);
      order_.resize(static_cast<size_t>(V));
      std::iota(order_.begin(), order_.end(), 0);
      std::partial_sort(order_.begin(), order_.begin() + static_cast<long>(keep), order_.end(), by_logit);
      probs.resize(keep);
      const float top = w[order_[0]];
      for (size_t i = 0; i < keep; ++i) {
        probs[i] = std::exp(static_cast<double>(w[order_[i]] - top) / p_.temperature);
        sum += probs[i];
      }
    } else {
      // No top-k: top-p and / or min-p over the whole vocabulary. Sorting all of it cost ~25 ms per token at the V4
      // vocabulary (129,280; measured, session 37) -- several decode steps. Only the tokens that can survive the cut
      // are sorted: those within U of the top in tempered log-probability u = (max - logit) / T -- a threshold on the
      // logit, so a prefix of the sorted order -- with U grown until their mass reaches the top-p mass (every token
      // of the nucleus is then among them); min-p caps U at -ln(min_p), past which its loop below keeps nothing.
      const float inv_t = 1.0f / p_.temperature;
      exps_.resize(static_cast<size_t>(V));
      sum = exp_sum(w, V, mx, inv_t, exps_.data(), nullptr);
      z = p_.temperature == 1.0f ? sum : exp_sum(w, V, mx, 1.0f, nullptr, nullptr);  // (the same sum at temperature 1)
      constexpr float kURange = 88.0f;  // exp_le0 is 0 below -87: past this U every token with mass is a candidate
      const float u_min_p = p_.min_p > 0.0f ? std::min(kURange, -std::log(p_.min_p) + 1e-3f) : kURange;  // (+ ulp margin)
      const double target = p_.top_p < 1.0f ? static_cast<double>(p_.top_p) * sum : std::numeric_limits<double>::infinity();
      // (U grows by 2 up to 16, then by half: a pass is ~40 us, a sort of the candidates grows with their count.)
      for (float U = std::min(8.0f, u_min_p);; U = std::min(U < 16.0f ? U + 2.0f : 1.5f * U, u_min_p)) {
        const double mass = collect_at_least(w, V, mx - U * p_.temperature, exps_.data(), order_);
        if (mass >= target || U >= u_min_p) break;
      }
      std::sort(order_.begin(), order_.end(), by_logit);
      keep = order_.size();
      probs.resize(keep);
      for (size_t i = 0; i < keep; ++i) probs[i] = exps_[static_cast<size_t>(order_[i])];
    }
    size_t n = keep;
    if (p_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
      double acc = 0;
      for (size_t i = 0; i < keep; ++i) {
        acc += probs[i] / sum;
        if (acc >= p_.top_p) {
          n = i + 1;
          break;
        }
      }
    }
    if (p_.min_p > 0.0f) {  // drop tokens below min_p * p(top)
      size_t m = 1;
      while (m < n && probs[m] >= p_.min_p * probs[0]) ++m;
      n = m;
    }
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += probs[i];
    double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
    size_t pick = n - 1;
    for (size_t i = 0; i < n; ++i) {
      if (r < probs[i]) {
        pick = i;
        break;
      }
      r -= probs[i];
    }
    chosen = order_[pick];
  }
  // Log-probabilities of the (penalised) distribution at temperature 1.
  const float logz = mx + static_cast<float>(std::log(z));
  auto logprob = [&](int32_t t) { return w[t] - logz; };
  SampledToken out{chosen, logprob(chosen), {}};
  if (p_.top_logprobs > 0) {
    order_.resize(static_cast<size_t>(V));
    std::iota(order_.begin(), order_.end(), 0);
    size_t k = std::min(static_cast<size_t>(p_.top_logprobs), static_cast<size_t>(V));
    std::partial_sort(order_.begin(), order_.begin() + static_cast<long>(k), order_.end(), [&](int32_t a, int32_t b) {
      return w[a] > w[b] || (w[a] == w[b] && a < b);
    });
    for (size_t i = 0; i < k; ++i) out.top.push_back({order_[i], logprob(order_[i])});
  }
  return out;
}

}  // namespace dsv4
