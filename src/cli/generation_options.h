#pragma once
// The model/sampling flags shared by `dsv4 run` and `dsv4 chat`, and what they load.
#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/progress.h"
#include "core/error.h"
#include "dsv4/engine.h"
#include "runtime/generation.h"
#include "text/chat_encoder.h"
#include "text/tokenizer.h"

namespace dsv4::cli {

struct Loaded {
  std::unique_ptr<Engine> engine;
  text::Tokenizer tokenizer;
};

struct GenerationFlags {
  std::string model, mode = "thinking", effort, backend = "cpu", numerics = "reference";
  int tp = 1;
  int max_tokens = 256;
  int prefill_chunk = 0;  // 0: dsv4::default_prefill_chunk
  std::string speculative = "none";
  int64_t max_context = 4096;
  SamplingParams s;
  std::vector<std::string> stop;
  CLI::Option *temperature_opt = nullptr, *top_p_opt = nullptr, *top_k_opt = nullptr;

  void add_to(CLI::App& app) {
    app.add_option("--model", model, "model directory (config.json, safetensors, tokenizer.json)")->required();
    app.add_option("--mode", mode, "thinking|chat")->check(CLI::IsMember({"thinking", "chat"}));
    app.add_option("--reasoning-effort", effort, "high|max")->check(CLI::IsMember({"high", "max"}));
    app.add_option("--max-tokens", max_tokens, "completion token limit")->check(CLI::NonNegativeNumber);
    temperature_opt = app.add_option("--temperature", s.temperature,
                                     "0 = greedy (default: the model's generation_config.json, else 1.0)");
    top_p_opt = app.add_option("--top-p", s.top_p, "nucleus sampling mass (default: generation_config.json, else 1.0)");
    top_k_opt = app.add_option("--top-k", s.top_k, "keep the k most likely tokens (0 = off)");
    app.add_option("--min-p", s.min_p, "drop tokens below min_p * p(top)");
    app.add_option("--repetition-penalty", s.repetition_penalty, "CTRL-style repetition penalty");
    app.add_option("--presence-penalty", s.presence_penalty, "OpenAI presence penalty");
    app.add_option("--frequency-penalty", s.frequency_penalty, "OpenAI frequency penalty");
    app.add_option("--seed", s.seed, "sampling seed (same seed -> same output)");
    app.add_option("--stop", stop, "stop string (answer content only; repeatable)");
    app.add_option("--backend", backend, "cpu|cuda")->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--numerics", numerics, "reference|official")->check(CLI::IsMember({"reference", "official"}));
    app.add_option("--tp", tp, "tensor-parallel GPUs for --backend cuda (1, 2, 4, 8)")->check(CLI::IsMember({1, 2, 4, 8}));
    app.add_option("--max-context", max_context, "tokens of state per session (sized up front)")->check(CLI::PositiveNumber);
    app.add_option("--prefill-chunk", prefill_chunk,
                   "prompt tokens per forward pass (default: 8192 on CUDA, at most --max-context; 256 on the CPU)")
        ->check(CLI::PositiveNumber);
    app.add_option("--speculative", speculative,
                   "none|mtp: mtp drafts one token per step with the checkpoint's MTP block and verifies it in the same "
                   "forward (same output as none; on one H200 the recorded verify costs ~1.6x a plain step plus the "
                   "draft, so it pays only at high acceptance -- modeled +7 % at 90 %, docs/BENCHMARKS.md)")
        ->check(CLI::IsMember({"none", "mtp"}));
  }

  // Sampling defaults from the model's generation_config.json (temperature / top_p / top_k) for every flag the user
  // did not give; DeepSeek ships temperature 1.0, top_p 1.0.
  void apply_generation_config() {
    std::ifstream f(model + "/generation_config.json");
    if (!f) return;
    auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) fail(model, "/generation_config.json is not a JSON object");
    auto num = [&](const char* key, auto& dst, CLI::Option* opt) {
      if (opt->count() == 0 && j.contains(key) && j[key].is_number()) dst = j[key].template get<std::decay_t<decltype(dst)>>();
    };
    num("temperature", s.temperature, temperature_opt);
    num("top_p", s.top_p, top_p_opt);
    num("top_k", s.top_k, top_k_opt);
  }

  Loaded load() const {
    EngineOptions o;
    o.model_dir = model;
    o.backend = backend;
    o.numerics = numerics;
    o.tp = tp;
    o.max_context = max_context;
    o.prefill_chunk = prefill_chunk;
    o.speculative = speculative;
    ProgressBar bar("loading");
    bar.message(("loading " + model + " ...").c_str());  // weights are mmapped, then prepared by the backend
    Loaded l{Engine::load(o), text::Tokenizer::from_file(model + "/tokenizer.json")};
    bar.clear();
    if (l.tokenizer.vocab_size() > l.engine->info().vocab_size)
      fail(model, "/tokenizer.json has ", l.tokenizer.vocab_size(), " ids but the model's vocabulary is ",
           l.engine->info().vocab_size);
    return l;
  }

  text::ChatOptions chat_options() const {
    text::ChatOptions c;
    c.mode = mode == "chat" ? text::ThinkingMode::kChat : text::ThinkingMode::kThinking;
    if (!effort.empty()) c.reasoning_effort = effort;
    return c;
  }

  GenerationRequest request() const {
    GenerationRequest r;
    r.mode = chat_options().mode;
    r.max_tokens = max_tokens;
    r.sampling = s;
    r.stop = stop;
    return r;
  }
};

}  // namespace dsv4::cli
