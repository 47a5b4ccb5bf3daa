#pragma once
// The dsv4 public API: load a model, open sessions, sample. Everything a front end (CLI, server) needs and nothing
// about how the model is computed.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace dsv4 {

class Model;
class Forward;

struct EngineOptions {
  std::string model_dir;
  std::string backend = "cpu";          // cpu | cuda
  std::string numerics = "reference";   // reference | official
  int tp = 1;                           // cuda: tensor-parallel GPUs 0..tp-1 (1, 2, 4, 8)
  int64_t max_context = 4096;           // per-session state is sized from this up front
  int prefill_chunk = 0;                // tokens per prefill forward (at most max_context); 0: default_prefill_chunk
  // Speculative decoding: "none", or "mtp" -- one draft token per step from the checkpoint's MTP block (mtp.0.*),
  // verified by one forward of two tokens (Session::draft / append_verify / resolve_draft; generate() uses them).
  // The output is the one plain decoding gives (the same tokens from the same logits and sampler draws).
  std::string speculative = "none";
};

// The prefill chunk an engine takes when EngineOptions::prefill_chunk is 0: on CUDA 8,192 tokens (at most max_context
// rounded up to 64), because the prefill kernels run the better the more tokens each expert gets (measured, one H200,
// 20 Flash layers, 8K prompt: 7,504 tok/s at 8,192-token chunks vs 6,557 at 2,048); on the CPU 256. The engine holds
// one prefill Forward of that many tokens, shared by its sessions (Flash on CUDA: a few GB at 8,192).
int default_prefill_chunk(const std::string& backend, int64_t max_context);

struct ModelInfo {
  int64_t vocab_size = 0;
  int eos_token_id = 1;
  int bos_token_id = 0;
  int n_layers = 0;
  std::string backend;
  std::string numerics;
};

class Session;

class Engine {
 public:
  static std::unique_ptr<Engine> load(const EngineOptions& opts);  // throws dsv4::Error
  ~Engine();
  const ModelInfo& info() const { return info_; }
  const EngineOptions& options() const { return opts_; }
  std::unique_ptr<Session> new_session();
  Model& model() { return *model_; }

 private:
  friend class Session;
  struct BatchScratch;
  Engine();
  Forward& prefill_forward();  // shared by the sessions' multi-token chunks, created on first use
  EngineOptions opts_;
  ModelInfo info_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<BatchScratch> batch_;  // Session::append_batch: its Forward and host scratch
};

// One sequence. sync(tokens) makes the state equal to having processed exactly `tokens`, reusing the longest common
// prefix already computed (restoring the nearest snapshot at or before the divergence and recomputing from there);
// on the CPU backend the logits after a sync are bit-identical to a fresh session's.
class Session {
 public:
  ~Session();
  void sync(const std::vector<int32_t>& tokens);
  void append(int32_t token);                 // decode one token (sync(tokens + [token]) without the search)
  // Batched decode: appends tokens[i] to sessions[i] (distinct sessions of one engine) in ONE forward over all of
  // them (one pass over the weights per step). Each session ends exactly as sessions[i]->append(tokens[i]) leaves it
  // (tokens, logits — bit-identical on the CPU —, snapshots). Everything is validated before any session changes;
  // a failure inside the forward starts the affected sessions over (as a failed append() does) and rethrows.
  static void append_batch(const std::vector<Session*>& sessions, const std::vector<int32_t>& tokens);
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<float>& logits() const;   // after the last token; throws if the session is empty
  int64_t max_context() const;
  // Tokens actually recomputed by the last sync()/append() (prefix reuse observability for tests and stats).
  int64_t last_computed() const { return last_computed_; }
  // Called after each prefill chunk with (tokens done, tokens to do) of the running sync(); for progress bars.
  void set_progress(std::function<void(int64_t, int64_t)> fn) { progress_ = std::move(fn); }

  // Speculative decoding (EngineOptions::speculative == "mtp"), one draft token per step:
  //   d = draft(next)          the MTP block's greedy guess of the token after `next` (the token about to be
  //                            appended), or -1 when this step cannot speculate (then append(next) as usual): not a
  //                            speculative engine, the session's last forward was a batch or another forward's, the
  //                            context has no room for two more tokens, or the step would skip a snapshot position.
  //   append_verify(next, d)   ONE forward of [next, d]; logits() are then those after `next` (what append(next)
  //                            gives); the session holds `d` provisionally.
  //   resolve_draft(accepted)  true: keeps `d` (logits() become those after it); false: drops it, leaving the session
  //                            exactly as append(next) leaves it (bit-identical logits on the CPU).
  // Nothing else may run on the session between append_verify and resolve_draft.
  bool speculative() const;
  int32_t draft(int32_t next);
  void append_verify(int32_t next, int32_t draft);
  void resolve_draft(bool accepted);
  bool draft_pending() const;

 private:
  friend class Engine;
  explicit Session(Engine& e);
  void run(int64_t from);  // forward tokens_[from..] from a state that holds tokens_[0..from)
  void run_or_reset(int64_t from);
  void check_append(int32_t token) const;
  void reset_after_failure();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<int32_t> tokens_;
  int64_t last_computed_ = 0;
  std::function<void(int64_t, int64_t)> progress_;
};

struct SamplingParams {
  float temperature = 1.0f;       // 0 = greedy
  int top_k = 0;                  // 0 = off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int top_logprobs = 0;           // report this many alternatives per token
};

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct SampledToken {
  int32_t token;
  float logprob;                       // of the chosen token under the model's distribution (temperature 1)
  std::vector<TokenLogprob> top;       // top_logprobs alternatives, best first
};

// Sampling from logits with penalties over the tokens generated so far. Same seed -> same choices.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  SampledToken sample(const std::vector<float>& logits, const std::vector<int32_t>& generated);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> work_;      // penalised logits (only when a penalty is set)
  std::vector<float> exps_;      // exp((logit - max) / T) of the untruncated draw and of top-p / min-p without top-k
  std::vector<double> blocks_;   // their sums per block of the vocabulary
  std::vector<int32_t> order_;
  std::vector<double> probs_;
  // Penalties: the generated tokens counted so far, their counts per token id and the ids seen at least once.
  std::vector<int32_t> counted_, counts_, distinct_;
};

}  // namespace dsv4
