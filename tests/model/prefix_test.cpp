// Streaming state at window boundaries: splitting the sequence at positions ≡ 0, 1, m-1 (mod m) for each
// compress ratio and around the SWA window must not change any logit (beyond fp32 summation order).
#include <gtest/gtest.h>

#include <set>

#include "backend/cpu/cpu_backend.h"
#include "fixture_util.h"

namespace dsv4::test {
namespace {

TEST(PrefixConsistency, SplitsAtWindowBoundaries) {
  auto cases = fixture_cases();
  ASSERT_FALSE(cases.empty());
  for (const std::string& name : {std::string("flash_bf16"), std::string("pro_fp8")}) {
    if (std::find(cases.begin(), cases.end(), name) == cases.end()) {
      ADD_FAILURE() << "fixture " << name << " missing";
      continue;
    }
    const std::string dir = fixtures_dir() + "/" + name;
    auto ids = read_bin<int32_t>(dir + "/ids.bin");
    Model m(dir, make_cpu_backend(), Numerics::Reference);
    const auto& c = m.config();
    const int T = static_cast<int>(ids.size());
    auto whole = run_logits(m, ids, 0);
    std::set<int> splits;
    std::set<int> ratios;
    for (int l = 0; l < c.n_layers; ++l)
      if (c.ratio(l) > 0) ratios.insert(c.ratio(l));
    for (int r : ratios)  // the first windows of each ratio, and one late window
      for (int k : {1, 2, 5})
        for (int off : {-1, 0, 1}) splits.insert(k * r + off);
    for (int off : {-1, 0, 1}) splits.insert(c.window + off), splits.insert(2 * c.window + off);
    const float tol = 2e-5f * max_abs(whole);
    for (int s : splits) {
      if (s <= 0 || s >= T) continue;
      // prefill(s) then the rest one token at a time for the next few positions, then one chunk.
      std::vector<int> b{s, s + 1, s + 2, s + 3};
      auto got = run_logits(m, ids, 0, b);
      float err = max_abs_diff(got, whole);
      EXPECT_LE(err, tol) << name << ": split at " << s;
    }
    std::printf("[prefix] %s: %zu split points checked\n", name.c_str(), splits.size());
  }
}

}  // namespace
}  // namespace dsv4::test
