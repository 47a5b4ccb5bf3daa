#pragma once
// The official-layout tensor inventory of a DeepSeek-V4 model computed from its config (MODEL.md §3.2-3.3): every
// tensor name, shape and stored dtype a release checkpoint holds. Used for synthetic full-size benchmarks, memory
// planning (single GPU and tensor parallel) and to cross-check the real checkpoints' sizes.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "checkpoint/dtype.h"
#include "checkpoint/linear.h"

namespace dsv4 {

struct InventoryTensor {
  std::string name;
  std::vector<int64_t> shape;
  ckpt::DType dtype;
  int64_t numel() const;
  uint64_t bytes() const;
};

// Storage formats of a release: instruct (FP8 E8M0 + MXFP4 experts), Base (FP8 F32 scales everywhere), NVFP4
// (instruct + NVFP4 main-layer routed experts; MTP experts stay MXFP4), or BF16.
struct ReleaseFormat {
  WeightFormat dense = WeightFormat::FP8_E8M0;
  WeightFormat experts = WeightFormat::MXFP4;
  bool with_mtp = true;
  static ReleaseFormat instruct() { return {}; }
  static ReleaseFormat base() { return {WeightFormat::FP8_F32, WeightFormat::FP8_F32, true}; }
  static ReleaseFormat nvfp4() { return {WeightFormat::FP8_E8M0, WeightFormat::NVFP4, true}; }
};

std::vector<InventoryTensor> official_inventory(const ModelConfig& c, const ReleaseFormat& f = ReleaseFormat::instruct());

// The released configs (MODEL.md §1.1), for synthetic runs and planning without a checkpoint.
ModelConfig flash_config();
ModelConfig pro_config();

}  // namespace dsv4
