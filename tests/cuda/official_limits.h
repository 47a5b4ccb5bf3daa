#pragma once
// CUDA-vs-CPU limits for official numerics, per checkpoint. Official numerics are chaotic on the tiny random
// checkpoints: a one-ulp move of half the F32 weights changes CPU official logits by the "noise floor" measured in
// noise_floor_test.cpp (CPU only). CUDA differs from the CPU by fp32 summation order only, so it is held to 2x that
// floor; 0.1 rel L2 / 90 % top-1 (2x the flash_fp8 floor, the first one measured) is the default where 2x the
// model's own floor is smaller. noise_floor_test.cpp re-measures every floor and fails if a limit here drops below 2x.
#include <string>

namespace dsv4::test {

struct OfficialLimit {
  double rel = 0.1;   // max rel L2 of the logits
  double top1 = 0.9;  // min fraction of positions with the same argmax
};

inline OfficialLimit official_limit(const std::string& label) {
  OfficialLimit l;
  (void)label;
  return l;
}

}  // namespace dsv4::test
