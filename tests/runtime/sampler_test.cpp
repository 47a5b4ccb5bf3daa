#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "dsv4/engine.h"

namespace dsv4 {
namespace {

std::vector<float> logits_of(std::initializer_list<float> v) { return std::vector<float>(v); }

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(logits_of({0.1f, 2.0f, 2.0f, -1.0f}), {}).token, 1);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedsDiffer) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i)) * 2.0f;
  auto draw = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.sample(l, out).token);
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

// Both draw paths (whole distribution in token order; sorted and truncated) follow the tempered softmax.
TEST(Sampler, DrawFrequenciesFollowTheDistribution) {
  const std::vector<float> l = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f), -200.0f};
  for (int top_k : {0, 4}) {
    SamplingParams p;
    p.seed = 3;
    p.top_k = top_k;  // 4: the sorted path (token 4 is cut, and has ~0 mass anyway)
    Sampler s(p);
    std::vector<int> seen(5, 0);
    const int N = 40000;
    for (int i = 0; i < N; ++i) seen[static_cast<size_t>(s.sample(l, {}).token)]++;
    for (int t = 0; t < 4; ++t) EXPECT_NEAR(seen[static_cast<size_t>(t)] / double(N), 0.1 * (t + 1), 0.01) << "top_k " << top_k;
    EXPECT_EQ(seen[4], 0);
  }
  // Temperature sharpens: at T = 0.5 the probabilities go as p^2 (1, 4, 9, 16) / 30.
  SamplingParams p;
  p.temperature = 0.5f;
  Sampler s(p);
  std::vector<int> seen(5, 0);
  for (int i = 0; i < 40000; ++i) seen[static_cast<size_t>(s.sample(l, {}).token)]++;
  EXPECT_NEAR(seen[3] / 40000.0, 16.0 / 30.0, 0.01);
  EXPECT_NEAR(seen[0] / 40000.0, 1.0 / 30.0, 0.005);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  std::vector<float> l{1.0f, 3.0f, 2.9f, 0.0f};
  for (int i = 0; i < 20; ++i) {
    SamplingParams a;
    a.top_k = 1;
    a.seed = static_cast<uint64_t>(i);
    EXPECT_EQ(Sampler(a).sample(l, {}).token, 1);
    SamplingParams b;
    b.top_p = 1e-6f;
    b.seed = static_cast<uint64_t>(i);
    EXPECT_EQ(Sampler(b).sample(l, {}).token, 1);
  }
}

TEST(Sampler, MinPAndTopKRestrictTheSupport) {
  std::vector<float> l{5.0f, 4.9f, 0.0f, -3.0f};
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams p;
    p.min_p = 0.5f;  // p(2)/p(0) = e^-5: excluded
    p.seed = seed;
    seen.insert(Sampler(p).sample(l, {}).token);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

TEST(Sampler, FrequencyPenaltyMovesTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 1.0f;
  Sampler s(p);
  // Token 0 generated twice: 3.0 - 2 = 1.0 < 2.0.
  EXPECT_EQ(s.sample(logits_of({3.0f, 2.0f}), {0, 0}).token, 1);
}

// The penalties' counts are kept across calls and advanced by the appended tokens: a sampler used for a whole
// generation must choose exactly what a fresh sampler counting the list from scratch chooses, step by step, and
// start over when the list is not an extension (another history, a shorter one, one changed in the middle).
TEST(Sampler, PenaltyCountsCarriedAcrossCallsMatchARecount) {
  const int V = 1000;
  std::vector<float> l(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) l[static_cast<size_t>(i)] = 2.0f * std::sin(0.7f * static_cast<float>(i)) + 0.001f * static_cast<float>(i % 7);
  SamplingParams p;
  p.temperature = 0;  // greedy: the choice depends on the penalised logits only
  p.frequency_penalty = 0.4f, p.presence_penalty = 0.3f, p.repetition_penalty = 1.2f;
  p.top_logprobs = 2;
  Sampler kept(p);
  std::vector<int32_t> gen;
  for (int step = 0; step < 300; ++step) {
    const SampledToken a = kept.sample(l, gen);
    const SampledToken b = Sampler(p).sample(l, gen);
    ASSERT_EQ(a.token, b.token) << "step " << step;
    ASSERT_EQ(a.logprob, b.logprob) << "step " << step;
    gen.push_back(a.token);
  }
  std::vector<int32_t> other(gen.begin(), gen.begin() + 100), changed = gen;
  changed[50] = (changed[50] + 1) % V;
  for (const auto* h : {&other, &changed, &gen}) EXPECT_EQ(kept.sample(l, *h).token, Sampler(p).sample(l, *h).token);
  EXPECT_GT(std::set<int32_t>(gen.begin(), gen.end()).size(), 20u) << "the penalties should spread the choices";
}

TEST(Sampler, LogprobsAreNormalised) {
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 3;
  Sampler s(p);
  auto t = s.sample(logits_of({0.0f, std::log(3.0f)}), {});
  EXPECT_EQ(t.token, 1);
  EXPECT_NEAR(t.logprob, std::log(0.75f), 1e-6);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].token, 1);
  EXPECT_NEAR(t.top[1].logprob, std::log(0.25f), 1e-6);
}

// A real-size vocabulary (not a multiple of the vector width): the vectorised max / argmax / normaliser agree with a
// plain double-precision computation, and the lowest id wins ties wherever they are.
TEST(Sampler, LargeVocabularyArgmaxAndLogprobs) {
  const int V = 129281;
  std::vector<float> l(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) l[static_cast<size_t>(i)] = 3.0f * std::sin(0.37f * static_cast<float>(i));
  for (int at : {V - 1, 77777, 5, 0}) {
    std::vector<float> m = l;
    m[static_cast<size_t>(at)] = 4.0f;
    if (at != V - 1) m[static_cast<size_t>(V - 1)] = 4.0f;  // a tie later on: the lower id wins
    double z = 0;
    for (float v : m) z += std::exp(static_cast<double>(v) - 4.0);
    SamplingParams p;
    p.temperature = 0;
    p.top_logprobs = 2;
    auto t = Sampler(p).sample(m, {});
    EXPECT_EQ(t.token, at);
    EXPECT_NEAR(t.logprob, -std::log(z), 2e-6);
    ASSERT_EQ(t.top.size(), 2u);
    EXPECT_NEAR(t.top[1].logprob, m[static_cast<size_t>(t.top[1].token)] - 4.0 - std::log(z), 2e-6);
    // Sampled at any temperature, the reported log-probability is the same temperature-1 value.
    SamplingParams q;
    q.temperature = 0.7f;
    q.seed = 9;
    auto u = Sampler(q).sample(m, {});
    EXPECT_NEAR(u.logprob, m[static_cast<size_t>(u.token)] - 4.0 - std::log(z), 2e-6);
  }
}

// The untruncated draw over many blocks of the vocabulary follows the distribution (uniform here: each stretch of
// 1000 tokens gets its share), and is a function of the seed.
TEST(Sampler, LargeVocabularyDrawIsUniformWhenTheLogitsAre) {
  const int V = 10003;
  std::vector<float> l(static_cast<size_t>(V), 0.5f);
  SamplingParams p;
  p.seed = 4;
  Sampler s(p);
  std::vector<int> seen(11, 0);
  const int N = 40000;
  std::vector<int32_t> first;
  for (int i = 0; i < N; ++i) {
    const int32_t t = s.sample(l, {}).token;
    ASSERT_TRUE(t >= 0 && t < V);
    seen[static_cast<size_t>(t / 1000)]++;
    if (i < 20) first.push_back(t);
  }
  for (int b = 0; b < 10; ++b) EXPECT_NEAR(seen[static_cast<size_t>(b)] / double(N), 1000.0 / V, 0.008) << "stretch " << b;
  Sampler again(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(again.sample(l, {}).token, first[static_cast<size_t>(i)]);
}

// Top-p / min-p without top-k sort only the tokens that can survive the cut (a histogram of the mass finds them). Two
// independent checks at the V4 vocabulary size: the nucleus computed here in double precision from a full sort
// contains every drawn token, and the sampler's own sort-everything path (top_k = V - 1: a partial sort of all but
// one token, which carries ~no mass) draws the same token for the same seed.
TEST(Sampler, TopPAndMinPWithoutTopKMatchAFullSort) {
  const int V = 129280;
  std::vector<float> l(static_cast<size_t>(V));
  uint64_t st = 12345;
  for (auto& v : l) {  // deterministic pseudo-normal logits (sum of 4 uniforms), std ~2
    double a = 0;
    for (int k = 0; k < 4; ++k) st = st * 6364136223846793005ull + 1442695040888963407ull, a += (st >> 11) * 0x1.0p-53;
    v = static_cast<float>((a - 2.0) * 3.5);
  }
  l[static_cast<size_t>(V - 7)] = -100.0f;  // the token top_k = V - 1 drops: certainly the lowest
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  struct Case { float t, top_p, min_p; };
  for (const Case c : {Case{0.8f, 0.9f, 0.0f}, Case{1.0f, 0.5f, 0.0f}, Case{0.6f, 1.0f, 0.05f}, Case{1.0f, 0.95f, 0.02f}}) {
    // The nucleus in double precision, with a little slack for the sampler's single-precision exponentials.
    const double mx = l[static_cast<size_t>(order[0])];
    double z = 0;
    for (float v : l) z += std::exp((v - mx) / c.t);
    std::set<int32_t> allowed;
    double acc = 0;
    for (int32_t t : order) {
      const double p = std::exp((l[static_cast<size_t>(t)] - mx) / c.t);
      if (c.min_p > 0 && p < c.min_p * (1 - 1e-5)) break;
      allowed.insert(t);
      acc += p / z;
      if (c.top_p < 1 && acc >= c.top_p + 1e-5) break;
    }
    int same = 0;
    const int N = 60;  // (the full-sort path costs ~25 ms a draw)
    for (int i = 0; i < N; ++i) {
      SamplingParams p;
      p.temperature = c.t, p.top_p = c.top_p, p.min_p = c.min_p, p.seed = static_cast<uint64_t>(i);
      const int32_t got = Sampler(p).sample(l, {}).token;
      EXPECT_TRUE(allowed.count(got)) << "t " << c.t << " top_p " << c.top_p << " min_p " << c.min_p << ": token " << got
                                      << " outside the nucleus of " << allowed.size();
      p.top_k = V - 1;
      same += Sampler(p).sample(l, {}).token == got;
    }
    EXPECT_GE(same, N - 1) << "t " << c.t << " top_p " << c.top_p << " min_p " << c.min_p << ": the full-sort path differs";
    std::printf("[sampler] V %d t %.2f top_p %.2f min_p %.2f: nucleus %zu tokens, full-sort path agrees on %d / %d draws\n",
                V, c.t, c.top_p, c.min_p, allowed.size(), same, N);
  }
}

// The top-p candidates must reach past the first cut when its mass falls short: 10 tokens at logit 0 hold 45 % of the
// mass, 100,000 tokens at -9 (well past the first cut) the rest, so at top_p 0.9 about half of the nucleus' mass is in
// the second group -- and half of the draws.
TEST(Sampler, TopPReachesPastTheFirstCandidateCut) {
  const int V = 100010;
  std::vector<float> l(static_cast<size_t>(V), -9.0f);
  for (int i = 0; i < 10; ++i) l[static_cast<size_t>(i * 1000)] = 0.0f;
  const double e2 = std::exp(-9.0), total = 10 + (V - 10) * e2, target = 0.9 * total;
  const double k = std::ceil((target - 10) / e2), share = k * e2 / (10 + k * e2);  // group 2's share of the nucleus
  SamplingParams p;
  p.top_p = 0.9f;
  p.seed = 5;
  Sampler s(p);
  int second = 0;
  const int N = 1000;
  for (int i = 0; i < N; ++i) second += l[static_cast<size_t>(s.sample(l, {}).token)] < 0;
  std::printf("[sampler] two groups: %.3f of the draws from the second (expected %.3f)\n", second / double(N), share);
  EXPECT_NEAR(second / double(N), share, 0.05);  // (3 sigma)
}

// A masked logit (-inf) is never drawn, on every draw path.
TEST(Sampler, MaskedLogitsAreNeverDrawn) {
  const std::vector<float> l{2.0f, 1.0f, -INFINITY, 0.0f};
  for (int path = 0; path < 4; ++path) {
    std::set<int32_t> seen;
    for (uint64_t seed = 0; seed < 300; ++seed) {
      SamplingParams p;
      p.seed = seed;
      if (path == 1) p.top_p = 0.999f;  // the histogram's candidates
      if (path == 2) p.min_p = 1e-6f;
      if (path == 3) p.top_k = 3;
      seen.insert(Sampler(p).sample(l, {}).token);
    }
    EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 3})) << "path " << path;
  }
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(Sampler{p}, Error);
  p = SamplingParams{};
  p.temperature = -1;
  EXPECT_THROW(Sampler{p}, Error);
  SamplingParams q;
  Sampler s(q);
  EXPECT_THROW(s.sample(logits_of({NAN, 1.0f}), {}), Error);
}

}  // namespace
}  // namespace dsv4
