#pragma once
// Synthetic full-size weights (issue 6/8/9 benchmarks): the real tensor inventory of a release (names, shapes, stored
// formats; model/inventory.h) for the first `layers` layers, with random values that are valid in every format (no
// NaN codes, moderate block scales, distinct hash-routing experts per token). No checkpoint is read: tensors of one
// dtype share one random host pool, so host memory stays small while every tensor is uploaded to its own device
// memory by the backend's ordinary loader.
#include <memory>
#include <string>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "model/inventory.h"

namespace dsv4 {

struct SyntheticCheckpoint {
  ModelConfig cfg;          // the release config cut to `layers` main layers (+ the MTP block if asked)
  ckpt::Checkpoint ckpt;    // in-memory; views into `pools`
  std::shared_ptr<void> pools;
};

// which: "flash" or "pro"; format: instruct (FP8 + MXFP4 experts), base, or nvfp4. with_mtp: the MTP block too (the
// speculative-decoding bench). Throws on bad arguments.
SyntheticCheckpoint make_synthetic_checkpoint(const std::string& which, int layers, const std::string& format = "instruct",
                                              uint64_t seed = 1, bool with_mtp = false);

// The first `layers` main layers of a config (ratios, kinds), and its MTP entries when keep_mtp.
ModelConfig truncate_layers(const ModelConfig& c, int layers, bool keep_mtp = false);

}  // namespace dsv4
