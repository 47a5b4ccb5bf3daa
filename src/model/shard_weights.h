#pragma once
// One tensor-parallel rank's view of a model's weights (issue 8): the tensors model/sharding.h splits are replaced by
// this rank's slice, everything else is shared with the full weights. Row slices are zero-copy views into the mmapped
// checkpoint; column slices (wo_b, expert w2) are gathered once into owned host buffers. The result loads into any
// backend like a whole checkpoint: the rank's backend sees smaller wq_b / wo_a / wo_b / expert / head shapes.
#include "checkpoint/config.h"
#include "model/model_weights.h"

namespace dsv4 {

// What rank `rank` of `tp` holds. Throws dsv4::Error (naming the tensor) when a slice would cut an FP8 128x128 scale
// tile or an FP4 scale block, or when the config does not split tp ways (check_tp).
ModelWeights shard_model_weights(const ModelWeights& w, const ModelConfig& c, int rank, int tp);

// A linear's slice along its output rows [r0, r1) or input columns [c0, c1) (logical element units). Exposed for tests.
LinearRef slice_linear_rows(const LinearRef& r, int64_t r0, int64_t r1, ModelWeights& keep);
LinearRef slice_linear_cols(const LinearRef& r, int64_t c0, int64_t c1, ModelWeights& keep);

}  // namespace dsv4
