#pragma once
// The official release's quantization "simulation" primitives (MODEL.md §4.1), in place on fp32 buffers.
#include <cstdint>

namespace dsv4::num {

// BF16 round-to-nearest-even of every element.
void round_bf16(float* x, int64_t n);
// QA8 / SIM8: per `block` consecutive elements: a = max(amax, 1e-4), s = 2^ceil(log2(a/448)),
// x <- e4m3_rne(clamp(x/s, ±448)) * s. QA8 is block 128 (activations into FP8/FP4 GEMMs), SIM8 block 64 (KV).
// n must be a multiple of block.
void fp8_sim(float* x, int64_t n, int block);
// SIM4: per 32 elements: a = max(amax, 6*2^-126), s = 2^ceil(log2(a/6)), x <- e2m1_rne(clamp(x/s, ±6)) * s.
void fp4_sim(float* x, int64_t n);
// Normalised Walsh-Hadamard transform (Sylvester order, scale n^-1/2) of x[0..n), n a power of two.
void hadamard(float* x, int n);

}  // namespace dsv4::num
