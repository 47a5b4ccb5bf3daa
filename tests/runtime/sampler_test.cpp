#include <gtest/gtest.h>

#include <cmath>
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
