#pragma once
// Small fp32 kernels shared by the CPU backend's ops.
#include <cstdint>

namespace dsv4::cpu {

// y[n, out] = x[n, in] · W[out, in]ᵀ (row-major), OpenMP over output rows.
void matmul_nt(const float* x, int64_t n, int64_t in, const float* W, int64_t out, float* y);
float dot(const float* a, const float* b, int64_t n);
// out = x * rsqrt(mean(x²) + eps) * w (w may be null: weightless).
void rms_norm(const float* x, int64_t n, const float* w, double eps, float* out);
inline float silu(float v);

}  // namespace dsv4::cpu

#include <cmath>
namespace dsv4::cpu {
inline float silu(float v) { return v / (1.0f + std::exp(-v)); }
}  // namespace dsv4::cpu
