// Batched decode across sequences (Forward::forward_batch): one token of each of several sequences at DIFFERENT
// positions per forward must give every sequence exactly the logits it gets running alone with forward() — through
// compressor ratio boundaries, the sliding window and changing batch membership — on the CPU backend's fused *_rows
// ops and on the Backend defaults (a row loop over the single-sequence ops, what the CUDA backend inherits); and the
// speculative verify pair (Forward::forward_pair) against its two-token chunk.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "batch_plan.h"
#include "fixture_util.h"

namespace dsv4::test {
namespace {

// Forwards every op to a CPU backend but leaves the *_rows ops to the Backend defaults.
class DefaultRowsBackend final : public Backend {
 public:
  explicit DefaultRowsBackend(std::unique_ptr<Backend> b) : b_(std::move(b)) {}
  const char* name() const override { return "cpu-default-rows"; }
  void load(const ModelConfig& c, const ModelWeights& w, Numerics n) override { b_->load(c, w, n); }
  std::unique_ptr<SequenceState> new_sequence(int64_t m) override { return b_->new_sequence(m); }
  float* alloc_f32(size_t n) override { return b_->alloc_f32(n); }
  int32_t* alloc_i32(size_t n) override { return b_->alloc_i32(n); }
  void upload_i32(int32_t* d, const int32_t* h, size_t n) override { b_->upload_i32(d, h, n); }
  void download_f32(float* h, const float* s, size_t n) override { b_->download_f32(h, s, n); }
  void download_i32(int32_t* h, const int32_t* s, size_t n) override { b_->download_i32(h, s, n); }
  void embed(const int32_t* ids, int n, float* X) override { b_->embed(ids, n, X); }
  void hc_pre(int l, HcSite s, const float* X, int n, float* x, float* p, float* c) override { b_->hc_pre(l, s, X, n, x, p, c); }
  void hc_post(const float* y, const float* p, const float* c, int n, float* X) override { b_->hc_post(y, p, c, n, X); }
  void attn_qkv(int l, const float* x, int n, int64_t p, float* qr, float* q, float* kv) override {
    ++single_calls;
    b_->attn_qkv(l, x, n, p, qr, q, kv);
  }
  void compressor_step(int l, CompressorKind k, const float* x, int n, int64_t p, SequenceState& st) override {
    b_->compressor_step(l, k, x, n, p, st);
  }
  void indexer_topk(int l, const float* x, const float* qr, int n, int64_t p, SequenceState& st, int32_t* t) override {
    b_->indexer_topk(l, x, qr, n, p, st, t);
  }
  void attend(int l, const float* q, const float* kv, const int32_t* t, int n, int64_t p, SequenceState& st,
              float* o) override {
    b_->attend(l, q, kv, t, n, p, st, o);
  }
  void window_store(int l, const float* kv, int n, int64_t p, SequenceState& st) override { b_->window_store(l, kv, n, p, st); }
  void attn_out(int l, const float* o, int n, int64_t p, float* out) override { b_->attn_out(l, o, n, p, out); }
  void moe(int l, const float* x, const int32_t* ids, int n, float* out) override { b_->moe(l, x, ids, n, out); }
  void head(const float* X, int n, float* logits) override { b_->head(X, n, logits); }
  void mtp_input(const int32_t* ids, const float* X, int n, float* Y) override { b_->mtp_input(ids, X, n, Y); }
  void mtp_head(const float* Y, int n, float* logits) override { b_->mtp_head(Y, n, logits); }
  long single_calls = 0;

 private:
  std::unique_ptr<Backend> b_;
};

class BatchCase : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchCase, EveryRowEqualsItsSequenceAlone) {
  const std::string dir = fixtures_dir() + "/" + GetParam();
  auto ids = read_bin<int32_t>(dir + "/ids.bin");
  for (Numerics num : {Numerics::Reference, Numerics::Official}) {
    Model m(dir, make_cpu_backend(), num);
    Plan p = make_plan(ids, static_cast<int>(m.config().vocab_size));
    auto want = alone(m, p);
    auto [differ, worst] = batched(m, p, want);
    std::printf("[batch] %-12s %-9s rows not bit-identical: %d, max|diff|/max|logit| %.3g\n", GetParam().c_str(),
                numerics_name(num), differ, worst);
    EXPECT_LE(worst, 2e-5f);
    EXPECT_EQ(differ, 0) << "the CPU reference is bit-identical per row";
  }
}

TEST_P(BatchCase, BackendDefaultRowLoopsMatchToo) {
  const std::string dir = fixtures_dir() + "/" + GetParam();
  auto ids = read_bin<int32_t>(dir + "/ids.bin");
  auto wrapper = std::make_unique<DefaultRowsBackend>(make_cpu_backend());
  DefaultRowsBackend* w = wrapper.get();
  Model m(dir, std::move(wrapper), Numerics::Reference);
  Plan p = make_plan(ids, static_cast<int>(m.config().vocab_size));
  auto want = alone(m, p);
  w->single_calls = 0;
  auto [differ, worst] = batched(m, p, want);
  EXPECT_GT(w->single_calls, 0) << "the default *_rows ops loop over the single-sequence ops";
  EXPECT_LE(worst, 2e-5f);
  EXPECT_EQ(differ, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchCase, ::testing::ValuesIn(fixture_cases()),
                         [](const auto& info) { return info.param; });

TEST(Batch, RejectsBadInputs) {
  const std::string dir = fixtures_dir() + "/flash_bf16";
  auto ids = read_bin<int32_t>(dir + "/ids.bin");
  Model m(dir, make_cpu_backend(), Numerics::Reference);
  Forward fwd(m, 4);
  auto a = m.backend().new_sequence(64), b = m.backend().new_sequence(64);
  std::vector<float> lg(static_cast<size_t>(m.config().vocab_size) * 4);
  fwd.forward(*a, ids.data(), 3, 0, lg.data(), true);  // a holds 3 tokens, b none
  SequenceState* rows[] = {a.get(), b.get()};
  int32_t tok[] = {ids[3], ids[0]};
  int64_t good[] = {3, 0}, wrong[] = {2, 0}, ahead[] = {4, 0};
  EXPECT_THROW(fwd.forward_batch(rows, tok, wrong, 2, lg.data()), Error);  // a token a already holds
  EXPECT_THROW(fwd.forward_batch(rows, tok, ahead, 2, lg.data()), Error);  // a gap
  SequenceState* twice[] = {a.get(), a.get()};
  int64_t pos_twice[] = {3, 3};
  EXPECT_THROW(fwd.forward_batch(twice, tok, pos_twice, 2, lg.data()), Error);
  int32_t bad_tok[] = {ids[3], static_cast<int32_t>(m.config().vocab_size)};
  EXPECT_THROW(fwd.forward_batch(rows, bad_tok, good, 2, lg.data()), Error);
  SequenceState* five[] = {a.get(), b.get(), a.get(), b.get(), a.get()};
  EXPECT_THROW(fwd.forward_batch(five, tok, good, 5, lg.data()), Error);  // more rows than max_chunk
  EXPECT_THROW(fwd.forward_batch(rows, tok, good, 0, lg.data()), Error);
  // Nothing was run by the rejected calls: the valid batch still works and advances both sequences.
  fwd.forward_batch(rows, tok, good, 2, lg.data());
  EXPECT_EQ(a->tokens(), 4);
  EXPECT_EQ(b->tokens(), 1);
  // forward() checks the chunk position the same way.
  EXPECT_THROW(fwd.forward(*a, ids.data() + 3, 1, 3, lg.data()), Error);
  fwd.forward(*a, ids.data() + 4, 1, 4, lg.data());
}

// Speculation's verify pair (Forward::forward_pair): two consecutive tokens of ONE sequence as a batched step. On the
// CPU (pair_rows) its rows run as their chunk, so both rows' logits are bit-identical to forward() of the two-token
// chunk, across compressor emissions and window wraps, and the state goes on identically (kept, or after drop_last).
// A backend without pair_rows (the Backend defaults) takes the chunk itself. The MTP block can start at either row.
TEST(Batch, PairEqualsItsTwoTokenChunk) {
  for (const std::string name : {"flash_fp8", "flash_bf16"}) {
    const std::string dir = fixtures_dir() + "/" + name;
    auto ids = read_bin<int32_t>(dir + "/ids.bin");
    for (int wrapped = 0; wrapped < 2; ++wrapped) {
      std::unique_ptr<Backend> be = make_cpu_backend();
      if (wrapped) be = std::make_unique<DefaultRowsBackend>(std::move(be));
      EXPECT_EQ(be->pair_rows(), wrapped == 0);
      Model m(dir, std::move(be), Numerics::Official);
      const size_t V = static_cast<size_t>(m.config().vocab_size);
      Forward pre(m, 16), pair(m, 2), chunk(m, 2), one(m, 1);
      auto a = m.backend().new_sequence(256), b = m.backend().new_sequence(256);
      std::vector<float> la(2 * V), lb(2 * V), l1(V), l2(V);
      std::vector<int32_t> toks;
      for (int i = 0; i < 120; ++i) toks.push_back(ids[static_cast<size_t>(i) % ids.size()]);
      pre.forward(*a, toks.data(), 9, 0, nullptr);
      pre.forward(*b, toks.data(), 9, 0, nullptr);
      int64_t p = 9;
      int differ = 0, pairs = 0;
      while (p + 2 < static_cast<int64_t>(toks.size())) {
        const bool keep = (p % 3) != 1;
        a->prepare_drop_last();
        b->prepare_drop_last();
        pair.forward_pair(*a, &toks[static_cast<size_t>(p)], p, la.data());
        EXPECT_TRUE(pair.holds_streams(*a, p) && pair.holds_streams(*a, p + 1));
        chunk.forward(*b, &toks[static_cast<size_t>(p)], 2, p, lb.data());  // the two-token chunk, rolled back alike
        differ += std::memcmp(la.data(), lb.data(), la.size() * 4) != 0;
        ++pairs;
        if (!keep) a->drop_last(), b->drop_last();
        p += keep ? 2 : 1;
        // The next single token on both states: the same logits.
        one.forward(*a, &toks[static_cast<size_t>(p)], 1, p, l1.data());
        one.forward(*b, &toks[static_cast<size_t>(p)], 1, p, l2.data());
        differ += std::memcmp(l1.data(), l2.data(), V * 4) != 0;
        ++p;
      }
      std::printf("[batch] %-10s %s: %d pairs, %d of %d comparisons differ\n", name.c_str(),
                  wrapped ? "default rows (chunk path)" : "cpu pair rows", pairs, differ, 2 * pairs);
      EXPECT_EQ(differ, 0) << name << (wrapped ? " default rows" : " pair rows");
      EXPECT_GT(pairs, 20);
    }
  }
}

TEST(Batch, PairRejectsBadInputs) {
  const std::string dir = fixtures_dir() + "/flash_bf16";
  auto ids = read_bin<int32_t>(dir + "/ids.bin");
  Model m(dir, make_cpu_backend(), Numerics::Reference);
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  Forward one(m, 1), pair(m, 2);
  auto a = m.backend().new_sequence(64);
  std::vector<float> lg(2 * V);
  pair.forward(*a, ids.data(), 2, 0, nullptr);
  EXPECT_THROW(one.forward_pair(*a, ids.data() + 2, 2, lg.data()), Error);  // a one-token Forward
  EXPECT_THROW(pair.forward_pair(*a, ids.data() + 2, 3, lg.data()), Error);  // not where the sequence ends
  const int32_t bad[] = {ids[2], static_cast<int32_t>(V)};
  EXPECT_THROW(pair.forward_pair(*a, bad, 2, lg.data()), Error);
  EXPECT_EQ(a->tokens(), 2);  // nothing ran
  pair.forward_pair(*a, ids.data() + 2, 2, lg.data());
  EXPECT_EQ(a->tokens(), 4);
  // The *_rows ops take one sequence only as ascending consecutive positions.
  float* kv = m.backend().alloc_f32(2 * static_cast<size_t>(m.config().head_dim));
  SequenceState* twice[] = {a.get(), a.get()};
  const int64_t gap[] = {4, 6}, back[] = {5, 4};
  EXPECT_THROW(m.backend().window_store_rows(0, kv, 2, gap, twice), Error);
  EXPECT_THROW(m.backend().window_store_rows(0, kv, 2, back, twice), Error);
}

}  // namespace
}  // namespace dsv4::test
