#pragma once
// Writes small random DeepSeek-V4 checkpoints in every supported layout/format (tests, `dsv4 make-tiny`, and the
// embedded default model). Shapes and names follow the same inventory resolve_model_weights() checks.
#include <cstdint>
#include <string>

namespace dsv4 {

struct TinySpec {
  std::string format = "fp8";    // bf16 | fp8 (FP8 E8M0 + MXFP4 experts) | base (FP8 F32 scales, FP8 experts) |
                                 // nvfp4 (fp8 + NVFP4 routed experts). The HF layout comes from tools/oracle.
  std::string schedule = "flash";  // flash (SWA, SWA, CSA/HCA...) | pro (HCA, HCA, CSA/HCA...)
  int64_t vocab = 129280;  // the real V4 vocabulary (so the real tokenizer applies)
  int layers = 4;
  uint64_t seed = 1;
  bool with_mtp = true;
  // Widths a tensor-parallel split of up to 8 ranks cuts on whole FP8 128x128 tiles / FP4 blocks (8 heads in 8
  // o_groups, o_lora_rank 128, expert width 1024; q_lora_rank 128 so that FP8 wq_a|wkv stack on whole tiles), for
  // TP-vs-TP1 tests and the CUDA backend's stacked-GEMV paths; the default dims are smaller and do not split.
  bool tp_ready = false;
  // Hidden size (a multiple of 64). 128 with tp_ready gives routed experts whose widths are whole 128-column steps
  // (d 128, I 1024): the shapes the CUDA backend's MMA decode experts take (the default 64 does not).
  int64_t hidden = 64;
};

void write_tiny_model(const std::string& dir, const TinySpec& spec);

}  // namespace dsv4
