// CUDA decode features against their CPU-side contracts: sequence-state snapshots (Session prefix reuse), the MTP
// block vs its golden, and decode-step CUDA graphs vs eager launches (bit-identical logits) with per-token timings.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "../model/batch_plan.h"
#include "../model/fixture_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops.h"
#include "core/error.h"
#include "dsv4/engine.h"
#include "model/synthetic_weights.h"
#include "numeric/quant_sim.h"

namespace dsv4::test {
namespace {

std::vector<int32_t> prefix(const std::vector<int32_t>& v, size_t n) { return {v.begin(), v.begin() + static_cast<long>(n)}; }

// The CPU session test (tests/runtime/session_test.cpp) on the CUDA backend: after sync(A), sync(B) restores a
// snapshot and recomputes only past it, and B's logits match a fresh session's to rel L2 <= 1e-5 (reference
// numerics; 1e-6 until the prefill GEMM: a chunk of >= 16 tokens runs the tensor-core GEMM, a shorter recomputed tail
// the GEMV, whose fp32 sums differ in order — measured 2.9e-6 and 3.6e-6 on flash_fp8). Not bit for bit: measured on one H200, about half of the rollbacks (and a full recompute of A after
// another sequence ran in the same session) differ from a fresh session by rel L2 1e-7..3e-7 even with identical
// chunk boundaries, i.e. some CUDA kernel's result depends on memory a previous sequence left behind (scratch or
// cache rows past the live ones). Open: find it; the bit-equal count is printed so the fix shows.
TEST(CudaSession, PrefixReuseMatchesFreshSession) {
  for (auto [name, chunk] : {std::pair<const char*, int>{"flash_fp8", 64}, {"pro_fp8", 5}}) {
    EngineOptions o;
    o.model_dir = fixtures_dir() + "/" + name;
    o.backend = "cuda";
    o.max_context = 512;
    o.prefill_chunk = chunk;
    auto e = Engine::load(o);
    auto ids = read_bin<int32_t>(o.model_dir + "/ids.bin");
    auto fresh = [&](const std::vector<int32_t>& toks) {
      auto s = e->new_session();
      s->sync(toks);
      return s->logits();
    };
    auto s = e->new_session();
    s->sync(ids);
    int bit_equal = 0, cases = 0;
    for (size_t cut : {size_t{3}, size_t{16}, size_t{31}, size_t{64}, size_t{65}, size_t{100}}) {
      std::vector<int32_t> b = prefix(ids, cut);
      b.push_back((ids[cut] + 1) % 200 + 2);
      b.push_back(ids[cut]);
      s->sync(b);
      EXPECT_LE(s->last_computed(), static_cast<int64_t>(cut % 64 + 2)) << name << ": did not reuse the prefix at " << cut;
      const auto want = fresh(b);
      const bool same = std::memcmp(s->logits().data(), want.data(), want.size() * 4) == 0;
      EXPECT_LE(rel_l2(s->logits(), want), 1e-5) << name << " cut " << cut;
      bit_equal += same, ++cases;
      s->sync(ids);
      const auto wantA = fresh(ids);
      EXPECT_LE(rel_l2(s->logits(), wantA), 1e-5) << name << " back from " << cut;
    }
    // Divergence near the end: the tail snapshot is restored (different chunk boundaries than a fresh run).
    std::vector<int32_t> near_end = prefix(ids, ids.size() - 6);
    near_end.push_back((ids[ids.size() - 6] + 1) % 200 + 2);
    s->sync(near_end);
    EXPECT_LE(s->last_computed(), 11) << name << ": tail snapshot not used";
    const auto want_ne = fresh(near_end);
    const double r = rel_l2(s->logits(), want_ne);
    const bool same_ne = std::memcmp(s->logits().data(), want_ne.data(), want_ne.size() * 4) == 0;
    EXPECT_LE(r, 1e-5) << name;
    // Decode after a rollback (graph replays on restored state) = the fresh session's decode.
    s->append(ids[ids.size() - 5]);
    EXPECT_EQ(s->last_computed(), 1);
    near_end.push_back(ids[ids.size() - 5]);
    const double r2 = rel_l2(s->logits(), fresh(near_end));
    EXPECT_LE(r2, 1e-5) << name;
    std::printf("[cuda-session] %-10s chunk %-3d snapshot rollbacks bit-equal %d/%d; tail rollback rel L2 %.3g (%s), then decode %.3g\n",
                name, chunk, bit_equal, cases, r, same_ne ? "bit-equal" : "differs", r2);
  }
}

// Speculative decoding on CUDA (tests/runtime/speculative_test.cpp's CPU test, here against a plain CUDA session):
// verified pairs [token, draft] -- the draft accepted or dropped at random, across window wraps and compressor
// emissions (ratios 4 and 16) -- leave the session where plain appends leave it. Reference numerics, the pair as the
// recorded two-row step (CudaBackend::pair_rows, the default) and as a two-token chunk (set_pair_rows_reference
// off); rel L2 <= 1e-5 per step: the pair's and the plain step's fp32 sums differ only in order (the CudaSession test
// above: ~3e-6; session 26: 2.5e-6 as rows); a wrong rollback of a compressor's state or count shows as O(1) errors.
// At Flash shapes: FlashShapedRecordedPairsMatchPlainSteps*.
void verified_pairs_match_plain_appends(bool pair_rows) {
  const bool was = cuda::pair_rows_reference_enabled();
  cuda::set_pair_rows_reference(pair_rows);
  struct Back {
    bool was;
    ~Back() { cuda::set_pair_rows_reference(was); }
  } back{was};
  auto load = [](const std::string& spec) {
    EngineOptions o;
    o.model_dir = fixtures_dir() + "/flash_fp8";
    o.backend = "cuda";
    o.max_context = 512;
    o.prefill_chunk = 64;
    o.speculative = spec;
    return Engine::load(o);
  };
  auto pe = load("none"), se = load("mtp");
  const int V = static_cast<int>(pe->info().vocab_size);
  auto ids = read_bin<int32_t>(fixtures_dir() + "/flash_fp8/ids.bin");
  auto plain = pe->new_session(), spec = se->new_session();
  plain->sync(prefix(ids, 21));
  spec->sync(prefix(ids, 21));
  std::mt19937 rng(7);
  std::vector<int32_t> S(300);
  for (auto& t : S) t = static_cast<int32_t>(rng() % static_cast<unsigned>(V));
  int accepted = 0, dropped = 0, drafts = 0;
  double worst = 0;
  size_t k = 0;
  while (k + 1 < S.size() && spec->tokens().size() + 2 < 480) {
    if (rng() % 3 == 0 && spec->draft(S[k]) >= 0) ++drafts;
    const int64_t n = static_cast<int64_t>(spec->tokens().size());
    if ((n + 1) % 64 == 0) {
      spec->append(S[k]);
      plain->append(S[k]);
      ++k;
    } else {
      const bool accept = rng() % 2 == 0;
      spec->append_verify(S[k], accept ? S[k + 1] : (S[k + 1] + 1 + static_cast<int32_t>(rng() % 7)) % V);
      plain->append(S[k]);
      worst = std::max(worst, rel_l2(spec->logits(), plain->logits()));
      spec->resolve_draft(accept);
      if (accept) plain->append(S[k + 1]), ++accepted, k += 2;
      else ++dropped, ++k;
    }
    ASSERT_EQ(plain->tokens(), spec->tokens());
    const double r = rel_l2(spec->logits(), plain->logits());
    worst = std::max(worst, r);
    ASSERT_LE(r, 1e-5) << "after " << spec->tokens().size() << " tokens";
  }
  std::printf("[cuda-speculative] pair as %s: %d accepted, %d dropped, %d MTP drafts, %zu tokens, worst rel L2 %.3g\n",
              pair_rows ? "rows" : "a chunk", accepted, dropped, drafts, spec->tokens().size(), worst);
  EXPECT_GT(accepted, 50);
  EXPECT_GT(dropped, 50);
  EXPECT_GT(drafts, 30);
}
TEST(CudaSpeculative, VerifiedPairsMatchPlainAppends) { verified_pairs_match_plain_appends(true); }
TEST(CudaSpeculative, VerifiedPairsAsChunksMatchPlainAppends) { verified_pairs_match_plain_appends(false); }

// The verify pair at Flash shapes (4 synthetic layers: SWA, SWA, CSA, HCA; window 128, top-512, HCA ratio 128; official
// numerics, where Forward::forward_pair runs the recorded two-row step -- CudaBackend::pair_rows): pairs of a sequence
// from position 100 to past 300 (window wraps, every compressor emitting at either row), the draft kept or dropped at
// random, single steps between them, against a twin sequence fed the same tokens one by one. The pairs recorded as
// graphs vs launched op by op (CudaOptions::decode_graphs off) and vs a second recorded run: bit for bit, and the
// recorded backend replayed them. Vs the twin's plain steps: rel L2 <= 5e-2 -- the rows' multi-token GEMVs sum in
// other orders than the single-token ones and official numerics amplify that on random weights (measured ~1.7e-2 from
// the first pair on); a row that sees the other row's entry, or a bad rollback, is O(1).
struct PairRun {
  std::vector<std::vector<float>> rows;  // the kept rows' logits, in order
  std::vector<int64_t> row_pos;
  double worst = 0;                      // vs the twin's plain steps
  int kept = 0, dropped = 0, pair_replays = 0;
};
PairRun flash_shaped_pairs(Numerics nm, bool graphs) {
  PairRun out;
  SyntheticCheckpoint syn = make_synthetic_checkpoint("flash", 4);
  const ModelConfig cfg = syn.cfg;
  Model m(cfg, std::move(syn.ckpt), make_cuda_backend(CudaOptions{graphs}), nm);
  const size_t V = static_cast<size_t>(cfg.vocab_size);
  std::mt19937 rng(5);
  std::vector<int32_t> toks(400);
  for (auto& t : toks) t = static_cast<int32_t>(rng() % 100000u + 100u);
  Forward pre(m, 64), one(m, 1), pair(m, 2);
  auto st = m.backend().new_sequence(512), twin = m.backend().new_sequence(512);
  std::vector<float> l1(V), l2(2 * V);
  for (int64_t p0 = 0; p0 < 100; p0 += 50) {
    pre.forward(*st, toks.data() + p0, 50, p0, l1.data(), true);
    pre.forward(*twin, toks.data() + p0, 50, p0, l1.data(), true);
  }
  int64_t p = 100;
  while (p < 320) {
    const size_t i = static_cast<size_t>(p);
    if (rng() % 4 == 0) {  // a plain step between pairs (the sequence's single-token graph)
      one.forward(*st, &toks[i], 1, p, l1.data());
      one.forward(*twin, &toks[i], 1, p, l1.data());
      ++p;
      continue;
    }
    const bool keep = rng() % 2 == 0;
    const int32_t ids[2] = {toks[i], keep ? toks[i + 1] : toks[i + 1] + 1};
    st->prepare_drop_last();
    const int before = cuda_graph_stats(m.backend()).replays;
    pair.forward_pair(*st, ids, p, l2.data());
    out.pair_replays += cuda_graph_stats(m.backend()).replays - before;
    if (!keep) st->drop_last();
    const int rows = keep ? 2 : 1;
    for (int r = 0; r < rows; ++r) {
      one.forward(*twin, &toks[i + static_cast<size_t>(r)], 1, p + r, l1.data());
      std::vector<float> row(l2.begin() + static_cast<long>(r * V), l2.begin() + static_cast<long>((r + 1) * V));
      out.worst = std::max(out.worst, rel_l2(row, l1));
      out.rows.push_back(std::move(row));
      out.row_pos.push_back(p + r);
    }
    EXPECT_EQ(st->tokens(), p + rows);
    keep ? ++out.kept : ++out.dropped;
    p += rows;
  }
  return out;
}

int64_t first_differing(const PairRun& a, const PairRun& b, int* count) {
  int64_t first = -1;
  *count = 0;
  for (size_t r = 0; r < a.rows.size() && r < b.rows.size(); ++r)
    if (std::memcmp(a.rows[r].data(), b.rows[r].data(), a.rows[r].size() * 4) != 0) {
      ++*count;
      if (first < 0) first = a.row_pos[r];
    }
  return first;
}

// Reference numerics (the pair as rows: cuda::set_pair_rows_reference, the default): vs the plain steps the rows differ
// by fp32 summation order alone (session 26: 2.2e-7), so the limit is 1e-4 there.
void flash_shaped_recorded_pairs_match_plain_steps(Numerics nm) {
  const bool was = cuda::pair_rows_reference_enabled();
  cuda::set_pair_rows_reference(true);
  const PairRun e = flash_shaped_pairs(nm, false), g = flash_shaped_pairs(nm, true), g2 = flash_shaped_pairs(nm, true);
  cuda::set_pair_rows_reference(was);
  int d_eg = 0, d_gg = 0;
  const int64_t f_eg = first_differing(e, g, &d_eg), f_gg = first_differing(g, g2, &d_gg);
  std::printf("[cuda-speculative] Flash-shaped pairs, %s: %d kept %d dropped; vs plain steps worst rel L2: eager "
              "%.3g, recorded %.3g, recorded again %.3g; eager vs recorded %d rows differ (first at %lld), recorded vs "
              "recorded %d (first at %lld); pair replays %d\n",
              numerics_name(nm), g.kept, g.dropped, e.worst, g.worst, g2.worst, d_eg, (long long)f_eg, d_gg,
              (long long)f_gg, g.pair_replays);
  EXPECT_EQ(d_eg, 0);
  EXPECT_EQ(d_gg, 0);
  EXPECT_GT(g.kept, 20);
  EXPECT_GT(g.dropped, 20);
  EXPECT_EQ(e.pair_replays, 0);
  EXPECT_EQ(g.pair_replays, g.kept + g.dropped - 2) << "the pairs were not replayed (the first runs eagerly, the second is recorded)";
  EXPECT_LE(std::max(e.worst, g.worst), nm == Numerics::Reference ? 1e-4 : 5e-2);
}
TEST(CudaSpeculative, FlashShapedRecordedPairsMatchPlainSteps) { flash_shaped_recorded_pairs_match_plain_steps(Numerics::Official); }
TEST(CudaSpeculative, FlashShapedRecordedPairsMatchPlainStepsReference) {
  flash_shaped_recorded_pairs_match_plain_steps(Numerics::Reference);
}

// Single-token decode graphs at Flash shapes (the same 4 synthetic layers, both numerics, the compressor / indexer side
// branches on): 160 steps from position 100, recorded twice and launched op by op. Two recorded runs: bit for bit (a
// race shows here); a third recorded run with the indexer's scores and top-k as two launches: bit for bit too.
// Recorded vs eager: printed, and within rel L2 1e-4 (reference) / 5e-2 (official) per step.
void flash_shaped_steps_recorded_match_eager(Numerics nm) {
  {
    std::vector<std::vector<float>> got[4];
    for (int g = 0; g < 4; ++g) {
      cuda::set_indexer_fused(g != 3);  // run 3: recorded, the indexer's scores and top-k as two launches
      SyntheticCheckpoint syn = make_synthetic_checkpoint("flash", 4);
      const ModelConfig cfg = syn.cfg;
      Model m(cfg, std::move(syn.ckpt), make_cuda_backend(CudaOptions{g >= 1}), nm);
      const size_t V = static_cast<size_t>(cfg.vocab_size);
      std::mt19937 rng(5);
      std::vector<int32_t> toks(300);
      for (auto& t : toks) t = static_cast<int32_t>(rng() % 100000u + 100u);
      Forward pre(m, 64), one(m, 1);
      auto st = m.backend().new_sequence(512);
      std::vector<float> l1(V);
      for (int64_t p0 = 0; p0 < 100; p0 += 50) pre.forward(*st, toks.data() + p0, 50, p0, l1.data(), true);
      for (int64_t p = 100; p < 260; ++p) {
        one.forward(*st, &toks[static_cast<size_t>(p)], 1, p, l1.data());
        got[g].push_back(l1);
      }
    }
    cuda::set_indexer_fused(true);
    auto differ = [&](int x, int y, int64_t* first, double* worst) {
      int d = 0;
      *first = -1, *worst = 0;
      for (size_t r = 0; r < got[x].size(); ++r) {
        *worst = std::max(*worst, rel_l2(got[x][r], got[y][r]));
        if (std::memcmp(got[x][r].data(), got[y][r].data(), got[x][r].size() * 4) != 0) {
          ++d;
          if (*first < 0) *first = 100 + static_cast<int64_t>(r);
        }
      }
      return d;
    };
    int64_t f_eg, f_gg;
    double w_eg, w_gg;
    int64_t f_fu;
    double w_fu;
    const int d_eg = differ(0, 1, &f_eg, &w_eg), d_gg = differ(1, 2, &f_gg, &w_gg), d_fu = differ(1, 3, &f_fu, &w_fu);
    std::printf("[cuda-graph] Flash-shaped single steps, %s: recorded vs eager %d of %zu differ (first at %lld, worst "
                "rel L2 %.3g); recorded vs recorded %d differ (first at %lld, worst %.3g)\n",
                numerics_name(nm), d_eg, got[0].size(), (long long)f_eg, w_eg, d_gg, (long long)f_gg, w_gg);
    EXPECT_EQ(d_gg, 0) << numerics_name(nm);
    EXPECT_EQ(d_fu, 0) << numerics_name(nm) << ": the fused indexer (64 heads) vs its two launches, first at " << f_fu
                       << ", worst rel L2 " << w_fu;
    EXPECT_LE(w_eg, nm == Numerics::Reference ? 1e-4 : 5e-2) << numerics_name(nm);
  }
}
TEST(CudaGraph, FlashShapedStepsRecordedMatchEagerReference) { flash_shaped_steps_recorded_match_eager(Numerics::Reference); }
TEST(CudaGraph, FlashShapedStepsRecordedMatchEagerOfficial) { flash_shaped_steps_recorded_match_eager(Numerics::Official); }

// MTP draft logits on CUDA vs the golden (HF with the MTP block), reference numerics, every chunking (chunk 1 runs
// the main steps through decode graphs, the MTP block eagerly).
TEST(CudaMtp, MatchesGoldenForEveryChunking) {
  int cases = 0;
  for (const auto& name : fixture_cases()) {
    const std::string dir = fixtures_dir() + "/" + name;
    if (!std::filesystem::exists(dir + "/mtp_logits.bin")) continue;
    ++cases;
    auto ids = read_bin<int32_t>(dir + "/ids.bin");
    auto golden = read_bin<float>(dir + "/mtp_logits.bin");
    Model m(dir, make_cuda_backend(), Numerics::Reference);
    ASSERT_TRUE(m.weights().mtp.has_value());
    const int T = static_cast<int>(ids.size()) - 1;
    const size_t V = static_cast<size_t>(m.config().vocab_size);
    ASSERT_EQ(golden.size(), static_cast<size_t>(T) * V);
    const float tol = 1e-4f * max_abs(golden);
    for (int chunk : {T, 1, 7}) {
      Forward fwd(m, chunk);
      auto st = m.backend().new_sequence(T);
      std::vector<float> out(static_cast<size_t>(T) * V), main(static_cast<size_t>(chunk) * V);
      for (int p = 0; p < T; p += chunk) {
        const int n = std::min(chunk, T - p);
        fwd.forward(*st, ids.data() + p, n, p, main.data());
        fwd.forward_mtp(*st, ids.data() + p + 1, n, p, out.data() + static_cast<size_t>(p) * V);
      }
      const float err = max_abs_diff(out, golden);
      std::printf("[cuda-mtp] %-12s chunk=%-4d max|diff|=%.3g (tol %.3g) rel L2 %.3g\n", name.c_str(), chunk, err, tol,
                  rel_l2(out, golden));
      EXPECT_LE(err, tol) << name << " chunk " << chunk;
    }
  }
  EXPECT_GE(cases, 1) << "no fixture has mtp_logits.bin";
}

// Logits of `ids` fed as: a prefill chunk of `pre` tokens, then single-token steps, with another 5-token chunk in the
// middle (a larger chunk after recordings exist makes scratch grow, which must re-record, not replay stale addresses).
std::vector<float> decode_logits(Model& m, const std::vector<int32_t>& ids, int pre) {
  const int T = static_cast<int>(ids.size());
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  Forward fwd(m, std::max(pre, 5));
  auto st = m.backend().new_sequence(T);
  std::vector<float> out(static_cast<size_t>(T) * V);
  int p = 0;
  if (pre > 0) fwd.forward(*st, ids.data(), pre, 0, out.data()), p = pre;
  const int mid = (T + p) / 2;
  while (p < T) {
    const int n = (p == mid && p + 5 <= T) ? 5 : 1;
    fwd.forward(*st, ids.data() + p, n, p, out.data() + static_cast<size_t>(p) * V);
    p += n;
  }
  return out;
}

// Graph replay vs eager launches: the same kernels read the position from device memory instead of an argument and
// attention recomputes its split from the actual row count, so the logits must be bit-identical, in both numerics.
TEST(CudaGraph, ReplayIsBitIdenticalToEager) {
  for (const auto& name : fixture_cases()) {
    const std::string dir = fixtures_dir() + "/" + name;
    auto ids = read_bin<int32_t>(dir + "/ids.bin");
    for (Numerics nm : {Numerics::Reference, Numerics::Official})
      for (int pre : {0, 9}) {
        Model eager(dir, make_cuda_backend(CudaOptions{false}), nm);
        Model graph(dir, make_cuda_backend(), nm);
        const auto want = decode_logits(eager, ids, pre);
        const auto got = decode_logits(graph, ids, pre);
        const CudaGraphStats gs = cuda_graph_stats(graph.backend());
        std::printf("[cuda-graph] %-12s %-9s prefill %-2d captures %d replays %d  %s\n", name.c_str(), numerics_name(nm),
                    pre, gs.captures, gs.replays, std::memcmp(got.data(), want.data(), want.size() * 4) == 0 ? "bit-identical" : "DIFFERENT");
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
            << name << " " << numerics_name(nm) << " prefill " << pre << ": rel L2 " << rel_l2(got, want);
        EXPECT_GE(gs.captures, 1) << name;
        EXPECT_GE(gs.replays, static_cast<int>(ids.size()) / 2) << name;
        EXPECT_EQ(cuda_graph_stats(eager.backend()).replays, 0);
      }
  }
}

// The decode fusions (the window store and attn_out's inverse RoPE in the attention's merge kernel, the mHC Sinkhorn
// deferred to the posts or to the router's / norm_rope2's extra blocks, the MoE sum in the next post, the indexer's
// scores and top-k as one launch, wq_b and the indexer's wq_b as one GEMV, gate/up's shared walk before its wait, the page-locked transfers) and the compressor / indexer side stream against the same model with all of them off:
// bit-identical logits, eager and graph, both numerics -- this covers CudaBackend's per-call choices (window_store
// skipping the row attend already stored, attn_out skipping its norm_rope, the fork and join around the compressor
// and indexer ops, and for batched decode the re-fork per row). On these tiny fixtures (hc_mult 4) all of them
// engage at every single-token step.
TEST(CudaGraph, DecodeFusionsAreBitIdentical) {
  const bool pinned0 = cuda::pinned_io_enabled();  // an opt-in switch: restored at the end, not set on
  auto set_all = [](bool on) {
    cuda::set_attend_store_fuse(on);
    cuda::set_attend_rows_early(on);
    cuda::set_attn_fork(on);
    cuda::set_attend_derope_fuse(on);
    cuda::set_hc_defer_sinkhorn(on);
    cuda::set_expert_stage_batch(on);
    cuda::set_expert_x_early(on);
    cuda::set_indexer_fused(on);
    cuda::set_wqb_stack(on);
    cuda::set_comp_beside(on);
    cuda::set_topk_main(on);
    cuda::set_pinned_io(on);
  };
  for (const std::string name : {"flash_fp8", "pro_fp8", "flash_bf16"}) {
    const std::string dir = fixtures_dir() + "/" + name;
    const auto ids = read_bin<int32_t>(dir + "/ids.bin");
    for (Numerics nm : {Numerics::Reference, Numerics::Official})
      for (bool graphs : {false, true}) {
        std::vector<float> want, got;
        set_all(false);
        {
          Model m(dir, make_cuda_backend(CudaOptions{graphs}), nm);
          want = decode_logits(m, ids, 9);
        }
        set_all(true);
        {
          Model m(dir, make_cuda_backend(CudaOptions{graphs}), nm);
          got = decode_logits(m, ids, 9);
        }
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
            << name << " " << numerics_name(nm) << (graphs ? " graphs" : " eager") << ": rel L2 " << rel_l2(got, want);
        cuda::set_attn_lazy_fork(false);  // every branch forked and joined (the fork on)
        {
          Model m(dir, make_cuda_backend(CudaOptions{graphs}), nm);
          got = decode_logits(m, ids, 9);
        }
        cuda::set_attn_lazy_fork(true);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
            << name << " " << numerics_name(nm) << (graphs ? " graphs" : " eager") << " eager fork: rel L2 " << rel_l2(got, want);
        // The deferred combs finished by the posts themselves (not by the router's / norm_rope2's extra blocks), and
        // the expert rows summed by moe_reduce (not by the next post).
        cuda::set_router_sinkhorn(false), cuda::set_norm_sinkhorn(false), cuda::set_hc_moe_sum(false);
        {
          Model m(dir, make_cuda_backend(CudaOptions{graphs}), nm);
          got = decode_logits(m, ids, 9);
        }
        cuda::set_router_sinkhorn(true), cuda::set_norm_sinkhorn(true), cuda::set_hc_moe_sum(true);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
            << name << " " << numerics_name(nm) << (graphs ? " graphs" : " eager") << " posts' own Sinkhorn: rel L2 "
            << rel_l2(got, want);
        // Everything on but one switch (set(false) for the run, then set(true) again).
        auto all_but = [&](void (*set)(bool), const char* what) {
          set(false);
          {
            Model m(dir, make_cuda_backend(CudaOptions{graphs}), nm);
            got = decode_logits(m, ids, 9);
          }
          set(true);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
              << name << " " << numerics_name(nm) << (graphs ? " graphs" : " eager") << " " << what << ": rel L2 "
              << rel_l2(got, want);
        };
        all_but(cuda::set_wqb_stack, "two wq_b GEMVs (DSV4_WQB_STACK=0)");
        all_but(cuda::set_topk_main, "the indexer's scores + top-k on its branch (DSV4_TOPK_MAIN=0)");
      }
    // Batched decode (forward_batch: the per-row matching of stored / de-roped rows), fusions off vs on, bit for bit.
    for (Numerics nm : {Numerics::Reference, Numerics::Official}) {
      std::vector<std::vector<std::vector<float>>> rows[2];
      for (int on = 0; on < 2; ++on) {
        set_all(on == 1);
        Model m(dir, make_cuda_backend(), nm);
        const Plan p = make_plan(ids, static_cast<int>(m.config().vocab_size));
        rows[on].assign(p.toks.size(), std::vector<std::vector<float>>(static_cast<size_t>(p.steps)));
        const size_t V = static_cast<size_t>(m.config().vocab_size);
        Forward fwd(m, 64);
        std::vector<std::unique_ptr<SequenceState>> sts;
        std::vector<float> lg(V), out(p.toks.size() * V);
        for (size_t q = 0; q < p.toks.size(); ++q) {
          sts.push_back(m.backend().new_sequence(256));
          if (p.prefill[q] > 0) fwd.forward(*sts[q], p.toks[q].data(), p.prefill[q], 0, lg.data(), true);
        }
        for (int k = 0; k < p.steps; ++k) {  // every sequence, every step
          std::vector<SequenceState*> rs;
          std::vector<int32_t> tk;
          std::vector<int64_t> ps;
          for (size_t q = 0; q < p.toks.size(); ++q) {
            rs.push_back(sts[q].get());
            ps.push_back(p.prefill[q] + k);
            tk.push_back(p.toks[q][static_cast<size_t>(ps.back())]);
          }
          fwd.forward_batch(rs.data(), tk.data(), ps.data(), static_cast<int>(rs.size()), out.data());
          for (size_t q = 0; q < p.toks.size(); ++q)
            rows[on][q][static_cast<size_t>(k)].assign(out.begin() + static_cast<long>(q * V), out.begin() + static_cast<long>((q + 1) * V));
        }
      }
      for (size_t q = 0; q < rows[0].size(); ++q)
        for (size_t k = 0; k < rows[0][q].size(); ++k)
          EXPECT_EQ(std::memcmp(rows[1][q][k].data(), rows[0][q][k].data(), rows[0][q][k].size() * 4), 0)
              << name << " " << numerics_name(nm) << " batched: sequence " << q << " step " << k;
    }
  }
  set_all(true);
  cuda::set_pinned_io(pinned0);
}

// The error flag a kernel raises on invalid input reaches the caller through either transfer path (DSV4_PINNED_IO:
// the flag read behind the stream's work from page-locked memory, or a separate read): the attention of a CSA layer
// given a top-k entry the sequence cannot see must make synchronize() throw, once, and leave the backend usable.
TEST(CudaBackendIo, KernelErrorReachesTheCallerOnBothTransferPaths) {
  const std::string dir = fixtures_dir() + "/flash_fp8";
  const auto ids = read_bin<int32_t>(dir + "/ids.bin");
  const bool pinned0 = cuda::pinned_io_enabled();
  for (bool pinned : {true, false}) {
    cuda::set_pinned_io(pinned);
    Model m(dir, make_cuda_backend(), Numerics::Official);
    const ModelConfig& c = m.config();
    int csa = -1;
    for (int l = 0; l < c.n_layers && csa < 0; ++l)
      if (c.kind(l) == AttnKind::CSA) csa = l;
    ASSERT_GE(csa, 0) << "flash_fp8 has no CSA layer";
    const int pre = 32;
    ASSERT_GE(static_cast<int>(ids.size()), pre);
    Forward fwd(m, pre);
    auto st = m.backend().new_sequence(256);
    std::vector<float> lg(static_cast<size_t>(c.vocab_size));
    fwd.forward(*st, ids.data(), pre, 0, lg.data(), true);  // compressed entries exist; the step at pre sees pre / ratio
    Backend& b = m.backend();
    const size_t K = static_cast<size_t>(c.index_topk), qd = static_cast<size_t>(c.n_heads * c.head_dim);
    float* q = b.alloc_f32(qd);
    float* kv = b.alloc_f32(static_cast<size_t>(c.head_dim));
    float* o = b.alloc_f32(qd);
    int32_t* topk = b.alloc_i32(K);
    std::vector<int32_t> sel(K, -1);
    sel[0] = 1 << 20;  // far past the visible entries
    b.upload_i32(topk, sel.data(), K);
    b.attend(csa, q, kv, topk, 1, pre, *st, o);
    try {
      b.synchronize();
      ADD_FAILURE() << (pinned ? "pinned" : "pageable") << ": an invisible top-k entry raised no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not visible"), std::string::npos) << e.what();
    }
    b.synchronize();  // the flag was cleared: no second report
    std::vector<int32_t> back(K);
    b.download_i32(back.data(), topk, K);
    EXPECT_EQ(back, sel) << (pinned ? "pinned" : "pageable") << " round trip";
  }
  cuda::set_pinned_io(pinned0);
}

// Batched decode across sequences (Forward::forward_batch: one token of each of up to 8 sequences at different
// positions, through ratio and window boundaries, with changing batch membership) on the CUDA backend, whose *_rows
// ops are the Backend's row loops over its single-sequence ops: every row must match its sequence decoded alone.
// Not bit for bit: the batch's n > 1 projections take the multi-token kernels (another fp32 summation order), so
// reference numerics within 1e-4 of max|logit| (the CPU backend's test demands bit-identity of its own fused rows).
TEST(CudaBatch, EveryRowMatchesItsSequenceAlone) {
  for (const std::string name : {"flash_fp8", "pro_fp8", "flash_bf16"}) {
    const std::string dir = fixtures_dir() + "/" + name;
    const auto ids = read_bin<int32_t>(dir + "/ids.bin");
    Model m(dir, make_cuda_backend(), Numerics::Reference);
    const Plan p = make_plan(ids, static_cast<int>(m.config().vocab_size));
    const auto want = alone(m, p);
    const auto [differ, worst] = batched(m, p, want);
    std::printf("[cuda-batch] %-12s rows not bit-identical: %d, max|diff|/max|logit| %.3g\n", name.c_str(), differ, worst);
    EXPECT_LE(worst, 1e-4f) << name;
  }
}

// The batched attention projections at Flash shapes (one synthetic layer, official numerics: the tensor-core GEMVs
// run, which the tiny fixtures are too small for) against the Backend's row loop over the single-row ops, 4 rows at
// positions across the window and the context: attn_qkv_rows (the wq_a|wkv pair and wq_b over the rows: each token
// the single-token kernel's bits; the norms/RoPE per row) bit for bit; attn_out_rows (wo_a of 4 rows on the FMA kernels
// vs the single-row ring GEMV: another fp32 summation order before the BF16 roundings) within rel L2 1e-2.
TEST(CudaBatch, FlashShapedRowOpsMatchTheRowLoop) {
  SyntheticCheckpoint syn = make_synthetic_checkpoint("flash", 1);
  const ModelConfig cfg = syn.cfg;
  Model m(cfg, std::move(syn.ckpt), make_cuda_backend(), Numerics::Official);
  Forward fwd(m, 4);  // sets the backend's row strides
  Backend& b = m.backend();
  const RowDims d = b.row_dims();
  constexpr int n = 4;
  const int64_t pos[n] = {5, 130, 4097, 8191};
  std::mt19937 g(3);
  auto upload = [&](size_t count, float sd, bool bf16) {
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> h(count);
    for (auto& v : h) v = nd(g);
    if (bf16) num::round_bf16(h.data(), static_cast<int64_t>(count));
    float* p = b.alloc_f32(count);
    EXPECT_EQ(cudaMemcpy(p, h.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  };
  auto get = [&](const float* p, size_t count) {
    std::vector<float> h(count);
    b.download_f32(h.data(), p, count);
    return h;
  };
  const float* x = upload(static_cast<size_t>(n * d.x), 1.0f, true);
  float *qr[2], *q[2], *kv[2];
  for (int k = 0; k < 2; ++k) {
    qr[k] = b.alloc_f32(static_cast<size_t>(n * d.qr));
    q[k] = b.alloc_f32(static_cast<size_t>(n * d.q));
    kv[k] = b.alloc_f32(static_cast<size_t>(n * d.kv));
  }
  b.attn_qkv_rows(0, x, n, pos, qr[0], q[0], kv[0]);
  b.Backend::attn_qkv_rows(0, x, n, pos, qr[1], q[1], kv[1]);
  const std::pair<float* const*, int64_t> outs[3] = {{qr, d.qr}, {q, d.q}, {kv, d.kv}};
  const char* names[3] = {"qr", "q", "kv"};
  for (int i = 0; i < 3; ++i) {
    const size_t count = static_cast<size_t>(n * outs[i].second);
    const auto a = get(outs[i].first[0], count), r = get(outs[i].first[1], count);
    EXPECT_EQ(std::memcmp(a.data(), r.data(), count * 4), 0) << names[i] << ": rel L2 " << rel_l2(a, r);
  }
  const float* o = upload(static_cast<size_t>(n * d.o), 0.05f, true);
  float* y[2] = {b.alloc_f32(static_cast<size_t>(n * d.x)), b.alloc_f32(static_cast<size_t>(n * d.x))};
  b.attn_out_rows(0, o, n, pos, y[0]);
  b.Backend::attn_out_rows(0, o, n, pos, y[1]);
  const auto ya = get(y[0], static_cast<size_t>(n * d.x)), yr = get(y[1], static_cast<size_t>(n * d.x));
  size_t differ = 0;
  for (size_t i = 0; i < ya.size(); ++i) differ += ya[i] != yr[i];
  std::printf("[cuda-batch] Flash-shaped attn_out_rows vs the row loop: rel L2 %.3g, %zu of %zu outputs differ\n",
              rel_l2(ya, yr), differ, ya.size());
  EXPECT_LE(rel_l2(ya, yr), 1e-2);
  for (float v : ya) ASSERT_TRUE(std::isfinite(v));
}

// Batched steps recorded into CUDA graphs (Backend::begin_decode_batch) vs the same steps launched op by op: every row
// bit for bit. Rows: the plan's sequences with the membership changing every step (4 patterns cycling, then the
// sequences finishing one by one: new keys, captures and least-recently-used evictions), then one stable batch of 3
// in a changed row order for many replays. The recorded backend must have replayed.
std::vector<std::vector<float>> batched_steps(Model& m, const Plan& p) {
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
  std::vector<std::vector<float>> out;
  std::vector<float> o(S * V);
  auto step = [&](const std::vector<size_t>& who) {
    std::vector<SequenceState*> rows;
    std::vector<int32_t> ids;
    std::vector<int64_t> pos;
    for (size_t s : who) {
      const int64_t ps = p.prefill[s] + done[s];
      rows.push_back(sts[s].get()), ids.push_back(p.toks[s][static_cast<size_t>(ps)]), pos.push_back(ps);
    }
    fwd.forward_batch(rows.data(), ids.data(), pos.data(), static_cast<int>(rows.size()), o.data());
    for (size_t r = 0; r < who.size(); ++r) {
      out.emplace_back(o.begin() + static_cast<long>(r * V), o.begin() + static_cast<long>((r + 1) * V));
      ++done[who[r]];
    }
  };
  const int steps = p.steps / 2;  // room left for the stable phase below
  for (int k = 0; k < 2 * steps; ++k) {
    std::vector<size_t> who;
    for (size_t s = 0; s < S; ++s)
      if ((k + static_cast<int>(s)) % 4 != 3 && done[s] < steps) who.push_back(s);
    if (who.size() >= 2) step(who);
  }
  for (int k = 0; k < 12; ++k) step({5, 1, 3});
  return out;
}

TEST(CudaBatch, RecordedStepsAreBitIdenticalToEager) {
  for (const std::string name : {"flash_fp8", "pro_fp8", "flash_bf16"}) {
    const std::string dir = fixtures_dir() + "/" + name;
    const auto ids = read_bin<int32_t>(dir + "/ids.bin");
    for (Numerics nm : {Numerics::Reference, Numerics::Official}) {
      std::vector<std::vector<float>> got[2];
      CudaGraphStats st[2];
      for (int g = 0; g < 2; ++g) {
        Model m(dir, make_cuda_backend(CudaOptions{g == 1}), nm);
        const Plan p = make_plan(ids, static_cast<int>(m.config().vocab_size));
        got[g] = batched_steps(m, p);
        st[g] = cuda_graph_stats(m.backend());
      }
      ASSERT_EQ(got[0].size(), got[1].size());
      int differ = 0;
      for (size_t r = 0; r < got[0].size(); ++r)
        differ += std::memcmp(got[0][r].data(), got[1][r].data(), got[0][r].size() * 4) != 0;
      std::printf("[cuda-batch] %-12s %-9s recorded vs eager: %d of %zu rows differ; captures %d, replays %d\n",
                  name.c_str(), numerics_name(nm), differ, got[0].size(), st[1].captures, st[1].replays);
      EXPECT_EQ(differ, 0) << name << " " << numerics_name(nm);
      EXPECT_EQ(st[0].captures + st[0].replays, 0);
      EXPECT_GE(st[1].replays, 20) << name << ": the batched steps were not replayed";
    }
  }
}

// The same at Flash shapes (4 synthetic layers: SWA, SWA, CSA, HCA; official numerics, so the multi-token tensor-core
// GEMVs and the Flash attention kernels run), 4 sequences at positions across the HCA ratio (128) and the window,
// then 2 of them in swapped order: recorded vs eager, bit for bit.
TEST(CudaBatch, FlashShapedRecordedStepsMatchEager) {
  for (Numerics nm : {Numerics::Official, Numerics::Reference}) {
  std::vector<std::vector<float>> got[2];
  CudaGraphStats st[2];
  for (int g = 0; g < 2; ++g) {
    SyntheticCheckpoint syn = make_synthetic_checkpoint("flash", 4);
    const ModelConfig cfg = syn.cfg;
    Model m(cfg, std::move(syn.ckpt), make_cuda_backend(CudaOptions{g == 1}), nm);
    const size_t V = static_cast<size_t>(cfg.vocab_size);
    std::mt19937 rng(11);
    Forward pre(m, 64), dec(m, 4);
    const int64_t start[4] = {5, 126, 300, 700};
    std::vector<std::unique_ptr<SequenceState>> sts;
    std::vector<std::vector<int32_t>> toks(4);
    std::vector<float> lg(V);
    for (int s = 0; s < 4; ++s) {
      for (int i = 0; i < 800; ++i) toks[static_cast<size_t>(s)].push_back(static_cast<int32_t>(rng() % 100000u + 100u));
      sts.push_back(m.backend().new_sequence(1024));
      for (int64_t p0 = 0; p0 < start[s]; p0 += 64) {
        const int n = static_cast<int>(std::min<int64_t>(64, start[s] - p0));
        pre.forward(*sts.back(), toks[static_cast<size_t>(s)].data() + p0, n, p0, lg.data(), true);
      }
    }
    std::vector<int64_t> at(start, start + 4);
    std::vector<float> o(4 * V);
    auto step = [&](const std::vector<int>& who) {
      std::vector<SequenceState*> rows;
      std::vector<int32_t> ids;
      std::vector<int64_t> pos;
      for (int s : who)
        rows.push_back(sts[static_cast<size_t>(s)].get()), pos.push_back(at[static_cast<size_t>(s)]),
            ids.push_back(toks[static_cast<size_t>(s)][static_cast<size_t>(at[static_cast<size_t>(s)])]);
      dec.forward_batch(rows.data(), ids.data(), pos.data(), static_cast<int>(who.size()), o.data());
      for (size_t r = 0; r < who.size(); ++r) {
        got[g].emplace_back(o.begin() + static_cast<long>(r * V), o.begin() + static_cast<long>((r + 1) * V));
        ++at[static_cast<size_t>(who[r])];
      }
    };
    for (int k = 0; k < 10; ++k) step({0, 1, 2, 3});
    for (int k = 0; k < 5; ++k) step({3, 1});
    st[g] = cuda_graph_stats(m.backend());
  }
  ASSERT_EQ(got[0].size(), got[1].size());
  int differ = 0;
  for (size_t r = 0; r < got[0].size(); ++r) {
    differ += std::memcmp(got[0][r].data(), got[1][r].data(), got[0][r].size() * 4) != 0;
    for (float v : got[1][r]) ASSERT_TRUE(std::isfinite(v)) << "row " << r;
  }
  std::printf("[cuda-batch] Flash-shaped %s recorded vs eager: %d of %zu rows differ; captures %d, replays %d\n",
              numerics_name(nm), differ, got[0].size(), st[1].captures, st[1].replays);
  EXPECT_EQ(differ, 0) << numerics_name(nm);
  EXPECT_EQ(st[1].replays, 8 + 3);
  }
}

// Per-token decode latency, graph vs eager (median of 5 runs of `steps` single-token steps each, logits downloaded
// every step as a real decode loop does). Prints only; the numbers go to docs/BENCHMARKS.md.
TEST(CudaGraph, DecodeLatency) {
  const int steps = 256;
  for (const std::string name : {"flash_fp8", "pro_fp8", "flash_bf16"}) {
    const std::string dir = fixtures_dir() + "/" + name;
    auto ids = read_bin<int32_t>(dir + "/ids.bin");
    double ms[2];
    for (int g = 0; g < 2; ++g) {
      Model m(dir, make_cuda_backend(CudaOptions{g == 1}), Numerics::Official);
      const size_t V = static_cast<size_t>(m.config().vocab_size);
      Forward fwd(m, 1);
      auto st = m.backend().new_sequence(steps + 8);
      std::vector<float> logits(V);
      std::vector<double> runs;
      for (int r = 0; r < 6; ++r) {
        st->reset();
        const auto t0 = std::chrono::steady_clock::now();
        for (int p = 0; p < steps; ++p) fwd.forward(*st, &ids[static_cast<size_t>(p) % ids.size()], 1, p, logits.data());
        const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) runs.push_back(dt / steps);  // run 0 warms up (and records the graph)
      }
      std::sort(runs.begin(), runs.end());
      ms[g] = runs[runs.size() / 2];
    }
    Model m(dir, make_cpu_backend(), Numerics::Official);
    std::printf("[cuda-graph-bench] %-10s layers %d  eager %.3f ms/token  graph %.3f ms/token  saving %.3f ms (%.2fx), %d steps\n",
                name.c_str(), m.config().n_layers, ms[0], ms[1], ms[0] - ms[1], ms[0] / ms[1], steps);
  }
}

}  // namespace
}  // namespace dsv4::test
