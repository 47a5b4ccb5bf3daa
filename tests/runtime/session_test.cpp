// Session prefix reuse: after sync(A) then sync(B), the logits equal a fresh session's on B bit for bit (CPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "dsv4/engine.h"
#include "fixture_ids.h"

namespace dsv4 {
namespace {

using test::fixture;
using test::fixture_ids;

std::unique_ptr<Engine> load(const char* name, int chunk) {
  EngineOptions o;
  o.model_dir = fixture(name);
  o.max_context = 512;
  o.prefill_chunk = chunk;
  return Engine::load(o);
}

std::vector<int32_t> prefix(const std::vector<int32_t>& v, size_t n) { return {v.begin(), v.begin() + static_cast<long>(n)}; }

TEST(Session, PrefixReuseIsBitExact) {
  for (auto [name, chunk] : {std::pair<const char*, int>{"flash_fp8", 64}, {"pro_fp8", 5}}) {
    auto ids = fixture_ids(name);
    {
      auto e = load(name, chunk);
      auto fresh_logits = [&](const std::vector<int32_t>& toks) {
        auto s = e->new_session();
        s->sync(toks);
        return s->logits();
      };
      auto s = e->new_session();
      // A: the whole fixture; B: diverges at various points (window/ratio boundaries, snapshot boundaries).
      s->sync(ids);
      for (size_t cut : {size_t{3}, size_t{16}, size_t{31}, size_t{64}, size_t{65}, size_t{100}}) {
        std::vector<int32_t> b = prefix(ids, cut);
        b.push_back((ids[cut] + 1) % 200 + 2);  // a different token at position `cut`
        b.push_back(ids[cut]);
        s->sync(b);
        EXPECT_LE(s->last_computed(), static_cast<int64_t>(cut % 64 + 2)) << "did not reuse the prefix";
        auto want = fresh_logits(b);
        ASSERT_EQ(std::memcmp(s->logits().data(), want.data(), want.size() * 4), 0) << name << " cut " << cut;
        // Back to A (a longer sequence sharing b's first `cut` tokens).
        s->sync(ids);
        auto wantA = fresh_logits(ids);
        ASSERT_EQ(std::memcmp(s->logits().data(), wantA.data(), wantA.size() * 4), 0) << name << " back from " << cut;
      }
      // A divergence near the end of the last synced sequence (a chat turn re-rendered with its reasoning
      // dropped) restores the tail snapshot 16 tokens before that end instead of the last 64-token one.
      s->sync(ids);
      std::vector<int32_t> near_end = prefix(ids, ids.size() - 6);
      near_end.push_back((ids[ids.size() - 6] + 1) % 200 + 2);
      s->sync(near_end);
      EXPECT_LE(s->last_computed(), 11) << "tail snapshot not used";
      auto want_ne = fresh_logits(near_end);
      EXPECT_EQ(std::memcmp(s->logits().data(), want_ne.data(), want_ne.size() * 4), 0);
      // Prefix of the current tokens (the session must recompute the last kept token's logits).
      s->sync(prefix(ids, 40));
      auto want40 = fresh_logits(prefix(ids, 40));
      EXPECT_EQ(std::memcmp(s->logits().data(), want40.data(), want40.size() * 4), 0);
      // Appending one token = syncing the extended sequence.
      s->append(ids[40]);
      EXPECT_EQ(s->last_computed(), 1);
      auto want41 = fresh_logits(prefix(ids, 41));
      EXPECT_EQ(std::memcmp(s->logits().data(), want41.data(), want41.size() * 4), 0);
      // Same tokens again: nothing recomputed.
      s->sync(prefix(ids, 41));
      EXPECT_EQ(s->last_computed(), 0);
    }
  }
}

// A prefill runs in chunks of the engine's prefill chunk: snapshots every max(64, chunk rounded down to 64) tokens,
// so a 128-token chunk is not cut at 64 (the CUDA prefill kernels want every token they can get per forward), plus
// the tail snapshot 16 tokens before the end; prefix reuse then restores the nearest of those.
TEST(Session, PrefillChunksAreTheEngineChunk) {
  const auto fx = fixture_ids("flash_fp8");
  std::vector<int32_t> ids(150);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = fx[i % fx.size()];
  auto e = load("flash_fp8", 128);
  auto s = e->new_session();
  std::vector<int64_t> done;
  s->set_progress([&](int64_t d, int64_t) { done.push_back(d); });
  s->sync(ids);
  EXPECT_EQ(done, (std::vector<int64_t>{128, 134, 150}));  // 128-token chunk, the tail snapshot at 134, the rest
  // A divergence at 100 restores the empty state (no snapshot at 64 any more); one at 140 the one at 128.
  std::vector<int32_t> b = prefix(ids, 100);
  b.push_back((ids[100] + 1) % 200 + 2);
  s->sync(b);
  EXPECT_EQ(s->last_computed(), 101);
  s->sync(ids);
  b = prefix(ids, 140);
  b.push_back((ids[140] + 1) % 200 + 2);
  s->sync(b);
  EXPECT_EQ(s->last_computed(), 141 - 134) << "the tail snapshot at 134";
  auto fresh = e->new_session();
  fresh->sync(b);
  EXPECT_EQ(std::memcmp(s->logits().data(), fresh->logits().data(), fresh->logits().size() * 4), 0);
}

TEST(EngineOptions, PrefillChunkAtMostTheContext) {
  auto e = load("flash_fp8", 1 << 30);  // max_context 512: the prefill buffers are sized for 512 tokens, not 2^30
  EXPECT_EQ(e->options().prefill_chunk, 512);
  auto d = load("flash_fp8", 0);
  EXPECT_EQ(d->options().prefill_chunk, 256);  // the CPU's default
}

TEST(EngineOptions, DefaultPrefillChunk) {
  EXPECT_EQ(default_prefill_chunk("cpu", 4096), 256);
  EXPECT_EQ(default_prefill_chunk("cuda", 4096), 4096);
  EXPECT_EQ(default_prefill_chunk("cuda", 1 << 20), 8192);
  EXPECT_EQ(default_prefill_chunk("cuda", 100), 128);
}

TEST(Session, ContextLimitIsAClearError) {
  auto e = load("flash_bf16", 16);
  auto s = e->new_session();
  std::vector<int32_t> toks(513, 5);
  EXPECT_THROW(s->sync(toks), Error);
  toks.resize(512);
  s->sync(toks);
  EXPECT_THROW(s->append(5), Error);
  EXPECT_THROW(s->sync({5, 99999}), Error);
  auto empty = e->new_session();
  EXPECT_THROW(empty->logits(), Error);
}

// Session::append_batch leaves every session exactly as append() would: tokens, logits (bit for bit), and the
// snapshots that later syncs reuse (crossing the 64-token snapshot interval while batched).
TEST(Session, AppendBatchEqualsAppend) {
  for (auto [name, chunk] : {std::pair<const char*, int>{"flash_fp8", 3}, {"pro_fp8", 64}}) {
    auto ids = fixture_ids(name);
    auto e = load(name, chunk);  // chunk 3: batches of 5 sessions run as groups of 3 + 2
    const std::vector<size_t> start = {0, 1, 58, 62, 63};
    std::vector<std::unique_ptr<Session>> solo, bat;
    for (size_t s = 0; s < start.size(); ++s) {
      solo.push_back(e->new_session());
      bat.push_back(e->new_session());
      solo.back()->sync(prefix(ids, start[s]));
      bat.back()->sync(prefix(ids, start[s]));
    }
    auto next = [&](size_t s, const Session& x) { return ids[(x.tokens().size() + 11 * s) % ids.size()]; };
    for (int step = 0; step < 12; ++step) {
      std::vector<Session*> rows;
      std::vector<int32_t> toks;
      for (size_t s = 0; s < start.size(); ++s) {
        if ((step + static_cast<int>(s)) % 5 == 4) continue;  // membership changes from step to step
        toks.push_back(next(s, *bat[s]));
        rows.push_back(bat[s].get());
        solo[s]->append(toks.back());
      }
      Session::append_batch(rows, toks);
      for (size_t s = 0; s < start.size(); ++s) {
        ASSERT_EQ(bat[s]->tokens(), solo[s]->tokens()) << name << " session " << s << " step " << step;
        ASSERT_EQ(bat[s]->logits().size(), solo[s]->logits().size());
        ASSERT_EQ(std::memcmp(bat[s]->logits().data(), solo[s]->logits().data(), solo[s]->logits().size() * 4), 0)
            << name << " session " << s << " step " << step;
        if (std::find(rows.begin(), rows.end(), bat[s].get()) != rows.end()) {
          EXPECT_EQ(bat[s]->last_computed(), 1);
        }
      }
    }
    // Snapshots taken while batched serve later syncs like append()'s: diverge right after the 64-token boundary.
    for (size_t s = 0; s < start.size(); ++s) {
      std::vector<int32_t> b = bat[s]->tokens();
      if (b.size() <= 66) continue;
      b.resize(66);
      b.push_back(7);
      solo[s]->sync(b);
      bat[s]->sync(b);
      EXPECT_EQ(bat[s]->last_computed(), solo[s]->last_computed()) << name << " session " << s;
      EXPECT_LE(bat[s]->last_computed(), 3) << "the snapshot at 64 taken during append_batch was not reused";
      EXPECT_EQ(std::memcmp(bat[s]->logits().data(), solo[s]->logits().data(), solo[s]->logits().size() * 4), 0);
    }
  }
}

TEST(Session, AppendBatchRejectsBadInputsWithoutSideEffects) {
  auto ids = fixture_ids("flash_bf16");
  auto e = load("flash_bf16", 16);
  auto other = load("flash_bf16", 16);
  auto a = e->new_session(), b = e->new_session(), c = other->new_session();
  a->sync(prefix(ids, 5));
  b->sync(prefix(ids, 9));
  c->sync(prefix(ids, 2));
  const auto la = a->logits();
  EXPECT_THROW(Session::append_batch({a.get(), b.get()}, {1}), Error);                 // sizes differ
  EXPECT_THROW(Session::append_batch({a.get(), a.get()}, {1, 2}), Error);              // same session twice
  EXPECT_THROW(Session::append_batch({a.get(), c.get()}, {1, 2}), Error);              // different engines
  EXPECT_THROW(Session::append_batch({a.get(), b.get()}, {1, 1 << 30}), Error);        // token out of range
  auto full = e->new_session();
  full->sync(std::vector<int32_t>(512, 5));
  EXPECT_THROW(Session::append_batch({a.get(), full.get()}, {1, 2}), Error);           // context full
  EXPECT_EQ(a->tokens(), prefix(ids, 5));
  EXPECT_EQ(b->tokens(), prefix(ids, 9));
  EXPECT_EQ(std::memcmp(a->logits().data(), la.data(), la.size() * 4), 0);
  Session::append_batch({}, {});  // nothing to do
  Session::append_batch({a.get(), b.get()}, {ids[5], ids[9]});
  EXPECT_EQ(a->tokens(), prefix(ids, 6));
  EXPECT_EQ(b->tokens(), prefix(ids, 10));
}

}  // namespace
}  // namespace dsv4
