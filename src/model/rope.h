#pragma once
// RoPE frequency tables for the two DeepSeek-V4 profiles (MODEL.md §5.4): "main" (rope_theta, no scaling) for ratio-0
// layers and MTP; "compress" (compress_rope_theta + YaRN blend, no mscale) for layers with a compressor. Interleaved
// pairs on the LAST rope_dim dims of a head. Angles are formed in fp32 (pos * inv_freq) like the reference.
#include <cstdint>
#include <vector>

#include "checkpoint/config.h"

namespace dsv4 {

enum class RopeProfile { Main, Compress };

inline RopeProfile rope_profile_for(const ModelConfig& c, int layer) {
  return c.kind(layer) == AttnKind::SWA ? RopeProfile::Main : RopeProfile::Compress;
}

// rope_dim/2 inverse frequencies (fp32, computed as the reference/HF do).
std::vector<float> rope_inv_freq(const ModelConfig& c, RopeProfile p);

// Rotates the pairs (x[2i], x[2i+1]), i < rope_dim/2, of `x` (which points at the rope slice) by angle pos*inv[i]
// (or its negative when inverse).
void rope_rotate(float* x, const float* inv_freq, int pairs, int64_t pos, bool inverse);

}  // namespace dsv4
