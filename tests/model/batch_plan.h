#pragma once
// The batched-decode plan shared by the CPU (tests/model/batch_test.cpp) and CUDA (tests/cuda/decode_test.cpp)
// tests: several sequences at different positions, decoded alone with forward() and together with forward_batch().
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "fixture_util.h"

namespace dsv4::test {

// Sequence s: the fixture ids shifted by s (distinct token streams), prefilled with prefill[s] tokens as one chunk,
// then decoded one token per step. Step k batches the sequences with (k + s) % 4 != 3, so batch membership and the
// sequences' relative positions change as they go.
struct Plan {
  std::vector<std::vector<int32_t>> toks;
  std::vector<int> prefill;
  int steps = 0;
};

inline Plan make_plan(const std::vector<int32_t>& ids, int vocab) {
  Plan p;
  p.prefill = {0, 1, 3, 14, 15, 16, 31, 47};  // around ratio 4/16 and window 16 boundaries
  p.steps = 40;
  for (size_t s = 0; s < p.prefill.size(); ++s) {
    std::vector<int32_t> t(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) t[i] = static_cast<int32_t>((ids[i] + 37 * s) % static_cast<size_t>(vocab));
    p.toks.push_back(std::move(t));
  }
  return p;
}

// logits[s][k] after sequence s's k-th decoded token, computed alone: prefill chunk, then forward() one at a time.
inline std::vector<std::vector<std::vector<float>>> alone(Model& m, const Plan& p) {
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  Forward fwd(m, 64);
  std::vector<std::vector<std::vector<float>>> out(p.toks.size());
  for (size_t s = 0; s < p.toks.size(); ++s) {
    auto st = m.backend().new_sequence(256);
    std::vector<float> lg(V);
    if (p.prefill[s] > 0) fwd.forward(*st, p.toks[s].data(), p.prefill[s], 0, lg.data(), true);
    for (int k = 0; k < p.steps; ++k) {
      const int64_t pos = p.prefill[s] + k;
      fwd.forward(*st, &p.toks[s][static_cast<size_t>(pos)], 1, pos, lg.data());
      out[s].push_back(lg);
    }
  }
  return out;
}

// The same decodes through forward_batch; returns the number of rows that were not bit-identical, and the worst
// difference relative to max|logit|.
inline std::pair<int, float> batched(Model& m, const Plan& p, const std::vector<std::vector<std::vector<float>>>& want) {
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  const size_t S = p.toks.size();
  Forward fwd(m, 64);
  std::vector<std::unique_ptr<SequenceState>> sts;
  std::vector<float> lg(V);
  for (size_t s = 0; s < S; ++s) {
    sts.push_back(m.backend().new_sequence(256));
    if (p.prefill[s] > 0) fwd.forward(*sts[s], p.toks[s].data(), p.prefill[s], 0, lg.data(), true);
  }
  std::vector<int> done(S, 0);
  int differ = 0;
  float worst = 0;
  std::vector<float> out(S * V);
  for (int k = 0; k < 2 * p.steps; ++k) {
    std::vector<SequenceState*> rows;
    std::vector<int32_t> ids;
    std::vector<int64_t> pos;
    std::vector<size_t> who;
    for (size_t s = 0; s < S; ++s) {
      if ((k + static_cast<int>(s)) % 4 == 3 || done[s] == p.steps) continue;
      const int64_t ps = p.prefill[s] + done[s];
      rows.push_back(sts[s].get());
      ids.push_back(p.toks[s][static_cast<size_t>(ps)]);
      pos.push_back(ps);
      who.push_back(s);
    }
    if (rows.empty()) continue;
    fwd.forward_batch(rows.data(), ids.data(), pos.data(), static_cast<int>(rows.size()), out.data());
    for (size_t r = 0; r < who.size(); ++r) {
      const auto& w = want[who[r]][static_cast<size_t>(done[who[r]])];
      std::vector<float> got(out.begin() + static_cast<long>(r * V), out.begin() + static_cast<long>((r + 1) * V));
      if (std::memcmp(got.data(), w.data(), V * 4) != 0) ++differ;
      worst = std::max(worst, max_abs_diff(got, w) / max_abs(w));
      ++done[who[r]];
    }
  }
  for (size_t s = 0; s < S; ++s) EXPECT_EQ(done[s], p.steps) << "sequence " << s << " did not finish";
  return {differ, worst};
}

}  // namespace dsv4::test
