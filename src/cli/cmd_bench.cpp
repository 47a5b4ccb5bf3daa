// dsv4 bench --synthetic flash|pro: the whole model forward on synthetic full-size weights (real shapes and stored
// formats, random values; model/synthetic_weights.h) on the GPU(s), in one run: streaming-read bandwidth, prefill
// tokens/s of a P-token prompt, batch-1 decode step time at context C (median of graph replays) with the bytes the step
// reads and the resulting fraction of the bandwidth bound, the decode time split by op (one GPU), the prefill time
// split by op, and with --batch B the batched decode step of B sequences. Table + JSON.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "core/error.h"
#include "dsv4/engine.h"

#if defined(DSV4_HAVE_CUDA)
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "model/model.h"
#include "model/shard_weights.h"
#include "model/sharding.h"
#include "model/synthetic_weights.h"

namespace {

using dsv4::fail;
using Clock = std::chrono::steady_clock;

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Bytes a linear occupies on the device: stored weight + block scales (FP8's widened to fp32, FP4's one byte as stored:
// what the kernels stream), on one
// tensor-parallel rank (a split linear holds 1/tp of it; model/sharding.h decides which are split).
int g_tp = 1;
uint64_t device_bytes(const dsv4::LinearRef& r) {
  if (!r.weight) return 0;
  uint64_t b = r.weight->nbytes();
  const bool fp4 = r.fmt == dsv4::WeightFormat::MXFP4 || r.fmt == dsv4::WeightFormat::NVFP4;
  if (r.scale) b += static_cast<uint64_t>(r.scale->numel()) * (fp4 ? 1 : 4);
  return dsv4::shard_split(r.name + ".weight") == dsv4::Split::Replicated ? b : b / static_cast<uint64_t>(g_tp);
}
uint64_t f32_bytes(const dsv4::TensorView* t) { return t ? static_cast<uint64_t>(t->numel()) * 4 : 0; }

struct StepBytes {
  uint64_t weights = 0, kv = 0;
};

// What one decode token reads in layer l on one rank at position pos: every attention/compressor/indexer matrix, the
// router, k routed experts (mean size) and the shared expert, the mHC mixes; the KV rows attention and the indexer
// touch in our fp32 layout (window, CSA top-k or HCA entries, all indexer keys).
StepBytes layer_bytes(const dsv4::ModelConfig& c, const dsv4::LayerWeights& L, int64_t pos) {
  StepBytes s;
  for (const dsv4::LinearRef* r : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.gate}) s.weights += device_bytes(*r);
  if (L.compressor) s.weights += device_bytes(L.compressor->wkv) + device_bytes(L.compressor->wgate);
  if (L.indexer)
    for (const dsv4::LinearRef* r : {&L.indexer->wq_b, &L.indexer->weights_proj, &L.indexer->comp.wkv, &L.indexer->comp.wgate})
      s.weights += device_bytes(*r);
  uint64_t experts = 0;
  for (const auto& e : L.experts) experts += device_bytes(e.w1) + device_bytes(e.w2) + device_bytes(e.w3);
  if (!L.experts.empty()) s.weights += experts / L.experts.size() * static_cast<uint64_t>(c.n_experts_per_tok);
  if (L.shared) s.weights += device_bytes(L.shared->w1) + device_bytes(L.shared->w2) + device_bytes(L.shared->w3);
  s.weights += f32_bytes(L.hc_attn.fn) + f32_bytes(L.hc_ffn.fn);
  const uint64_t row = static_cast<uint64_t>(c.head_dim) * 4;
  const int64_t ctx = pos + 1;
  s.kv += static_cast<uint64_t>(std::min<int64_t>(ctx, c.window)) * row;
  const int m = c.ratio(L.index);
  if (L.kind == dsv4::AttnKind::CSA) {
    s.kv += static_cast<uint64_t>(std::min<int64_t>(ctx / m, c.index_topk)) * row;
    s.kv += static_cast<uint64_t>(ctx / m) * static_cast<uint64_t>(c.index_head_dim) * 4;
  } else if (L.kind == dsv4::AttnKind::HCA) {
    s.kv += static_cast<uint64_t>(ctx / m) * row;
  }
  return s;
}

// --trace-steps: a fresh decode recording whose launches are remembered by name, then `n` replays with every kernel
// stamping its dependency release (cuda_trace_begin). Kernel i's cost = stamp(i + 1) - stamp(i): the time it adds to
// the step's critical path, PDL overlap and gaps included. Means over the replays, summed by kernel name. Under TP
// every rank's device is traced (each with its own clock): rank 0's table, then each kernel's cost on every rank
// side by side -- a kernel slower on one rank shows up there, and as waiting in the next all-reduce on the others.
template <typename Step>
void print_trace(dsv4::Model& model, dsv4::Backend& be, Step& step, int n, double step_us, int layers, int tp) {
  dsv4::Forward fwd(model, 1);
  step(fwd, false);  // eager
  dsv4::cuda_trace_record_launches(true);
  step(fwd, false);  // recorded: the graph's kernels in launch order
  dsv4::cuda_trace_record_launches(false);
  std::vector<int> devs;
  for (int d = 0; d < tp; ++d) devs.push_back(d);
  std::vector<std::vector<std::string>> names;
  for (int d : devs) names.push_back(dsv4::cuda_trace_launch_names(d));
  const size_t K = names[0].size();
  if (K < 2) fail("--trace-steps: the recorded decode step launched ", K, " kernels through kernels.cu");
  for (size_t r = 1; r < names.size(); ++r)
    if (names[r] != names[0]) fail("--trace-steps: rank ", r, " launched another kernel sequence than rank 0");
  be.synchronize();
  dsv4::cuda_trace_begin(static_cast<int64_t>(K) * n + 64, devs);
  for (int i = 0; i < n; ++i) step(fwd, false);
  std::vector<std::vector<uint64_t>> t;
  for (int d : devs) t.push_back(dsv4::cuda_trace_end(d));
  for (size_t r = 0; r < t.size(); ++r)
    if (t[r].size() != K * static_cast<size_t>(n))
      fail("--trace-steps: rank ", r, ": ", t[r].size(), " stamps for ", n, " steps of ", K, " kernels: some kernel "
           "launched through kernels.cu does not call pdl_wait() (or a kernel ran outside the recording)");
  // Per position in the step: mean over replays of the gap to the next kernel's stamp (the last kernel: none). Means,
  // not medians: %globaltimer may tick in ~1 us steps, and a mean over replays resolves below the tick.
  auto gap = [&](size_t rk, size_t a, size_t b) { return static_cast<double>(static_cast<int64_t>(t[rk][b] - t[rk][a])) * 1e-3; };
  std::vector<std::vector<double>> cost(t.size(), std::vector<double>(K - 1, 0.0));
  for (size_t rk = 0; rk < t.size(); ++rk)
    for (size_t i = 0; i + 1 < K; ++i) {
      for (int r = 0; r < n; ++r) cost[rk][i] += gap(rk, r * K + i, r * K + i + 1);
      cost[rk][i] /= n;
    }
  std::vector<double> span;
  for (int r = 0; r < n; ++r) span.push_back(gap(0, r * K, r * K + K - 1));
  const std::vector<std::string>& nm0 = names[0];
  std::vector<std::string> order;
  std::map<std::string, std::pair<int, std::vector<double>>> agg;  // name -> count, summed cost per rank
  for (size_t i = 0; i + 1 < K; ++i) {
    auto [it, fresh] = agg.try_emplace(nm0[i], 0, std::vector<double>(t.size(), 0.0));
    if (fresh) order.push_back(nm0[i]);
    it->second.first += 1;
    for (size_t rk = 0; rk < t.size(); ++rk) it->second.second[rk] += cost[rk][i];
  }
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) { return agg[a].second[0] > agg[b].second[0]; });
  const double total = std::accumulate(cost[0].begin(), cost[0].end(), 0.0);
  std::printf("  decode step as traced%s (%d replays, %zu kernels; first stamp to last: median %.1f us, the timed step "
              "%.1f us):\n", tp > 1 ? " on rank 0" : "", n, K, median(span), step_us);
  std::printf("    %9s %6s %5s %9s %9s  kernel\n", "us/step", "share", "count", "us each", "us/layer");
  for (const auto& nm : order) {
    const auto& [c, us] = agg[nm];
    std::printf("    %9.1f %5.1f%% %5d %9.2f %9.2f  %s\n", us[0], 100.0 * us[0] / total, c, us[0] / c, us[0] / layers,
                nm.substr(0, 90).c_str());
  }
  if (tp > 1) {
    std::printf("  us per layer on each rank (its own clock; the step: rank 0 %.1f", total / layers);
    for (size_t rk = 1; rk < t.size(); ++rk)
      std::printf(", rank %zu %.1f", rk, std::accumulate(cost[rk].begin(), cost[rk].end(), 0.0) / layers);
    std::printf("):\n");
    for (const auto& nm : order) {
      std::printf("   ");
      for (size_t rk = 0; rk < t.size(); ++rk) std::printf(" %8.2f", agg[nm].second[rk] / layers);
      std::printf("  %s\n", nm.substr(0, 80).c_str());
    }
  }
  // One layer in order (layer 2: Flash's first CSA layer), so the chain of a layer can be read. Layers are found by
  // their mHC pre-mix kernels (two per layer: attention and FFN; fused with the post before them but in layer 0's
  // attention pre).
  std::vector<size_t> mix;
  for (size_t i = 0; i < K; ++i)
    if (nm0[i].rfind("hc_mix_kernel", 0) == 0 || nm0[i].rfind("hc_post_mix_kernel", 0) == 0) mix.push_back(i);
  if (layers >= 3 && mix.size() >= 6) {
    const size_t from = mix[4], to = mix.size() > 6 ? mix[6] : K - 1;
    std::printf("  layer 2 in launch order (us on the critical path, mean over replays%s):\n", tp > 1 ? "; one column per rank" : "");
    for (size_t i = from; i < std::min(K - 1, to); ++i) {
      std::printf("   ");
      for (size_t rk = 0; rk < t.size(); ++rk) std::printf(" %7.2f", cost[rk][i]);
      std::printf("  %s\n", nm0[i].substr(0, 90).c_str());
    }
  }
}

int cmd_bench(const std::vector<std::string>& args) {
  CLI::App app{"Benchmark the whole forward on synthetic full-size weights (real shapes and formats) on the GPU(s)",
               "dsv4 bench"};
  std::string which, format = "instruct", json_path;
  int layers = 0, batch = 1, tp = 1, chunk = 0, steps = 30, profile_steps = 0, trace_steps = 0;
  bool profile_prefill = false, speculative = false;
  int64_t context = 8192, prompt = -1;
  app.add_option("--synthetic", which, "flash|pro: random weights with the release's shapes and formats")
      ->required()->check(CLI::IsMember({"flash", "pro"}));
  app.add_option("--layers", layers, "main layers to build (default: all; Flash at full depth needs --tp 2)");
  app.add_option("--context", context, "decode at this context length")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--batch", batch, "also time batched decode: one token of each of B sequences per step (each "
                 "prefilled to the context first, untimed)")->check(CLI::Range(1, 256));
  app.add_option("--prompt", prompt, "prefill a prompt of this many tokens, timed (default: the context)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--tp", tp, "tensor-parallel GPUs (1, 2, 4, 8)")->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("--chunk", chunk, "prefill chunk (tokens per forward; default: what `dsv4 run` takes at this --context, "
                 "dsv4::default_prefill_chunk)")->check(CLI::Range(1, 65536));
  app.add_option("--steps", steps, "timed decode steps (graph replays; median reported)")->check(CLI::Range(20, 100000));
  app.add_option("--format", format, "instruct (FP8 + MXFP4 experts) | base (FP8 everywhere) | nvfp4")
      ->check(CLI::IsMember({"instruct", "base", "nvfp4"}));
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  app.add_flag("--speculative", speculative,
               "also build the MTP block and time speculative decoding's two parts at the context: the MTP draft "
               "(one block + LM head) and the verify forward of [token, draft] (with its rollback); prints the tok/s "
               "they give at a few acceptance rates (random weights cannot measure one)");
  app.add_option("--profile-steps", profile_steps,
                 "after the timing, run this many decode steps (graph replays, no LM head) between "
                 "cudaProfilerStart/Stop, for `ncu --profile-from-start off` (tools/gpu/profile_decode.sh)")
      ->check(CLI::Range(0, 100));
  app.add_flag("--profile-prefill", profile_prefill,
               "run the timed prefill between cudaProfilerStart/Stop, for `ncu --profile-from-start off` "
               "(tools/gpu/profile_prefill.sh)");
  app.add_option("--trace-steps", trace_steps,
                 "after the timing, replay this many decode steps with every kernel stamping the moment its "
                 "predecessor completed, and print each kernel's share of the step as the graph really runs (under --tp every rank, "
                 "each on its own clock, side by side; "
                 "the side streams (shared expert, compressor / indexer) are turned off for the whole run so that the stream is linear)")
      ->check(CLI::Range(0, 1000));
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  if (chunk == 0) chunk = dsv4::default_prefill_chunk("cuda", context);
  if (trace_steps > 0) {
    ::setenv("DSV4_MOE_FORK", "0", 1);  // read at the first moe(): one stream, so stamps follow launch order
    ::setenv("DSV4_ATTN_FORK", "0", 1);  // likewise the compressor / indexer branch (read at the first attn_qkv())
    std::fprintf(stderr, "[bench] --trace-steps: the shared expert and the compressor / indexer run on the main stream in this run\n");
    if (tp > 1)
      std::fprintf(stderr, "[bench] --trace-steps with --tp %d: rank 0's kernels on cuda:0; the all-reduce kernels do not "
                   "stamp, so each collective's time shows in the kernel launched before it\n", tp);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // results survive a run killed by a time limit
  if (prompt < 0) prompt = context;
  if (prompt > context) fail("--prompt (", prompt, ") must not exceed --context (", context, ")");
  const dsv4::ModelConfig full = which == "flash" ? dsv4::flash_config() : dsv4::pro_config();
  if (layers == 0) layers = full.n_layers;

  // Device bandwidth first (nothing else allocated yet).
  const double bw = dsv4::cuda_read_bandwidth(0, size_t(4) << 30);
  std::fprintf(stderr, "[bench] streaming read on cuda:0: %.0f GB/s\n", bw / 1e9);

  auto t0 = Clock::now();
  dsv4::SyntheticCheckpoint syn = dsv4::make_synthetic_checkpoint(which, layers, format, 1, speculative);
  const dsv4::ModelConfig cfg = syn.cfg;
  dsv4::CudaOptions opts;
  std::unique_ptr<dsv4::Backend> backend;
  if (tp == 1) backend = dsv4::make_cuda_backend(opts);
  else {
    std::vector<int> devs;
    for (int i = 0; i < tp; ++i) devs.push_back(i);
    backend = dsv4::make_tp_backend(devs, opts);
  }
  dsv4::Backend* be = backend.get();
  dsv4::Model model(cfg, std::move(syn.ckpt), std::move(backend), dsv4::Numerics::Official);
  const double load_s = secs(t0, Clock::now());
  const std::vector<uint64_t> wbytes = dsv4::cuda_weight_bytes(*be);
  std::fprintf(stderr, "[bench] built and loaded %d %s layers (%s) on %d GPU(s) in %.1f s; weights on cuda:0 %.2f GiB\n",
               layers, which.c_str(), format.c_str(), tp, load_s, wbytes[0] / 1073741824.0);

  // Random prompt tokens (a fixed seed: runs are comparable).
  std::mt19937 rng(7);
  // Capacity: the single-sequence decode (2 x (steps + 2) + 3 profiled steps), then the batched steps (steps + 2).
  const int64_t capacity = context + 5 * static_cast<int64_t>(steps) + 41 + trace_steps + 2 + profile_steps;
  std::vector<int32_t> ids(static_cast<size_t>(capacity));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 128000u + 100u);
  auto st = be->new_sequence(capacity);

  // Prefill: the first `prompt` tokens timed, the rest up to the context untimed.
  dsv4::Forward pre(model, chunk);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  auto run_prefill = [&](int64_t from, int64_t to) {
    if (from >= to) return;
    const auto a = Clock::now();
    for (int64_t p = from; p < to; p += chunk) {
      const int n = static_cast<int>(std::min<int64_t>(chunk, to - p));
      pre.forward(*st, ids.data() + p, n, p, p + n == to ? logits.data() : nullptr, true);
      // Progress (a stall shows where it is); the host runs ahead of the GPU here, so these times are issue times.
      std::fprintf(stderr, "[bench] prefill issued %lld/%lld tokens at %.1f s\n", (long long)(p + n), (long long)to,
                   secs(a, Clock::now()));
    }
    be->synchronize();
    std::fprintf(stderr, "[bench] prefill of positions %lld..%lld done in %.2f s\n", (long long)from, (long long)to,
                 secs(a, Clock::now()));
  };
  // A first, untimed prefill of one chunk (then the sequence is reset): the timed one measures the steady state a
  // server sees, not the process's one-time costs (cuBLASLt handles and algorithm queries, lazy kernel loading, the
  // scratch buffers' first cudaMalloc). The cold prefill's rate is reported too.
  double cold_s = 0;
  int64_t cold_n = std::min<int64_t>(chunk, prompt);
  {
    t0 = Clock::now();
    run_prefill(0, cold_n);
    cold_s = secs(t0, Clock::now());
    st->reset();
    st->set_tokens(0);
  }
  // The timed prefill also records an event pair around every op (rank 0 under TP): where prefill time goes.
  dsv4::cuda_set_eager_profiling(*be, true);
  if (profile_prefill) {
    be->synchronize();
    dsv4::cuda_profiler_range(true);
  }
  t0 = Clock::now();
  run_prefill(0, prompt);
  const double prefill_s = secs(t0, Clock::now());
  if (profile_prefill) dsv4::cuda_profiler_range(false);
  const auto prefill_prof = dsv4::cuda_eager_profile(*be);
  dsv4::cuda_set_eager_profiling(*be, false);
  run_prefill(prompt, context);

  // Decode: single-token steps at positions context, context+1, ...; the first two (eager, then recorded) untimed.
  dsv4::Forward dec(model, 1), dec_head(model, 1), dec_prof(model, 1);
  int64_t pos = context;
  std::vector<double> t_layers, t_full;
  auto step = [&](dsv4::Forward& f, bool head) {
    const auto a = Clock::now();
    f.forward(*st, &ids[static_cast<size_t>(pos)], 1, pos, head ? logits.data() : nullptr);
    if (!head) be->synchronize();
    ++pos;
    return secs(a, Clock::now()) * 1e6;
  };
  // Each Forward has its own recording; the sequence advances one token per step either way.
  for (int i = 0; i < 2; ++i) step(dec, false), step(dec_head, true);
  std::fprintf(stderr, "[bench] decode graphs recorded; timing %d + %d steps\n", steps, steps);
  for (int i = 0; i < steps; ++i) t_layers.push_back(step(dec, false));
  std::fprintf(stderr, "[bench] decode step without head: median %.1f us\n", median(t_layers));
  for (int i = 0; i < steps; ++i) t_full.push_back(step(dec_head, true));
  std::fprintf(stderr, "[bench] decode step with head: median %.1f us\n", median(t_full));
  // Per-op profile: TP1 only. Under TP the recording with events between the ops stopped making progress on the
  // 43-layer TP2 run (2026-11-29; the plain decode graphs, timed above, run fine) -- open, so it is not attempted.
  std::vector<std::pair<std::string, double>> prof;
  if (tp == 1) {
    dsv4::cuda_set_op_profiling(*be, true);
    for (int i = 0; i < 3; ++i) step(dec_prof, false);
    prof = dsv4::cuda_op_profile(*be);
    dsv4::cuda_set_op_profiling(*be, false);
    std::fprintf(stderr, "[bench] per-op profile done\n");
  }
  // Speculative decoding's parts at this context (Session::draft / append_verify): the verify forward of two tokens
  // (the rejected case: prepare_drop_last + forward + drop_last, so the sequence advances one token per rep, as a
  // rejected draft does) with both rows' logits downloaded, then the MTP block's draft for the kept position (one
  // block + its LM head pass, last row's logits downloaded). Host-timed, synchronous (the downloads), median.
  double verify_us = 0, draft_us = 0;
  std::vector<std::pair<std::string, double>> verify_prof;
  if (speculative) {
    dsv4::Forward vf(model, 2);
    std::vector<float> l2(2 * static_cast<size_t>(cfg.vocab_size)), lm(static_cast<size_t>(cfg.vocab_size));
    std::vector<double> tv, td;
    for (int i = 0; i < steps + 2; ++i) {
      auto a = Clock::now();
      st->prepare_drop_last();
      vf.forward_pair(*st, &ids[static_cast<size_t>(pos)], pos, l2.data());
      st->drop_last();
      be->synchronize();
      const double v = secs(a, Clock::now()) * 1e6;
      a = Clock::now();
      vf.forward_mtp(*st, &ids[static_cast<size_t>(pos + 1)], 1, pos, lm.data(), true);
      const double d = secs(a, Clock::now()) * 1e6;
      ++pos;
      if (i >= 2) tv.push_back(v), td.push_back(d);  // the first two: warm-up (scratch growth, lazy loading)
    }
    verify_us = median(tv), draft_us = median(td);
    // One more verify with an event pair around every op: where the pair's time goes.
    dsv4::cuda_set_eager_profiling(*be, true);
    st->prepare_drop_last();
    vf.forward_pair(*st, &ids[static_cast<size_t>(pos)], pos, l2.data());
    st->drop_last();
    ++pos;
    verify_prof = dsv4::cuda_eager_profile(*be);
    dsv4::cuda_set_eager_profiling(*be, false);
    std::fprintf(stderr, "[bench] speculative: verify forward of 2 tokens median %.1f us, MTP draft median %.1f us\n",
                 verify_us, draft_us);
  }
  if (trace_steps > 0) print_trace(model, *be, step, trace_steps, median(t_layers), layers, tp);
  if (profile_steps > 0) {  // the same recorded graph as the timed steps, so the profiler sees exactly those kernels
    be->synchronize();
    dsv4::cuda_profiler_range(true);
    for (int i = 0; i < profile_steps; ++i) step(dec, false);
    dsv4::cuda_profiler_range(false);
    std::fprintf(stderr, "[bench] %d profiled decode steps done\n", profile_steps);
  }
  // The two collectives of a layer: wo_b's [hidden] and the experts' [k + 1, hidden] (per-expert partials).
  const double allreduce_us = tp > 1 ? dsv4::cuda_allreduce_us(*be, static_cast<size_t>(cfg.hidden)) : 0.0;
  const double allreduce_moe_us =
      tp > 1 ? dsv4::cuda_allreduce_us(*be, static_cast<size_t>(cfg.hidden) * (cfg.n_experts_per_tok + 1)) : 0.0;
  if (tp > 1) std::fprintf(stderr, "[bench] all-reduce latency measured\n");

  // Batched decode (what the server runs with several requests decoding): B sequences, the first being the one timed
  // above, the others prefilled to the context (untimed); each step is one forward_batch of one token per sequence,
  // with the LM head. On the GPU: the position-free ops once over the B rows, the attention-side ops per row, the
  // whole step recorded once as a CUDA graph and replayed (Backend::begin_decode_batch; DSV4_BATCH_GRAPHS=0: eager).
  // The per-op split below is of one more step launched op by op (eager profiling turns the recording off).
  double batch_step_us = 0;
  std::vector<std::pair<std::string, double>> batch_prof;
  if (batch > 1) {
    std::vector<std::unique_ptr<dsv4::SequenceState>> extra;
    std::vector<dsv4::SequenceState*> sts{st.get()};
    std::vector<int64_t> bpos{pos};
    for (int b = 1; b < batch; ++b) {
      extra.push_back(be->new_sequence(capacity));
      for (int64_t p = 0; p < context; p += chunk) {
        const int n = static_cast<int>(std::min<int64_t>(chunk, context - p));
        pre.forward(*extra.back(), ids.data() + p, n, p, nullptr, true);
      }
      sts.push_back(extra.back().get());
      bpos.push_back(context);
      std::fprintf(stderr, "[bench] batch sequence %d/%d prefilled\n", b + 1, batch);
    }
    be->synchronize();
    dsv4::Forward decb(model, batch);
    std::vector<int32_t> bids(static_cast<size_t>(batch));
    std::vector<float> blogits(static_cast<size_t>(batch) * static_cast<size_t>(cfg.vocab_size));
    std::vector<double> tb;
    for (int i = 0; i < steps + 2; ++i) {
      for (int b = 0; b < batch; ++b) bids[static_cast<size_t>(b)] = ids[static_cast<size_t>(bpos[static_cast<size_t>(b)] % context)];
      const auto a = Clock::now();
      decb.forward_batch(sts.data(), bids.data(), bpos.data(), batch, blogits.data());  // downloads: synchronous
      if (i >= 2) tb.push_back(secs(a, Clock::now()) * 1e6);
      for (auto& p : bpos) ++p;
    }
    batch_step_us = median(tb);
    std::fprintf(stderr, "[bench] batched decode (%d sequences): median %.1f us per step\n", batch, batch_step_us);
    // One more step with an event pair around every op (rank 0 under TP): where the batched step's time goes.
    for (int b = 0; b < batch; ++b) bids[static_cast<size_t>(b)] = ids[static_cast<size_t>(bpos[static_cast<size_t>(b)] % context)];
    dsv4::cuda_set_eager_profiling(*be, true);
    decb.forward_batch(sts.data(), bids.data(), bpos.data(), batch, blogits.data());
    batch_prof = dsv4::cuda_eager_profile(*be);
    dsv4::cuda_set_eager_profiling(*be, false);
    for (auto& p : bpos) ++p;
  }

  // Bytes per decode token on rank 0 (its shards), at the middle of the timed steps.
  g_tp = tp;
  const dsv4::ModelWeights& w0 = model.weights();  // full weights; device_bytes() takes one rank's share
  StepBytes total;
  for (const auto& L : w0.layers) {
    const StepBytes b = layer_bytes(cfg, L, context + steps);
    total.weights += b.weights;
    total.kv += b.kv;
  }
  const uint64_t head_bytes = device_bytes(w0.head);
  const double step_us = median(t_layers), full_us = median(t_full);
  const int collectives = 2 * layers;
  const double bound_us = (total.weights + total.kv) / bw * 1e6 + (allreduce_us + allreduce_moe_us) * layers;
  const double per_layer_us = step_us / layers, per_layer_bound = bound_us / layers;
  const double head_us = full_us - step_us;
  const double prefill_tps = prompt / prefill_s;
  // Extrapolation to the full depth: layer time scales with the layer count; head and embedding once.
  const double full_depth_step_us = per_layer_us * full.n_layers + head_us;
  const double prefill_tps_full = prefill_tps * layers / full.n_layers;

  std::printf("dsv4 bench --synthetic %s --layers %d --context %lld --prompt %lld --tp %d (%s, official numerics)\n",
              which.c_str(), layers, (long long)context, (long long)prompt, tp, format.c_str());
  std::printf("  streaming-read bandwidth     %8.0f GB/s (cuda:0)\n", bw / 1e9);
  if (tp > 1)
    std::printf("  all-reduce (%s) %lld B / %lld B  %6.1f / %.1f us (graph of back-to-back calls; %d of each per step)\n",
                dsv4::cuda_allreduce_kind(*be, static_cast<size_t>(cfg.hidden)), (long long)cfg.hidden * 4, (long long)cfg.hidden * 4 * (cfg.n_experts_per_tok + 1), allreduce_us,
                allreduce_moe_us, collectives / 2);
  std::printf("  decode step, %d layers, no head  %8.1f us  (median of %d graph replays)\n", layers, step_us, steps);
  std::printf("    bytes per step per GPU     %8.1f MB weights + %.1f MB KV (fp32 KV layout)\n", total.weights / 1e6, total.kv / 1e6);
  std::printf("    bound                      %8.1f us  -> %.2fx the bound (%.0f%% of bandwidth)\n", bound_us,
              step_us / bound_us, 100.0 * bound_us / step_us);
  std::printf("    per layer                  %8.1f us  (bound %.1f us)\n", per_layer_us, per_layer_bound);
  std::printf("  decode step with LM head     %8.1f us  (head + logits copy %.1f us; head %.0f MB)\n", full_us, head_us, head_bytes / 1e6);
  if (batch > 1)
    std::printf("  batched decode, %d sequences %8.1f us per step with LM head = %.1f tok/s aggregate (%.1f us per token; "
                "batch 1: %.1f us)\n", batch, batch_step_us, batch * 1e6 / batch_step_us, batch_step_us / batch, full_us);
  std::printf("  -> %d layers: %.1f tok/s; extrapolated to %d layers: %.1f tok/s (this run's layer mix scaled)\n", layers,
              1e6 / full_us, full.n_layers, 1e6 / full_depth_step_us);
  if (speculative) {
    // A cycle = one MTP draft + one verify forward; it yields 1 + a tokens at acceptance rate a.
    const double cycle = verify_us + draft_us;
    std::printf("  speculative (MTP, 1 draft): verify forward of 2 tokens %.1f us (%.2fx the plain step with head), "
                "MTP draft %.1f us\n", verify_us, verify_us / full_us, draft_us);
    std::printf("    tok/s at %d layers by acceptance rate (modeled from the two timings; plain %.1f):", layers, 1e6 / full_us);
    for (double a : {0.5, 0.7, 0.8, 0.9}) std::printf("  %.0f%%: %.1f", a * 100, (1 + a) * 1e6 / cycle);
    std::printf("\n");
    double vt = 0;  // ops only: a part ("moe/down") is inside its op's time too
    for (const auto& [n, ms] : verify_prof) vt += n.find('/') == std::string::npos ? ms : 0.0;
    std::printf("    verify forward by op (one pair, eager, events around each op; sum %.1f us):\n", vt * 1e3);
    for (const auto& [n, ms] : verify_prof)
      std::printf("      %-24s %10.1f us  %5.1f%%\n", n.c_str(), ms * 1e3, 100.0 * ms / std::max(vt, 1e-12));
  }
  std::printf("  prefill %lld tokens (chunk %d) %8.2f s = %.0f tok/s; extrapolated to %d layers: %.0f tok/s\n",
              (long long)prompt, chunk, prefill_s, prefill_tps, full.n_layers, prefill_tps_full);
  std::printf("    (the process's first prefill, %lld tokens, cold: %.2f s = %.0f tok/s)\n", (long long)cold_n, cold_s,
              cold_n / std::max(cold_s, 1e-9));
  if (tp == 1) std::printf("  decode time by op (one step, events in the graph):\n");
  else std::printf("  decode time by op: not measured under TP (the profiled recording stalled at 43 layers; open)\n");
  double prof_total = 0;
  for (const auto& [n, ms] : prof) prof_total += ms;
  for (const auto& [n, ms] : prof)
    std::printf("    %-14s %8.1f us  %5.1f%%\n", n.c_str(), ms * 1e3, 100.0 * ms / std::max(prof_total, 1e-12));

  double pre_total = 0;  // ops only: a part ("moe/down") is inside its op's time too
  for (const auto& [n, ms] : prefill_prof) pre_total += n.find('/') == std::string::npos ? ms : 0.0;
  std::printf("  prefill time by op (%s, all %lld tokens, events around each op):\n", tp > 1 ? "rank 0" : "one GPU",
              (long long)prompt);
  for (const auto& [n, ms] : prefill_prof)
    std::printf("    %-24s %10.1f ms  %5.1f%%\n", n.c_str(), ms, 100.0 * ms / std::max(pre_total, 1e-12));

  if (batch > 1) {
    double bt = 0;  // ops only: a part ("moe/down") is inside its op's time too
    for (const auto& [n, ms] : batch_prof) bt += n.find('/') == std::string::npos ? ms : 0.0;
    std::printf("  batched decode time by op (%s, one step of %d sequences, eager, events around each op):\n",
                tp > 1 ? "rank 0" : "one GPU", batch);
    for (const auto& [n, ms] : batch_prof)
      std::printf("    %-24s %10.1f us  %5.1f%%\n", n.c_str(), ms * 1e3, 100.0 * ms / std::max(bt, 1e-12));
  }

  nlohmann::json j = {{"model", which}, {"format", format}, {"layers", layers}, {"tp", tp}, {"context", context},
                      {"prompt", prompt}, {"chunk", chunk}, {"bandwidth_gbs", bw / 1e9},
                      {"allreduce_us", allreduce_us}, {"allreduce_kind", tp > 1 ? dsv4::cuda_allreduce_kind(*be, static_cast<size_t>(cfg.hidden)) : "none"}, {"allreduce_moe_us", allreduce_moe_us}, {"decode_step_us", step_us}, {"decode_step_with_head_us", full_us},
                      {"decode_bound_us", bound_us}, {"decode_fraction_of_bound", bound_us / step_us},
                      {"per_layer_us", per_layer_us}, {"per_layer_bound_us", per_layer_bound},
                      {"weight_bytes_per_step", total.weights}, {"kv_bytes_per_step", total.kv},
                      {"decode_tok_s", 1e6 / full_us}, {"decode_tok_s_full_depth", 1e6 / full_depth_step_us},
                      {"prefill_s", prefill_s}, {"prefill_tok_s", prefill_tps}, {"prefill_cold_tokens", cold_n}, {"prefill_cold_s", cold_s}, {"prefill_tok_s_full_depth", prefill_tps_full},
                      {"load_s", load_s}, {"batch", batch}, {"batch_step_us", batch_step_us},
                      {"batch_tok_s", batch > 1 ? batch * 1e6 / batch_step_us : 0.0},
                      {"spec_verify_us", verify_us}, {"spec_draft_us", draft_us}};
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [n, ms] : prof) ops[n] = ms * 1e3;
  j["decode_op_us"] = ops;
  nlohmann::json pops = nlohmann::json::object();
  for (const auto& [n, ms] : prefill_prof) pops[n] = ms;
  j["prefill_op_ms"] = pops;
  std::printf("%s\n", j.dump().c_str());
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) fail(json_path, ": write failed");
  }
  return 0;
}

}  // namespace
#else
namespace {
int cmd_bench(const std::vector<std::string>&) {
  dsv4::fail("dsv4 bench needs the CUDA backend, which this build does not have (dsv4 --version)");
}
}  // namespace
#endif

DSV4_REGISTER_COMMAND("bench", "whole-model benchmark on synthetic full-size weights (GPU)", cmd_bench);
