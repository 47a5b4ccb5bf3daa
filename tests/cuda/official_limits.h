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

// Measured floors (worst of 4 perturbations, 2026-11-29) where 2x exceeds the default:
//   base/pro (tiny, FP8 with F32 scales, Pro schedule): rel L2 0.125, top-1 disagreement 14.0 % -> 0.26 / 72 %.
//   (CUDA measured 0.123 / 128 of 150 = 85.3 %: inside the CPU's own one-ulp drift, not a bug.)
//   flash_fp8 fixture: 0.0609 / 3.1 % -> 0.122 / 90 %.  hf_layout: 0.0648 / 1.0 % -> 0.13 / 90 %.
//   nvfp4 fixture: 0.0735 / 13.4 % -> 0.15 / 73.2 %.  Every other checkpoint: 2x floor < 0.1 / 10 %.
inline OfficialLimit official_limit(const std::string& label) {
  OfficialLimit l;
  if (label == "base/pro") l = OfficialLimit{0.26, 0.72};  // 2 x 0.125, rounded up past the printed digits
  if (label == "flash_fp8") l.rel = 0.122;
  if (label == "hf_layout") l.rel = 0.13;
  if (label == "nvfp4") l = OfficialLimit{0.15, 0.732};  // 2 x 0.0735, rounded up
  return l;
}

}  // namespace dsv4::test
