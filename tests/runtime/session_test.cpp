// Session prefix reuse: after sync(A) then sync(B), the logits equal a fresh session's on B bit for bit (CPU).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "dsv4/engine.h"

namespace dsv4 {
namespace {

std::string fixture(const char* name) { return std::string(DSV4_SOURCE_DIR) + "/tests/fixtures/" + name; }

std::vector<int32_t> fixture_ids(const char* name) {
  std::ifstream f(fixture(name) + "/ids.bin", std::ios::binary | std::ios::ate);
  std::vector<int32_t> ids(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  return ids;
}

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

}  // namespace
}  // namespace dsv4
