// Prefill linears on the tensor cores: cuBLASLt BF16 GEMMs with fp32 accumulation and output, exact to the CPU
// reference's fp32 result (up to summation order).
//
// Why not the checkpoint's FP8 directly: cuBLASLt's block-scaled FP8 GEMM (GPU_KERNELS.md §4) was measured on the
// H200 at 9.2e-4 relative error against the exact product for every shape (the FP8 tensor cores' short internal
// accumulator; the error does not depend on K), far above fp32 summation noise; on the tiny official-numerics models
// it moved logits by up to 0.15 relative (the GEMV path: 0.02) and broke decode-vs-prefill agreement. BF16 operands
// split into exact terms (bf16_split.cuh) keep the official numerics the CPU defines, at BF16 tensor-core speed:
// QA8 activations and FP8 (power-of-two scales) or MXFP4 weights are one term each, so most prefill GEMMs cost one
// BF16 GEMM; fp32 operands take three terms.
//
// The decode GEMV streams each weight once per 4 tokens, so a 2048-token chunk read every dense matrix 512 times;
// here each weight is dequantized once per chunk (into a BF16 staging buffer) and read once by the GEMM.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "backend/cuda/ops.h"
#include "core/error.h"

namespace dsv4::cuda {

namespace {

#define DSV4_LT(call)                                                                                         \
  do {                                                                                                        \
    const cublasStatus_t st_ = (call);                                                                        \
    if (st_ != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error ", static_cast<int>(st_), " in ", #call);          \
  } while (0)

constexpr int64_t kMaxStagedWeights = int64_t(64) << 20;  // BF16 elements of W' per pass (128 MB)

// Per (device, stream): the cuBLASLt handle, a workspace, the BF16 staging buffers and the chosen algorithm per shape.
// Per stream, not per device: two backends on one GPU (each has its own stream) must not reuse each other's staging
// buffers while the other's GEMM may still read them.
struct LtContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(32) << 20;
  void* xb = nullptr;
  size_t xb_bytes = 0;
  void* wb = nullptr;
  size_t wb_bytes = 0;
  // rows, K', n, ldy, align, tuned (DSV4_GEMM_TUNE: the fastest of the heuristic's candidates, timed once), batch
  // geometry (count, x's row stride; 1 / 0 unbatched)
  std::map<std::tuple<int64_t, int64_t, int, int64_t, uint32_t, bool, int, int64_t>, cublasLtMatmulAlgo_t> algos;
};

LtContext& context(cudaStream_t s) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, LtContext> ctx;
  int dev = 0;
  DSV4_CU(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  LtContext& c = ctx[{dev, s}];
  if (!c.handle) {
    DSV4_LT(cublasLtCreate(&c.handle));
    DSV4_CU(cudaMalloc(&c.workspace, c.workspace_bytes));
  }
  return c;
}

// The pointer's alignment (a power of two, at most 256): the heuristic must only offer algorithms that can use it.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

void* grow(void*& p, size_t& have, size_t bytes) {
  if (have < bytes) {
    if (p) DSV4_CU(cudaFree(p));  // synchronises the device: the previous GEMM is done with it
    p = nullptr;
    have = 0;  // an out-of-memory throw below must not leave a size without a buffer
    DSV4_CU(cudaMalloc(&p, bytes));
    have = bytes;
  }
  return p;
}

// A process-wide switch, -1 until first use, then read from the environment: default on, off where NAME is "0"; or
// default off, on where NAME is "1".
bool env_switch(std::atomic<int>& flag, const char* name, bool default_on) {
  int v = flag.load();
  if (v < 0) {
    const char* e = std::getenv(name);
    const std::string s = e ? e : "";
    v = default_on ? (s != "0") : (s == "1");
    flag.store(v);
  }
  return v == 1;
}
std::atomic<int> g_gemm_tune{-1};
bool gemm_tune_on() { return env_switch(g_gemm_tune, "DSV4_GEMM_TUNE", false); }
// Default since session 19 (DSV4_GEMM_BATCHED=0: off; see ops.h): a grouped linear (wo_a) whose operands need one BF16 term
// each runs as ONE strided-batched GEMM over its groups, x split once for all groups, instead of a split and a GEMM
// per group (8 per Flash layer).
std::atomic<int> g_gemm_batched{-1};
bool gemm_batched_on() { return env_switch(g_gemm_batched, "DSV4_GEMM_BATCHED", true); }
std::atomic<int> g_gemm_qa8{-1};
bool gemm_qa8_on() { return env_switch(g_gemm_qa8, "DSV4_GEMM_QA8", true); }
constexpr int kTuneCandidates = 8;

// D[t * ldd + r] = sum_k' X'[t][k'] W'[r][k'] for r < rows, t < n (column-major: D^T = W'^T-as-op(T) x X').
// A and B are always the 256-byte-aligned staging buffers, so only D's alignment enters the algorithm key.
// batch > 1 (grouped linears, gemm_batched_on): batch b takes W' + b rows kp, X' + b kx (X' rows at stride ldx) and
// writes D + b rows -- one strided-batched call for all groups.
void gemm_bf16(LtContext& c, int64_t rows, int64_t kp, int n, const void* w, const void* x, float* d, int64_t ldd,
               cudaStream_t s, int batch = 1, int64_t ldx = 0) {
  if (ldx == 0) ldx = kp;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  DSV4_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  DSV4_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DSV4_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  DSV4_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, static_cast<uint64_t>(kp), static_cast<uint64_t>(rows), kp));
  DSV4_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, static_cast<uint64_t>(kp), static_cast<uint64_t>(n), ldx));
  DSV4_LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, static_cast<uint64_t>(rows), static_cast<uint64_t>(n), ldd));
  if (batch > 1) {
    const int32_t count = batch;
    const int64_t sa = rows * kp, sb = kp, sd = rows;
    for (cublasLtMatrixLayout_t l : {la, lb, ld})
      DSV4_LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    DSV4_LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof(sa)));
    DSV4_LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof(sb)));
    DSV4_LT(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sd, sizeof(sd)));
  }
  const uint32_t align_d = alignment(d);
  const bool tune = gemm_tune_on();
  const auto key = std::make_tuple(rows, kp, n, ldd, align_d, tune, batch, ldx);
  auto it = c.algos.find(key);
  if (it == c.algos.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    DSV4_LT(cublasLtMatmulPreferenceCreate(&pref));
    DSV4_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c.workspace_bytes,
                                                 sizeof(c.workspace_bytes)));
    DSV4_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    DSV4_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t h[kTuneCandidates]{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(c.handle, op, la, lb, ld, ld, pref, tune ? kTuneCandidates : 1, h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
      cublasLtMatmulDescDestroy(op);
      fail("cuBLASLt has no BF16 algorithm for ", rows, "x", kp, " with ", n, " tokens (status ", static_cast<int>(st), ")");
    }
    // Tuning: each candidate once to warm up, then twice timed (the faster run counts); the heuristic's first choice
    // stays unless another is faster. Candidates that fail to run are skipped. The host waits here, once per shape
    // (prefill_gemm runs eagerly only). D is written by every candidate and then by the chosen one below.
    int best = 0;
    if (tune && found > 1) {
      cudaEvent_t e0, e1;
      DSV4_CU(cudaEventCreate(&e0));
      DSV4_CU(cudaEventCreate(&e1));
      const float one = 1.0f, zero = 0.0f;
      float best_ms = -1.0f;
      for (int i = 0; i < found; ++i) {
        float ms = -1.0f;
        for (int r = 0; r < 3; ++r) {
          DSV4_CU(cudaEventRecord(e0, s));
          const cublasStatus_t rs = cublasLtMatmul(c.handle, op, &one, w, la, x, lb, &zero, d, ld, d, ld, &h[i].algo,
                                                   c.workspace, c.workspace_bytes, s);
          DSV4_CU(cudaEventRecord(e1, s));
          DSV4_CU(cudaEventSynchronize(e1));
          if (rs != CUBLAS_STATUS_SUCCESS) {
            ms = -1.0f;
            break;
          }
          float t = 0.0f;
          DSV4_CU(cudaEventElapsedTime(&t, e0, e1));
          if (r > 0 && (ms < 0.0f || t < ms)) ms = t;
        }
        if (ms >= 0.0f && (best_ms < 0.0f || ms < best_ms)) best = i, best_ms = ms;
      }
      DSV4_CU(cudaEventDestroy(e0));
      DSV4_CU(cudaEventDestroy(e1));
    }
    it = c.algos.emplace(key, h[best].algo).first;
  }
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st =
      cublasLtMatmul(c.handle, op, &alpha, w, la, x, lb, &beta, d, ld, d, ld, &it->second, c.workspace, c.workspace_bytes, s);
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt matmul failed (status ", static_cast<int>(st), ") for ", rows, "x", kp);
}

std::atomic<int> g_prefill_gemm{-1};  // -1: not decided yet (read DSV4_PREFILL_GEMM on first use)

}  // namespace

void set_prefill_gemm(bool on) { g_prefill_gemm.store(on ? 1 : 0); }
void set_prefill_gemm_tune(bool on) { g_gemm_tune.store(on ? 1 : 0); }
bool prefill_gemm_tune() { return gemm_tune_on(); }
void set_prefill_gemm_qa8(bool on) { g_gemm_qa8.store(on ? 1 : 0); }
void set_prefill_gemm_batched(bool on) { g_gemm_batched.store(on ? 1 : 0); }
bool prefill_gemm_batched() { return gemm_batched_on(); }
bool prefill_gemm_qa8() { return gemm_qa8_on(); }

bool prefill_gemm_enabled() { return env_switch(g_prefill_gemm, "DSV4_PREFILL_GEMM", true); }

bool prefill_gemm_eligible(const DevLinear& W, const LinearArgs& a) {
  if (!prefill_gemm_enabled() || a.n < kGemmMinTokens || !dequant_bf16_ok(W) || a.ldy % 4 != 0) return false;
  // qa8_x: x is quantized while it is split (qa8_split_bf16): opt-in, ungrouped, aligned rows of whole float4s.
  if (a.qa8_x && !(gemm_qa8_on() && a.group_rows == 0 && W.in % 4 == 0 && a.ldx % 4 == 0 &&
                   (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0 && a.n <= 65535))
    return false;
  if (a.group_rows == 0) return a.ldy >= W.out;
  return W.out % a.group_rows == 0 && a.group_rows % 4 == 0 && a.ldy >= W.out;
}

bool prefill_gemm_runs(const DevLinear& W, const LinearArgs& a, cudaStream_t s) {
  if (!prefill_gemm_eligible(W, a)) return false;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  DSV4_CU(cudaStreamIsCapturing(s, &cap));
  return cap == cudaStreamCaptureStatusNone;  // staging buffers may grow (cudaMalloc): eager only
}

bool prefill_gemm(const DevLinear& W, const LinearArgs& a, cudaStream_t s) {
  if (!prefill_gemm_runs(W, a, s)) return false;
  LtContext& c = context(s);
  const int tw = bf16_terms(W.fmt), tx = a.x_bf16_exact || a.qa8_x ? 1 : 3;  // QA8 values are exact in BF16
  const int64_t K = W.in, kp = K * tw * tx;
  const int64_t gr = a.group_rows ? a.group_rows : W.out, groups = W.out / gr;
  const int64_t pass = std::min(gr, std::max<int64_t>(16, kMaxStagedWeights / kp / 16 * 16));
  // Batched groups: one term each, x's groups side by side in its rows (group_x_off == K), every group's weights in
  // one staging pass.
  if (groups > 1 && gemm_batched_on() && tw * tx == 1 && !a.qa8_x && a.group_x_off == K && a.ldx >= groups * K &&
      W.out * kp <= kMaxStagedWeights) {
    const int64_t kall = groups * K;
    void* xb = grow(c.xb, c.xb_bytes, static_cast<size_t>(a.n) * kall * 2);
    void* wb = grow(c.wb, c.wb_bytes, static_cast<size_t>(W.out) * kp * 2);
    split_bf16_terms(a.x, a.ldx, a.n, kall, 1, 1, xb, s);
    dequant_bf16_terms(W, 0, W.out, 1, 1, wb, s);
    gemm_bf16(c, gr, kp, a.n, wb, xb, a.y, a.ldy, s, static_cast<int>(groups), kall);
    if (a.round_bf16) round_bf16_rows(a.y, a.n, W.out, a.ldy, s);
    return true;
  }
  void* xb = grow(c.xb, c.xb_bytes, static_cast<size_t>(a.n) * kp * 2);
  void* wb = grow(c.wb, c.wb_bytes, static_cast<size_t>(pass) * kp * 2);
  for (int64_t g = 0; g < groups; ++g) {
    if (a.qa8_x) qa8_split_bf16(a.x, a.ldx, a.n, K, tw, xb, s);  // (ungrouped: g == 0 only)
    else if (g == 0 || a.group_x_off != 0) split_bf16_terms(a.x + g * a.group_x_off, a.ldx, a.n, K, tw, tx, xb, s);
    for (int64_t r = 0; r < gr; r += pass) {
      const int64_t rows = std::min(pass, gr - r);
      dequant_bf16_terms(W, g * gr + r, rows, tw, tx, wb, s);
      gemm_bf16(c, rows, kp, a.n, wb, xb, a.y + g * gr + r, a.ldy, s);
    }
  }
  if (a.round_bf16) round_bf16_rows(a.y, a.n, W.out, a.ldy, s);
  return true;
}

}  // namespace dsv4::cuda
