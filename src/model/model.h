#pragma once
// The DeepSeek-V4 forward pass, written once against the Backend op interface (MODEL.md §5, order of §6.5).
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "model/backend.h"
#include "model/model_weights.h"

namespace dsv4 {

// A loaded model: config + mmapped checkpoint + resolved weights + a backend holding them.
class Model {
 public:
  // Reads MODEL_DIR/config.json and the safetensors shards, resolves and validates every tensor, loads the backend.
  Model(const std::string& model_dir, std::unique_ptr<Backend> backend, Numerics numerics);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() { return *backend_; }
  Numerics numerics() const { return numerics_; }

 private:
  ModelConfig cfg_;
  ckpt::Checkpoint ckpt_;
  ModelWeights weights_;
  std::unique_ptr<Backend> backend_;
  Numerics numerics_;
};

// Runs chunks of one sequence through the model. All activation buffers are allocated once for `max_chunk` tokens;
// forward() performs no allocation.
class Forward {
 public:
  Forward(Model& model, int max_chunk);
  int max_chunk() const { return max_chunk_; }
  // Processes ids[0..n) at positions [pos0, pos0+n) (pos0 must equal the number of tokens already in `st`);
  // writes logits[n, vocab] to host memory if `logits` is non-null.
  void forward(SequenceState& st, const int32_t* ids, int n, int64_t pos0, float* logits);

 private:
  Model& m_;
  int max_chunk_;
  // Backend-memory activations.
  float *X_, *x_, *post_, *comb_, *qr_, *q_, *kv_, *o_, *y_, *logits_;
  int32_t *ids_, *topk_;
};

}  // namespace dsv4
