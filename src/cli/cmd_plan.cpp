// dsv4 plan: per-GPU memory plan (weights by tensor-parallel shard + KV state) for a checkpoint or a released config.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "checkpoint/config.h"
#include "cli/command.h"
#include "cli/parse_args.h"
#include "core/error.h"
#include "model/sharding.h"

namespace {

double to_gib(uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

int cmd_plan(const std::vector<std::string>& args) {
  CLI::App app{"Per-GPU memory plan: weights (tensor-parallel shards) and KV state", "dsv4 plan"};
  std::string model, synthetic, format = "instruct";
  int tp = 1, sequences = 1;
  int64_t max_context = 8192;
  double gpu_gib = 139.0;
  app.add_option("--model", model, "model directory (its config.json decides the shapes)");
  app.add_option("--synthetic", synthetic, "flash|pro: the released configs")->check(CLI::IsMember({"flash", "pro"}));
  app.add_option("--format", format, "instruct|base|nvfp4 storage formats")->check(CLI::IsMember({"instruct", "base", "nvfp4"}));
  app.add_option("--tp", tp, "tensor-parallel degree")->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("--max-context", max_context, "tokens of KV per sequence")->check(CLI::PositiveNumber);
  app.add_option("--sequences", sequences, "concurrent sequences")->check(CLI::PositiveNumber);
  app.add_option("--gpu-gib", gpu_gib, "usable memory per GPU (GiB)");
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  if (model.empty() == synthetic.empty()) dsv4::fail("give exactly one of --model DIR or --synthetic flash|pro");
  dsv4::ModelConfig c = !model.empty() ? dsv4::load_model_config(model + "/config.json")
                        : synthetic == "flash" ? dsv4::flash_config() : dsv4::pro_config();
  dsv4::ReleaseFormat f = format == "base" ? dsv4::ReleaseFormat::base()
                          : format == "nvfp4" ? dsv4::ReleaseFormat::nvfp4() : dsv4::ReleaseFormat::instruct();
  auto inv = dsv4::official_inventory(c, f);
  std::printf("%s, %s formats, tp %d, %d sequence(s) x %lld tokens\n", model.empty() ? synthetic.c_str() : model.c_str(),
              format.c_str(), tp, sequences, (long long)max_context);
  bool fits = true;
  for (const auto& kv : dsv4::kv_layouts()) {
    dsv4::MemoryPlan p = dsv4::plan_memory(c, inv, tp, max_context, sequences, kv);
    bool ok = to_gib(p.total_per_gpu()) <= gpu_gib;
    std::printf("  KV %-42s weights %8.2f GiB (replicated %.2f + shard %.2f) + KV %7.2f GiB (%lld B/token) = %8.2f GiB/GPU %s\n",
                kv.name, to_gib(p.weights_per_gpu()), to_gib(p.weights_replicated), to_gib(p.weights_sharded), to_gib(p.kv_per_gpu()),
                (long long)p.kv_bytes_per_token, to_gib(p.total_per_gpu()), ok ? "fits" : "DOES NOT FIT");
    fits &= ok;
  }
  // What the CUDA backend holds today (fp32 FP8 block scales, fp32 KV), which is what it checks before loading.
  const dsv4::MemoryPlan d = dsv4::plan_memory(c, inv, tp, max_context, sequences, dsv4::cuda_kv_layout(c));
  const double today = to_gib(d.weights_device_per_gpu) + to_gib(d.kv_per_gpu());
  std::printf("  CUDA backend today: weights %.2f GiB (FP8 block scales as fp32) + KV %.2f GiB (%s, %lld B/token) = %.2f GiB/GPU %s\n",
              to_gib(d.weights_device_per_gpu), to_gib(d.kv_per_gpu()), dsv4::cuda_kv_layout(c).name,
              (long long)d.kv_bytes_per_token, today, today <= gpu_gib ? "fits" : "DOES NOT FIT");
  std::printf("  all-reduces per layer: %d\n", tp > 1 ? 2 : 0);
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("plan", "per-GPU memory plan for a model or a released config, any TP degree", cmd_plan);
