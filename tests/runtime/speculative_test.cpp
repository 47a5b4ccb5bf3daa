// Speculative decoding with the MTP block (EngineOptions::speculative = "mtp"): a verified pair [next, draft] leaves
// the session exactly where plain appends leave it -- bit for bit on the CPU, the draft accepted or dropped, across
// window wraps and compressor emissions -- and generate() produces the tokens plain decoding produces.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "core/error.h"
#include "dsv4/engine.h"
#include "fixture_ids.h"
#include "model/backend.h"
#include "model/model.h"
#include "model/tiny_model.h"
#include "runtime/generation.h"
#include "text/tokenizer.h"

namespace dsv4 {
namespace {

using test::fixture;
using test::fixture_ids;

std::unique_ptr<Engine> load(const std::string& dir, const std::string& spec, int chunk = 64) {
  EngineOptions o;
  o.model_dir = dir;
  o.max_context = 512;
  o.prefill_chunk = chunk;
  o.speculative = spec;
  return Engine::load(o);
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// A random token sequence S drives both sessions: plain appends S[k] one by one; speculative verifies [S[k], d] with
// d = S[k + 1] (accepted) or a different token (dropped), chosen at random, and uses draft() (the MTP block) on some
// steps so that its window is exercised too. At every step both sessions must have the same tokens and logits.
TEST(Speculative, VerifiedPairsLeaveTheSessionAsPlainAppends) {
  for (const char* name : {"flash_fp8", "flash_bf16"}) {
    auto plain_e = load(fixture(name), "none");
    auto spec_e = load(fixture(name), "mtp");
    const int V = static_cast<int>(plain_e->info().vocab_size);
    auto ids = fixture_ids(name);
    std::vector<int32_t> prompt(ids.begin(), ids.begin() + 21);
    auto plain = plain_e->new_session();
    auto spec = spec_e->new_session();
    plain->sync(prompt);
    spec->sync(prompt);
    ASSERT_TRUE(same(plain->logits(), spec->logits())) << name;
    std::mt19937 rng(7);
    std::vector<int32_t> S(300);
    for (auto& t : S) t = static_cast<int32_t>(rng() % static_cast<unsigned>(V));
    int accepted = 0, dropped = 0, plain_steps = 0, drafts = 0;
    size_t k = 0;
    while (k + 1 < S.size() && spec->tokens().size() + 2 < 480) {
      if (rng() % 3 == 0) {  // the MTP block's draft (its value is irrelevant here: S decides)
        const int32_t d = spec->draft(S[k]);
        if (d >= 0) ++drafts;
        EXPECT_LT(d, V);
      }
      const int64_t n = static_cast<int64_t>(spec->tokens().size());
      if ((n + 1) % 64 == 0) {  // a snapshot position: plain append (append_verify refuses it)
        EXPECT_THROW(spec->append_verify(S[k], S[k + 1]), Error);
        spec->append(S[k]);
        plain->append(S[k]);
        ++plain_steps, ++k;
      } else {
        const bool accept = rng() % 2 == 0;
        const int32_t d = accept ? S[k + 1] : (S[k + 1] + 1 + static_cast<int32_t>(rng() % 7)) % V;
        spec->append_verify(S[k], d);
        plain->append(S[k]);
        ASSERT_TRUE(same(plain->logits(), spec->logits())) << name << ": logits after next, position " << n;
        spec->resolve_draft(accept);
        if (accept) {
          plain->append(S[k + 1]);
          ++accepted, k += 2;
        } else {
          ++dropped, ++k;
        }
      }
      ASSERT_EQ(plain->tokens(), spec->tokens()) << name;
      ASSERT_TRUE(same(plain->logits(), spec->logits())) << name << ": after resolve, " << spec->tokens().size() << " tokens";
    }
    std::printf("[speculative] %s: %d accepted, %d dropped, %d plain, %d MTP drafts, %zu tokens\n", name, accepted,
                dropped, plain_steps, drafts, spec->tokens().size());
    EXPECT_GT(accepted, 50);
    EXPECT_GT(dropped, 50);
    EXPECT_GT(drafts, 30);
    // Prefix reuse still holds after speculation (snapshots were taken at the plain steps): diverge mid-way.
    std::vector<int32_t> b(spec->tokens().begin(), spec->tokens().begin() + 200);
    b.push_back((b.back() + 3) % V);
    spec->sync(b);
    auto fresh = plain_e->new_session();
    fresh->sync(b);
    EXPECT_TRUE(same(fresh->logits(), spec->logits())) << name << ": prefix reuse after speculation";
    EXPECT_LE(spec->last_computed(), 64) << name;
  }
}

TEST(Speculative, MisuseIsAnErrorNotACorruptState) {
  auto e = load(fixture("flash_fp8"), "mtp");
  auto ids = fixture_ids("flash_fp8");
  auto s = e->new_session();
  EXPECT_THROW(s->resolve_draft(true), Error);  // nothing pending
  s->sync({ids.begin(), ids.begin() + 10});
  EXPECT_THROW(s->append_verify(ids[10], 256), Error);  // draft out of range
  EXPECT_THROW(s->append_verify(-1, 3), Error);
  s->append_verify(ids[10], ids[11]);
  EXPECT_TRUE(s->draft_pending());
  EXPECT_THROW(s->append(5), Error);
  EXPECT_THROW(s->sync(ids), Error);
  EXPECT_THROW(s->append_verify(1, 2), Error);
  s->resolve_draft(false);
  EXPECT_EQ(s->tokens().size(), 11u);
  // The state's own guard: drop_last only right after prepare_drop_last and one two-token forward.
  Model& m = e->model();
  auto st = m.backend().new_sequence(64);
  ASSERT_TRUE(st->supports_drop_last());
  EXPECT_THROW(st->drop_last(), Error);
  Forward f(m, 2);
  st->prepare_drop_last();
  f.forward(*st, ids.data(), 1, 0, nullptr);
  EXPECT_THROW(st->drop_last(), Error);  // a one-token forward
  st->prepare_drop_last();
  f.forward(*st, ids.data() + 1, 2, 1, nullptr);
  st->drop_last();
  EXPECT_EQ(st->tokens(), 2);
  EXPECT_THROW(st->drop_last(), Error);  // twice
  // Without an MTP block there is nothing to draft with: a load-time error.
  EXPECT_THROW(load(fixture("hf_layout"), "mtp"), Error);  // the only fixture without mtp.0.*
  EXPECT_THROW(load(fixture("flash_fp8"), "eagle"), Error);
}

// generate() with speculation vs without, on a tiny model with the real vocabulary and tokenizer: the same tokens,
// greedy and sampled (the sampler draws in the same order from the same logits), and drafts were verified.
TEST(Speculative, GenerateProducesThePlainTokens) {
  const std::string dir = std::string(DSV4_BINARY_DIR) + "/test_speculative_tiny_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  TinySpec spec;
  spec.seed = 5;
  spec.layers = 4;
  write_tiny_model(dir, spec);
  auto tok = text::Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/models/default/tokenizer.json");
  auto plain_e = load(dir, "none");
  auto spec_e = load(dir, "mtp");
  std::filesystem::remove_all(dir);
  for (float temperature : {0.0f, 1.0f}) {
    GenerationRequest r;
    r.prompt_ids = tok.encode("The quick brown fox jumps over the lazy dog, again and again and again.");
    r.mode = text::ThinkingMode::kChat;
    r.parse = false;
    r.max_tokens = 90;
    r.sampling.temperature = temperature;
    r.sampling.seed = 11;
    auto ps = plain_e->new_session();
    auto ss = spec_e->new_session();
    GenerationResult a = generate(*ps, tok, r);
    GenerationResult b = generate(*ss, tok, r);
    std::printf("[speculative] T=%.0f: %zu tokens, %lld drafts, %lld accepted\n", temperature, b.completion_ids.size(),
                (long long)b.timings.draft_tokens, (long long)b.timings.accepted_drafts);
    EXPECT_EQ(a.completion_ids, b.completion_ids) << "T=" << temperature;
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(a.finish_reason, b.finish_reason);
    EXPECT_EQ(a.timings.draft_tokens, 0);
    EXPECT_GT(b.timings.draft_tokens, static_cast<int64_t>(b.completion_ids.size()) / 2);
  }
}

}  // namespace
}  // namespace dsv4
