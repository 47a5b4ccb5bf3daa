// Sampler cost per token at the V4 vocabulary (129,280 logits, std ~3, 200 generated tokens -- 8,000 in the last
// case -- for the penalties):
// median of 300 draws for each setting an OpenAI client commonly sends. The CPU samples every decoded token, so this
// adds to each step's time. Build: the `bench_sampler` target; run: build/bench_sampler.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "dsv4/engine.h"

int main() {
  const int V = 129280;
  std::vector<float> lg(V);
  std::mt19937 r(1);
  std::normal_distribution<float> n(0, 3);
  for (auto& v : lg) v = n(r);
  std::vector<int32_t> gen(200), gen8k(8000);
  for (auto& g : gen) g = static_cast<int32_t>(r() % V);
  for (auto& g : gen8k) g = static_cast<int32_t>(r() % V);
  struct Case {
    const char* name;
    dsv4::SamplingParams p;
    const std::vector<int32_t>* generated = nullptr;
  };
  std::vector<Case> cases(8);
  cases[0].name = "greedy", cases[0].p.temperature = 0;
  cases[1].name = "temperature 1 (whole vocabulary)";
  cases[2].name = "temperature 0.7, top_p 0.95", cases[2].p.temperature = 0.7f, cases[2].p.top_p = 0.95f;
  cases[3].name = "temperature 0.7, min_p 0.05", cases[3].p.temperature = 0.7f, cases[3].p.min_p = 0.05f;
  cases[4].name = "temperature 0.7, top_k 40", cases[4].p.temperature = 0.7f, cases[4].p.top_k = 40;
  cases[5].name = "temperature 1, repetition 1.1, top_logprobs 5", cases[5].p.repetition_penalty = 1.1f, cases[5].p.top_logprobs = 5;
  cases[6].name = "temperature 1, top_p 0.95", cases[6].p.top_p = 0.95f;
  cases[7].name = "... repetition 1.1, top_logprobs 5, 8000 generated", cases[7].p = cases[5].p, cases[7].generated = &gen8k;
  std::printf("sampler, %d logits, median of 300 draws:\n", V);
  for (auto& c : cases) {
    dsv4::Sampler s(c.p);
    std::vector<double> t;
    int32_t sink = 0;
    for (int i = 0; i < 300; ++i) {
      const auto a = std::chrono::steady_clock::now();
      sink ^= s.sample(lg, c.generated ? *c.generated : gen).token;
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(t.begin(), t.end());
    std::printf("  %-48s %9.1f us  (token xor %d)\n", c.name, t[t.size() / 2], sink);
  }
  return 0;
}
