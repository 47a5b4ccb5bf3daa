#pragma once
// Storage formats of linear weights, detected per tensor from the checkpoint (never from the config), and exact
// dequantization to fp32 (MODEL.md §3.4–3.6).
#include <cstdint>
#include <string>

#include "checkpoint/safetensors.h"

namespace dsv4 {

enum class WeightFormat {
  F32,
  BF16,
  F16,
  FP8_E8M0,  // F8_E4M3 weight + `.scale` F8_E8M0 per 128x128 tile (instruct checkpoints)
  FP8_F32,   // F8_E4M3 weight + `.scale` F32 per 128x128 tile (Base checkpoints)
  MXFP4,     // I8/U8 packed E2M1 [out, in/2] + `.scale` F8_E8M0 [out, in/32] (routed experts)
  NVFP4,     // U8 packed E2M1 + `.weight_scale` F8_E4M3 [out, in/16] + `.weight_scale_2` F32 + `.input_scale` F32
};
const char* weight_format_name(WeightFormat f);

struct LinearRef {
  std::string name;  // official base name, e.g. "layers.3.attn.wq_a"
  WeightFormat fmt = WeightFormat::F32;
  int64_t out = 0, in = 0;  // logical shape [out, in]
  const ckpt::TensorView* weight = nullptr;
  const ckpt::TensorView* scale = nullptr;        // .scale (FP8/MXFP4) or .weight_scale (NVFP4)
  const ckpt::TensorView* scale2 = nullptr;       // NVFP4 .weight_scale_2
  const ckpt::TensorView* input_scale = nullptr;  // NVFP4 .input_scale (activation side of a W4A4 GEMM)
  uint64_t stored_bytes() const;                   // weight + scales as stored
};

// Dequantizes rows [r0, r1) of the weight into out[(r - r0) * in + k] (fp32, exact). Throws on NaN scales.
void dequantize_rows(const LinearRef& w, int64_t r0, int64_t r1, float* out);
// Converts a BF16/F16/F32 tensor to fp32 (exact); throws for other dtypes.
void tensor_to_f32(const ckpt::TensorView& t, float* out);

}  // namespace dsv4
