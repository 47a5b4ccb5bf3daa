// Sampling: penalties -> temperature -> top-k -> top-p -> min-p -> draw (in token order when nothing truncates). Greedy (temperature 0) takes the argmax
// of the penalised logits with the lowest id winning ties, so it is deterministic.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "core/error.h"
#include "dsv4/engine.h"

namespace dsv4 {

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
  work_.assign(logits.begin(), logits.end());
  for (float v : work_)
    if (std::isnan(v)) fail("model produced NaN logits");
  // Penalties over the generated tokens (OpenAI semantics for presence/frequency; CTRL-style repetition penalty).
  if (p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : generated) counts[t]++;
    for (auto [t, c] : counts) {
      if (t < 0 || t >= V) continue;
      float& v = work_[static_cast<size_t>(t)];
      if (p_.repetition_penalty != 1.0f) v = v > 0 ? v / p_.repetition_penalty : v * p_.repetition_penalty;
      v -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(c);
    }
  }
  // Log-probabilities of the (penalised) distribution at temperature 1, for reporting.
  float mx = *std::max_element(work_.begin(), work_.end());
  // The whole distribution in token order (no truncation) reuses these exponentials at temperature 1. Single-precision
  // exp: this pass over the vocabulary runs once per token of every request.
  const bool whole = p_.temperature != 0.0f && (p_.top_k == 0 || p_.top_k >= V) && p_.top_p >= 1.0f && p_.min_p == 0.0f;
  const bool reuse = whole && p_.temperature == 1.0f;
  if (whole) probs_.resize(static_cast<size_t>(V));
  double z = 0;
  for (int32_t i = 0; i < V; ++i) {
    const float e = std::exp(work_[static_cast<size_t>(i)] - mx);
    z += e;
    if (reuse) probs_[static_cast<size_t>(i)] = e;
  }
  const float logz = mx + static_cast<float>(std::log(z));
  auto logprob = [&](int32_t t) { return work_[static_cast<size_t>(t)] - logz; };

  int32_t chosen;
  if (p_.temperature == 0.0f) {
    chosen = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  } else if (whole) {
    // No truncation: the whole distribution in token order, O(V) (sorting a 129k vocabulary per token would cost
    // more than a decode step of a small model).
    double total = 0;
    int32_t last = 0;  // the last token with a non-zero probability (where rounding may leave the draw)
    const float inv_t = 1.0f / p_.temperature;
    for (int32_t i = 0; i < V; ++i) {
      double& e = probs_[static_cast<size_t>(i)];
      if (!reuse) e = std::exp((work_[static_cast<size_t>(i)] - mx) * inv_t);
      total += e;
      if (e > 0) last = i;
    }
    double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
    chosen = last;
    for (int32_t i = 0; i < last; ++i) {
      const double e = probs_[static_cast<size_t>(i)];
      if (e > 0 && r < e) {
        chosen = i;
        break;
      }
      r -= e;
    }
  } else {
    order_.resize(static_cast<size_t>(V));
    std::iota(order_.begin(), order_.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) {
      float va = work_[static_cast<size_t>(a)], vb = work_[static_cast<size_t>(b)];
      return va > vb || (va == vb && a < b);
    };
    size_t keep = static_cast<size_t>(V);
    if (p_.top_k > 0 && p_.top_k < V) keep = static_cast<size_t>(p_.top_k);
    // Sort enough candidates (all of them when top-p/min-p need the full ordered mass).
    std::partial_sort(order_.begin(), order_.begin() + static_cast<long>(keep), order_.end(), by_logit);
    std::vector<double>& probs = probs_;
    probs.resize(keep);
    const float top = work_[static_cast<size_t>(order_[0])];
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) {
      probs[i] = std::exp(static_cast<double>(work_[static_cast<size_t>(order_[i])] - top) / p_.temperature);
      sum += probs[i];
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
  SampledToken out{chosen, logprob(chosen), {}};
  if (p_.top_logprobs > 0) {
    order_.resize(static_cast<size_t>(V));
    std::iota(order_.begin(), order_.end(), 0);
    size_t k = std::min(static_cast<size_t>(p_.top_logprobs), static_cast<size_t>(V));
    std::partial_sort(order_.begin(), order_.begin() + static_cast<long>(k), order_.end(), [&](int32_t a, int32_t b) {
      return work_[static_cast<size_t>(a)] > work_[static_cast<size_t>(b)] ||
             (work_[static_cast<size_t>(a)] == work_[static_cast<size_t>(b)] && a < b);
    });
    for (size_t i = 0; i < k; ++i) out.top.push_back({order_[i], logprob(order_[i])});
  }
  return out;
}

}  // namespace dsv4
