// The MTP block (mtp.0.*) vs its golden (tools/oracle/make_mtp_golden.py: HF with the MTP block wired in by hooks):
// row t = MTP logits from position t's main streams and token t+1, for every chunking.
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "fixture_util.h"

namespace dsv4::test {
namespace {

TEST(Mtp, MatchesGoldenForEveryChunking) {
  int cases = 0;
  for (const auto& name : fixture_cases()) {
    const std::string dir = fixtures_dir() + "/" + name;
    if (!std::filesystem::exists(dir + "/mtp_logits.bin")) continue;
    ++cases;
    auto ids = read_bin<int32_t>(dir + "/ids.bin");
    auto golden = read_bin<float>(dir + "/mtp_logits.bin");
    Model m(dir, make_cpu_backend(), Numerics::Reference);
    ASSERT_TRUE(m.weights().mtp.has_value());
    const int T = static_cast<int>(ids.size()) - 1;  // the last position has no next token
    const size_t V = static_cast<size_t>(m.config().vocab_size);
    ASSERT_EQ(golden.size(), static_cast<size_t>(T) * V);
    const float tol = 1e-4f * max_abs(golden);
    for (int chunk : {T, 1, 7}) {
      Forward fwd(m, chunk);
      auto st = m.backend().new_sequence(T);
      std::vector<float> out(static_cast<size_t>(T) * V), main(static_cast<size_t>(chunk) * V);
      for (int p = 0; p < T; p += chunk) {
        int n = std::min(chunk, T - p);
        fwd.forward(*st, ids.data() + p, n, p, main.data());
        fwd.forward_mtp(*st, ids.data() + p + 1, n, p, out.data() + static_cast<size_t>(p) * V);
      }
      float err = max_abs_diff(out, golden);
      std::printf("[mtp] %-12s chunk=%-4d max|diff|=%.3g (tol %.3g)\n", name.c_str(), chunk, err, tol);
      EXPECT_LE(err, tol) << name << " chunk " << chunk;
    }
  }
  EXPECT_GE(cases, 1) << "no fixture has mtp_logits.bin";
}

}  // namespace
}  // namespace dsv4::test
