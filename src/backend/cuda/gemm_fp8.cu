// Prefill GEMM for FP8 block-scaled weights through cuBLASLt (GPU_KERNELS.md §4: on sm_90 with CUDA 13.0 it runs
// weights with BLK128x128_32F scales in the checkpoint's own [N/128][K/128] order against activations with VEC128_32F
// scales laid out [K/128][M], M a multiple of 4, at 55-67 % of FP8 peak). The decode GEMV streams each weight once per
// 4 tokens, so a 2048-token prefill chunk read every dense matrix 512 times; this path reads it once.
//
// Only for inputs that are already QA8-quantized (official numerics, LinearArgs::x_is_qa8): such a row is, block by
// block of 128, E4M3 values times a power of two, so converting it to E4M3 bytes + fp32 block scales is exact and the
// products the tensor cores form are the ones the CPU reference forms. Reference numerics keep the fp32 GEMV.
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ops.h"
#include "core/error.h"

namespace dsv4::cuda {

namespace {

#define DSV4_LT(call)                                                                                         \
  do {                                                                                                        \
    const cublasStatus_t st_ = (call);                                                                        \
    if (st_ != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error ", static_cast<int>(st_), " in ", #call);          \
  } while (0)

// x [n, K] (row stride ldx, QA8 values) -> q [m_pad, K] E4M3 bytes and scales [K/128, m_pad] (token index fastest);
// rows n..m_pad-1 are zero with scale 1. One warp per (row, 128-block).
__global__ void qa8_to_e4m3_kernel(const float* x, int64_t ldx, int n, int64_t K, int m_pad, uint8_t* q, float* scales) {
  const int64_t nb = K / 128;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (w >= nb * m_pad) return;
  const int t = static_cast<int>(w / nb);
  const int64_t b = w % nb;
  const int lane = threadIdx.x & 31;
  uint8_t* qr = q + static_cast<int64_t>(t) * K + b * 128;
  if (t >= n) {
    for (int i = lane; i < 128; i += 32) qr[i] = 0;
    if (lane == 0) scales[b * m_pad + t] = 1.0f;
    return;
  }
  const float* xr = x + static_cast<int64_t>(t) * ldx + b * 128;
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = xr[lane + 32 * j], amax = fmaxf(amax, fabsf(v[j]));
  amax = dev::warp_max(amax);
  // The QA8 scale rule (warp_fake_quant): on already-quantized values it gives the same or a smaller power of two,
  // and every value divided by it is still an exact E4M3 number.
  const float s = dev::pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float u = fminf(fmaxf(v[j] / s, -448.0f), 448.0f);
    qr[lane + 32 * j] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(u, __NV_SATFINITE, __NV_E4M3));
  }
  if (lane == 0) scales[b * m_pad + t] = s;
}

// Per device: the cuBLASLt handle, a workspace, the activation staging buffers and the chosen algorithm per shape.
struct LtContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(64) << 20;
  uint8_t* q = nullptr;
  size_t q_bytes = 0;
  float* sc = nullptr;
  size_t sc_bytes = 0;
  float* d = nullptr;  // output staging when n is not a multiple of 4
  size_t d_bytes = 0;
  std::map<std::tuple<int64_t, int64_t, int, uint32_t, uint32_t>, cublasLtMatmulAlgo_t> algos;  // N, K, m_pad, aligns
};

LtContext& context() {
  static std::mutex mu;
  static std::map<int, LtContext> ctx;
  int dev = 0;
  DSV4_CU(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  LtContext& c = ctx[dev];
  if (!c.handle) {
    DSV4_LT(cublasLtCreate(&c.handle));
    DSV4_CU(cudaMalloc(&c.workspace, c.workspace_bytes));
  }
  return c;
}

// The pointer's alignment (a power of two, at most 256): the heuristic must only offer algorithms that can use it
// (its default assumption is 256 bytes; stacked weight pairs and scratch offsets may be less aligned).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

template <typename T>
T* grow(T*& p, size_t& have, size_t bytes) {
  if (have < bytes) {
    if (p) DSV4_CU(cudaFree(p));
    p = nullptr;
    DSV4_CU(cudaMalloc(reinterpret_cast<void**>(&p), bytes));
    have = bytes;
  }
  return p;
}

}  // namespace

bool fp8_gemm_eligible(const DevLinear& W, const LinearArgs& a) {
  const bool fp8 = W.fmt == WeightFormat::FP8_E8M0 || W.fmt == WeightFormat::FP8_F32;
  return fp8 && a.x_is_qa8 && a.n >= kFp8GemmMinTokens && a.group_rows == 0 && W.in % 128 == 0 && W.out % 16 == 0 &&
         W.sb_cols == W.in / 128 && a.ldy == W.out && W.scale != nullptr;
}

bool fp8_gemm(const DevLinear& W, const LinearArgs& a, cudaStream_t s) {
  if (!fp8_gemm_eligible(W, a)) return false;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  DSV4_CU(cudaStreamIsCapturing(s, &cap));
  if (cap != cudaStreamCaptureStatusNone) return false;  // staging buffers may grow (cudaMalloc): eager only
  LtContext& c = context();
  const int64_t N = W.out, K = W.in;
  const int n = a.n, m_pad = (a.n + 3) / 4 * 4;
  uint8_t* q = grow(c.q, c.q_bytes, static_cast<size_t>(m_pad) * K);
  float* sc = grow(c.sc, c.sc_bytes, static_cast<size_t>(K / 128) * m_pad * 4);
  const int64_t warps = (K / 128) * m_pad;
  qa8_to_e4m3_kernel<<<static_cast<unsigned>((warps + 7) / 8), 256, 0, s>>>(a.x, a.ldx, n, K, m_pad, q, sc);
  DSV4_CU(cudaGetLastError());
  float* d = m_pad == n ? a.y : grow(c.d, c.d_bytes, static_cast<size_t>(m_pad) * N * 4);

  // TN: A = weights [N][K] row-major = column-major K x N, transposed; B = activations column-major K x m_pad;
  // D = column-major N x m_pad = row-major [m_pad][N].
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  DSV4_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  DSV4_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DSV4_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtMatmulMatrixScale_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                    mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  DSV4_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)));
  DSV4_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)));
  const void* pa = W.scale;
  const void* pb = sc;
  DSV4_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof(pa)));
  DSV4_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof(pb)));
  DSV4_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, static_cast<uint64_t>(K), static_cast<uint64_t>(N), K));
  DSV4_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, static_cast<uint64_t>(K), static_cast<uint64_t>(m_pad), K));
  DSV4_LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, static_cast<uint64_t>(N), static_cast<uint64_t>(m_pad), N));

  const uint32_t align_a = alignment(W.w), align_d = alignment(d);
  const auto key = std::make_tuple(N, K, m_pad, align_a, align_d);
  auto it = c.algos.find(key);
  if (it == c.algos.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    DSV4_LT(cublasLtMatmulPreferenceCreate(&pref));
    DSV4_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c.workspace_bytes,
                                                 sizeof(c.workspace_bytes)));
    const uint32_t align_b = 256;  // q comes straight from cudaMalloc
    DSV4_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    DSV4_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    DSV4_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    DSV4_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t h{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c.handle, op, la, lb, ld, ld, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
      cublasLtMatmulDescDestroy(op);
      fail("cuBLASLt has no block-scaled FP8 algorithm for ", N, "x", K, " with ", m_pad, " tokens (status ",
           static_cast<int>(st), ")");
    }
    it = c.algos.emplace(key, h.algo).first;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(c.handle, op, &alpha, W.w, la, q, lb, &beta, d, ld, d, ld, &it->second,
                                           c.workspace, c.workspace_bytes, s);
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt matmul failed (status ", static_cast<int>(st), ") for ", N, "x", K);
  if (d != a.y)
    DSV4_CU(cudaMemcpyAsync(a.y, d, static_cast<size_t>(n) * N * 4, cudaMemcpyDeviceToDevice, s));
  if (a.round_bf16) round_bf16(a.y, static_cast<int64_t>(n) * N, s);
  return true;
}

}  // namespace dsv4::cuda
