#pragma once
// The CUDA kernels of the DeepSeek-V4 backend, as host-callable launchers on device pointers. The Backend
// (cuda_backend.cu) composes them; tests/cuda compares each one with the CPU reference math at real V4-Flash shapes,
// and `dsv4 bench-ops` times them. Every launcher is asynchronous on `s` and checks the launch (dsv4::Error on
// failure). Semantics follow backend/cpu/cpu_backend.cpp op by op; "official" flags switch on the quantization
// simulation points of MODEL.md §4 exactly where the CPU reference applies them.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/linear.h"

namespace dsv4::cuda {

// Throws dsv4::Error("CUDA error ... (what)") when e != cudaSuccess.
void check(cudaError_t e, const char* what, const char* file, int line);
#define DSV4_CU(call) ::dsv4::cuda::check((call), #call, __FILE__, __LINE__)

// A linear weight on the device in its STORED format. FP8 block scales (one per 128x128 tile, a negligible share of
// the bytes) are widened to fp32 once at upload (cuBLASLt needs fp32 scales too). FP4 block scales stay one byte each
// as stored (E8M0 for MXFP4, E4M3 for NVFP4: widening them would add 25% to the bytes every expert GEMV streams);
// the kernels decode them, and decode(w) * (scale * scale2) is the same fp32 arithmetic as the CPU dequantizer.
struct DevLinear {
  WeightFormat fmt = WeightFormat::F32;
  int64_t out = 0, in = 0;
  const void* w = nullptr;          // E4M3 bytes [out, in] | packed E2M1 [out, in/2] | BF16/F16/F32 [out, in]
  const float* scale = nullptr;     // FP8: [ceil(out/128), sb_cols] fp32
  const uint8_t* scale8 = nullptr;  // MXFP4: E8M0 [out, in/32]; NVFP4: E4M3 [out, in/16]
  float scale2 = 1.0f;              // NVFP4: weight_scale_2 (the per-tensor global); 1 otherwise
  int64_t sb_cols = 0;              // FP8: scale columns (ceil(in/128)); FP4: blocks per row
  bool low_precision() const {
    return fmt == WeightFormat::FP8_E8M0 || fmt == WeightFormat::FP8_F32 || fmt == WeightFormat::MXFP4 ||
           fmt == WeightFormat::NVFP4;
  }
  bool fp4() const { return fmt == WeightFormat::MXFP4 || fmt == WeightFormat::NVFP4; }
  const void* scales() const { return fp4() ? static_cast<const void*>(scale8) : static_cast<const void*>(scale); }
  uint64_t weight_bytes() const;  // stored weight + scales as held on the device
};

// Uploads a checkpoint linear (weight bytes as stored; scales validated: NaN/inf scale -> Error; FP8 scales widened).
// The returned pointers are owned by the caller (free with free_linear).
DevLinear upload_linear(const LinearRef& r);
void free_linear(DevLinear& l);

// y[t, r] (+ row stride ldy) = x[t, :] . W[r, :] for t < n.
// Grouped mode (group_rows > 0): row r reads x + (r / group_rows) * group_x_off (the grouped wo_a).
// round_bf16: BF16 RNE of every output (official numerics' linear outputs).
struct LinearArgs {
  const float* x = nullptr;
  int64_t ldx = 0;
  int n = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t group_rows = 0;
  int64_t group_x_off = 0;
  bool round_bf16 = false;
  // x's values are exact in BF16 (QA8 values, or activations official numerics rounded to BF16): one term, not three,
  // in the prefill GEMM. A promise the caller keeps: the GEMM then drops x's bits below BF16.
  bool x_bf16_exact = false;
  // x is raw and the kernel applies QA8 while staging it (official numerics' FP8/FP4 linears): only where
  // gemv_stages_x() holds (single-token GEMVs, and the tensor-core GEMV of up to 15 tokens), the same QA8 values as
  // qa8_rows + GEMV.
  bool qa8_x = false;
  // A side branch's single-token GEMV that must share the SMs (decode: the main compressor's projections, forked
  // beside wq_b): never the ring kernel, whose one 512-thread block per SM keeps every other kernel of the branches
  // off an SM until it leaves (on a CSA layer the indexer's scores waited ~6.5 us behind that GEMV: phase stamps,
  // session 32); where the ring would have run, the 256-thread kernel without a K split instead (the ring's bits).
  bool beside = false;
};
// Prefill-sized linears (n >= kGemmMinTokens, eager) run as one cuBLASLt BF16 tensor-core GEMM whose operands are
// exact sums of BF16 terms (prefill_gemm.cu, bf16_split.cuh): the result is the GEMV's up to fp32 summation order.
// Everything else runs as the GEMV below.
void linear(const DevLinear& W, const LinearArgs& a, cudaStream_t s);
void gemv(const DevLinear& W, const LinearArgs& a, cudaStream_t s);  // the GEMV path for any n (tests compare)
bool gemv_stages_x(const DevLinear& W, const LinearArgs& a);         // linear() runs a kernel that stages x (qa8_x ok)
// Single-token GEMVs and decode experts stream their weights through a per-warp shared-memory ring filled by
// cp.async (gemv_ring.cuh), bit-identical to the v3 kernels without K split; DSV4_GEMV_RING=0 or set_gemv_ring(false)
// keeps the v3 kernels (A/B, tests). *_ring_eligible: the call would take the ring kernel.
void set_gemv_ring(bool on);
bool gemv_ring_eligible(const DevLinear& W, const LinearArgs& a);
// FP8 GEMVs of 1 .. kGemmMinTokens - 1 tokens with qa8_x (official numerics) run on the tensor cores (gemv_tc.cuh): the
// same function up to fp32 summation order. DSV4_GEMV_TC=0 or set_gemv_tc(false) keeps the ring / v3 kernels. Up to 8
// tokens (batched decode; 7 at K = 8192, more in several launches) share one walk over the weights, token j in MMA
// column j, each token's outputs the single-token kernel's bits; DSV4_GEMV_TC_N=0 / set_gemv_tc_n(false): single
// tokens only.
void set_gemv_tc(bool on);
void set_gemv_tc_n(bool on);
bool gemv_tc_eligible(const DevLinear& W, const LinearArgs& a);
// Batched decode's grouped wo_a (2-15 tokens, x_bf16_exact, no qa8_x, FP8 groups of whole 256 rows) on the same
// multi-token tensor-core kernel with x staged exactly (a power-of-two scale per 128-block into f16; see
// gemv_tc.cuh): the FMA kernels' function up to fp32 summation order. DSV4_GEMV_TC_GROUPED=0 / false: FMA kernels.
bool gemv_tc_grouped_eligible(const DevLinear& W, const LinearArgs& a);
void set_gemv_tc_grouped(bool on);
constexpr int kGemmMinTokens = 16;
// The prefill GEMM paths (this dense GEMM, the grouped expert kernels, the tensor-core prefill attention) on or
// off, process-wide; default on,
// DSV4_PREFILL_GEMM=0 in the environment turns them off. Off, prefill runs the decode kernels (GEMV, per-slot experts),
// whose per-row summation order equals decode's: for A/B timing and for tests that need decode and prefill to agree
// bit for bit where official numerics amplify last-bit differences.
void set_prefill_gemm(bool on);
bool prefill_gemm_enabled();
bool prefill_gemm_eligible(const DevLinear& W, const LinearArgs& a);
bool prefill_gemm(const DevLinear& W, const LinearArgs& a, cudaStream_t s);  // false: not eligible, nothing launched
bool prefill_gemm_runs(const DevLinear& W, const LinearArgs& a, cudaStream_t s);  // eligible and s is not capturing
// The prefill GEMM's cuBLASLt algorithm per shape: the heuristic's first choice (default), or with DSV4_GEMM_TUNE=1 /
// set_prefill_gemm_tune(true) the fastest of its first 8 candidates, timed once per shape on first use (the host
// waits then; the same GEMM up to fp32 summation order).
void set_prefill_gemm_tune(bool on);
bool prefill_gemm_tune();
// LinearArgs::qa8_x in the prefill GEMM (default; DSV4_GEMM_QA8=0 / set_prefill_gemm_qa8(false): off): the QA8 of x
// and its BF16 copy for the GEMM in one pass (qa8_split_bf16) instead of qa8_rows into an fp32 scratch and
// split_bf16_terms from it. Bit-identical to the two passes. Session 18 (one H200, 20 Flash layers, 8K prompt, one run
// each): prefill 16,519 -> 16,607 tok/s.
void set_prefill_gemm_qa8(bool on);
bool prefill_gemm_qa8();
// Grouped linears (wo_a) with one BF16 term per operand as one strided-batched GEMM over the groups
// (default; DSV4_GEMM_BATCHED=0 / set_prefill_gemm_batched(false): a split and a GEMM per group). The same GEMM per
// group up to cuBLASLt's algorithm choice (fp32 summation order). Session 19 (one H200, 20 Flash layers, 8K prompt,
// one run each): wo_a 26.1 -> 24.3 ms (prefill total 16,684 -> 16,695 tok/s, within run-to-run noise).
void set_prefill_gemm_batched(bool on);
bool prefill_gemm_batched();
// BF16 terms needed to hold a dequantized weight of this format exactly (1: already BF16 values, up to 3: fp32).
int bf16_terms(WeightFormat f);
bool dequant_bf16_ok(const DevLinear& W);
// out [rows][tw * tx * K] BF16: term i of W[r0 + r][k] at column (i * tx + j) * K + k for every j < tx.
void dequant_bf16_terms(const DevLinear& W, int64_t r0, int64_t rows, int tw, int tx, void* out, cudaStream_t s);
// out [n][tw * tx * K] BF16: term j of x[t * ldx + k] at column (i * tx + j) * K + k for every i < tw.
void split_bf16_terms(const float* x, int64_t ldx, int n, int64_t K, int tw, int tx, void* out, cudaStream_t s);
// split_bf16_terms(qa8_rows(x), ..., tx = 1) in one pass (x rows of K at stride ldx; K % 4 == 0, ldx % 4 == 0, x
// 16-byte aligned, out 8-byte aligned).
void qa8_split_bf16(const float* x, int64_t ldx, int n, int64_t K, int tw, void* out, cudaStream_t s);
// BF16 RNE of y[t * ldy + c] for t < n, c < cols.
void round_bf16_rows(float* y, int n, int64_t cols, int64_t ldy, cudaStream_t s);

// QA8 (official): out[t, :] = fp8_sim(x[t, :]) with 1x128 UE8M0 blocks (a shorter last block follows the same rule).
void qa8_rows(const float* x, int n, int64_t len, float* out, cudaStream_t s);
// BF16 RNE in place.
void round_bf16(float* x, int64_t n, cudaStream_t s);
void fill_f32(float* x, int64_t n, float v, cudaStream_t s);

// Per-row post-processing of projections (q_norm, q heads, kv): rows of `len` at stride ld (in place or out):
//   y = rms(x) * w (w may be null); [official] bf16; rope(last R dims, position pos0 + row / rows_per_token,
//   inverse if requested); [official] bf16 of the rope dims; [official && sim8_block] SIM8 of the nope dims.
struct NormRopeArgs {
  const float* x = nullptr;
  float* y = nullptr;
  int rows = 0;
  int rows_per_token = 1;
  int64_t len = 0;
  const float* w = nullptr;  // norm weight, or null: no norm at all when do_norm is false
  bool do_norm = true;
  double eps = 1e-6;
  int64_t rope_dim = 0;      // 0 = no rope
  const float* inv_freq = nullptr;
  int64_t pos0 = 0;
  bool inverse = false;
  bool official = false;
  int sim8_block = 0;        // 64 for the window KV in official numerics
  const int64_t* dpos = nullptr;  // graph mode: pos0 is read from this device scalar instead (see DecodeGraph)
  // x is a linear's output whose official BF16 rounding was left to this op: each element is rounded as it is read
  // (the same values as a rounding pass before; the prefill query saves a 1 GB read-and-write per 8K-token layer).
  bool round_x = false;
};
void norm_rope(const NormRopeArgs& a, cudaStream_t s);
// A one-token pre's deferred comb (HcPreArgs::comb_logits: comb [4][4] holds logits): a kernel given one runs their
// Sinkhorn in place in an extra block that releases its dependents at once and never waits -- the logits come from
// a kernel at least two back -- so that the post consuming comb reads it final (HcCombIn{}) instead of running the
// Sinkhorn in its own prologue, which cannot overlap a predecessor that fills every SM. hc 4.
struct DeferredComb {
  float* comb = nullptr;
  float eps = 0.0f;
  int iters = 0;
};
// Many rows of <= 512 through a warp loop that prefetches each warp's next row (default; DSV4_NORM_ROPE_PF=0 /
// set_norm_rope_pf(false): one row per warp). The same bits. Session 19 (one H200, 20 Flash layers, 8K prompt, one run
// each): q_rope 25.8 -> 15.6 ms, prefill 16,684 -> 16,955 tok/s.
void set_norm_rope_pf(bool on);
bool norm_rope_pf();
// Two independent row sets (a's rows, then b's) in one launch; each row exactly as norm_rope computes it.
void norm_rope2(const NormRopeArgs& a, const NormRopeArgs& b, cudaStream_t s, DeferredComb comb = {});

// X[t, s, :] = embed[ids[t], :] for every stream s. dtype: 0 f32, 1 bf16, 2 f16.
void embed(const void* table, int dtype, int64_t d, const int32_t* ids, int n, int hc, float* X, cudaStream_t s);

// mHC pre (collapse + RMSNorm) for n tokens. fn [mix, hc*d], base [mix], scale [3].
struct HcPreArgs {
  const float* X = nullptr;
  int n = 0;
  int hc = 4;
  int64_t d = 0;
  const float* fn = nullptr;
  const float* base = nullptr;
  const float* scale = nullptr;
  const float* norm_w = nullptr;
  float hc_eps = 1e-6f;
  double rms_eps = 1e-6;
  int sinkhorn_iters = 20;
  bool official = false;
  float* x = nullptr;     // [n, d]
  float* post = nullptr;  // [n, hc]
  float* comb = nullptr;  // [n, hc, hc]
  bool head = false;      // hc_head mode: fn [hc, hc*d], pre only, rms with norm_w (no post/comb)
  // Deferred Sinkhorn (one token, hc 4): comb is left holding its logits (mix * scale + base) and the post that
  // consumes it (HcCombIn) runs the Sinkhorn, before its griddepcontrol.wait -- off the critical path of this pre,
  // whose last kernel otherwise ends with the ~3 us serial Sinkhorn of one warp.
  bool comb_logits = false;
  float* partial = nullptr;  // scratch of hc_pre_scratch_floats(n, hc, d) floats (split-K partial sums)
};
// Two launches: split-K mix GEMV over many blocks, then one block per token (Sinkhorn in one warp, collapse, RMSNorm).
int64_t hc_pre_scratch_floats(int n, int hc, int64_t d);
// The mix kernel with several tokens per block barrier (default; DSV4_HC_MIX_T=0 / set_hc_mix_t(false): one token per
// barrier step). The same bits either way.
void set_hc_mix_t(bool on);
bool hc_mix_t();
// The mix kernel with a thread per (token, 8 mix rows) from 32 tokens at hc 4 (default; DSV4_HC_MIX_TOK=0 /
// set_hc_mix_tok(false): the block-per-slice kernels above). The same bits.
void set_hc_mix_tok(bool on);
bool hc_mix_tok();
// The pre's finish kernel with the token's streams staged in shared memory for prefill-sized calls (default;
// DSV4_HC_FINISH_SX=0 / set_hc_finish_sx(false): in registers, one block per SM). The same bits.
void set_hc_finish_sx(bool on);
bool hc_finish_sx();
void hc_pre(const HcPreArgs& a, cudaStream_t s);
// A post's comb input: the final matrix (sinkhorn_iters < 0, the default) or the logits a one-token pre left with
// HcPreArgs::comb_logits, from which the post forms comb itself (Sinkhorn with these iterations and eps: the pre's).
struct HcCombIn {
  int sinkhorn_iters = -1;
  float eps = 0.0f;
};
// X[t, k, :] = post[t, k] * y[t, :] + sum_i comb[t, i, k] * X[t, i, :]  ([official] bf16).
void hc_post(const float* y, const float* post, const float* comb, int n, int hc, int64_t d, bool official, float* X,
             cudaStream_t s, HcCombIn ci = {});
// hc_post(y, post, comb, a.n, a.hc, a.d, a.official, X) then hc_pre(a) on the new streams (a.X == X), bit-identical,
// in two launches instead of three: the post runs inside the mix kernel. post/comb may be a.post/a.comb (the pre's
// outputs are written by its last launch, after every read of the post's inputs).
// slots (decode): y is not read; the post sums the MoE's expert rows itself, exactly as moe_reduce(slots.y, slots.ys,
// a.n, slots.k, a.d, a.official) would have into y (one launch fewer per layer). Only where hc_post_pre_sums_slots.
struct MoeSlots {
  const float* y = nullptr;   // [n, k, d] the routed experts' rows
  const float* ys = nullptr;  // [n, d] the shared expert's row, or null
  int k = 0;
};
void hc_post_pre(const float* y, const float* post, const float* comb, float* X, const HcPreArgs& a, cudaStream_t s,
                 HcCombIn ci = {}, MoeSlots slots = {});
bool hc_post_pre_sums_slots(const HcPreArgs& a, HcCombIn ci);
void set_hc_moe_sum(bool on);
// Decode (one token, hc 4): CudaBackend's pres leave comb logits and its posts run the Sinkhorn (default on;
// DSV4_HC_DEFER_SINKHORN=0 / false: the pre's last kernel runs it). Bit-identical either way.
void set_hc_defer_sinkhorn(bool on);
bool hc_defer_sinkhorn_enabled();

// Compressor step over a chunk whose projections K, Z [n, coff*c] are precomputed. State sK/sZ [coff*m, coff*c],
// cache rows appended from index `count0`. Emits the entries of windows completed in [pos0, pos0 + n).
struct CompressorArgs {
  const float* K = nullptr;
  const float* Z = nullptr;
  int n = 0;
  int64_t pos0 = 0;
  int ratio = 0;
  int64_t width = 0;
  bool overlap = false;
  const float* ape = nullptr;
  const float* norm_w = nullptr;
  double eps = 1e-6;
  int64_t rope_dim = 0;
  const float* inv_freq = nullptr;
  bool official = false;
  bool main = true;  // main: SIM8 of the nope dims; indexer: Hadamard + SIM4
  float* sK = nullptr;
  float* sZ = nullptr;
  float* cache = nullptr;
  int64_t count0 = 0;
  // Graph mode: pos0 is read from this device scalar and count0 = pos0 / ratio (the entry count is a function of
  // the position: a sequence of p tokens has emitted p / ratio entries).
  const int64_t* dpos = nullptr;
};
void compressor(const CompressorArgs& a, cudaStream_t s);

// Indexer queries in place: q [n, Hi, Di]: rope (last R dims, position pos0 + t); [official] bf16, Hadamard, bf16, SIM4.
// Graph mode (all position-dependent launchers below): dpos != null replaces pos0 by the device scalar *dpos, and
// every count derived from it (visible / existing entries) is recomputed in the kernel.
void indexer_q_prep(float* q, int n, int heads, int64_t Di, int64_t R, const float* inv_freq, int64_t pos0,
                    bool official, cudaStream_t s, const int64_t* dpos = nullptr);
// Prefill rows of 128 (>= 256 rows) by a warp per row held in registers (default; DSV4_INDEXER_Q_REG=0 /
// set_indexer_q_reg(false): the shared-memory warp kernel). The same bits.
void set_indexer_q_reg(bool on);
bool indexer_q_reg();
// scores[t, w] = sum_h relu(q_th . k_w) * qscale * (wts[t, h] * wscale) ([official] bf16) for w < (pos0+t+1)/ratio,
// -inf beyond; row stride ld_scores. Then topk[t, :] = the indices of the k largest (ties: the lower indices), in
// ascending index order, -1 padding; exact radix select, k <= 2048. DSV4_TOPK_RANKED=1 / set_topk_ranked(true): in
// the CPU's order instead (score descending, ties: lower index first; A/B -- the consumers take the set in any order).
void indexer_scores(const float* q, const float* wts, const float* keys, int n, int heads, int64_t Di, int64_t pos0,
                    int ratio, int64_t n_keys, bool official, float* scores, int64_t ld_scores, cudaStream_t s,
                    const int64_t* dpos = nullptr);
// Official prefill chunks with 64 heads of 128 dims take the wgmma kernel (indexer_wg.cuh: the same bits as the FMA
// kernel, which decode keeps) unless DSV4_INDEXER_WG=0 / set_indexer_wg(false).
void set_indexer_wg(bool on);
bool indexer_uses_wg(int n, int heads, int64_t Di, bool official, const int64_t* dpos);
void topk_rows(const float* scores, int n, int64_t ld_scores, int64_t pos0, int ratio, int k, int32_t* topk,
               cudaStream_t s, const int64_t* dpos = nullptr);
void set_topk_ranked(bool on);
bool topk_ranked();
// One token's indexer_scores then topk_rows as ONE launch (decode; 64 heads): the same scores for the visible keys
// (entries past them are not written) and the same top-k, bit for bit. counters: 3 device ints, zero before the first
// launch (each launch leaves them zero); launches that share them must be ordered (one stream). DSV4_INDEXER_FUSED=0
// / set_indexer_fused(false): CudaBackend's decode steps launch the two kernels (A/B).
struct IndexerTopkArgs {
  const float *q = nullptr, *wts = nullptr, *keys = nullptr;
  int heads = 0;
  int64_t Di = 0, pos0 = 0;
  int ratio = 0;
  int64_t n_keys = 0;
  bool official = false;
  float* scores = nullptr;  // [ld] scratch
  int64_t ld = 0;
  int k = 0;
  int32_t* topk = nullptr;  // [k]
  const int64_t* dpos = nullptr;
  int* counters = nullptr;
};
bool indexer_topk_fused_ok(int heads, int64_t Di, int k);
void indexer_topk_fused(const IndexerTopkArgs& a, cudaStream_t s);
void set_indexer_fused(bool on);
bool indexer_fused_enabled();

// Sparse attention with sink. Rows per query t = pos0 + i: window positions max(0, t-W+1)..t (this chunk's kv for
// positions >= pos0, else ring[p % W]), then compressed rows: kind 1 (CSA) topk[i, :] (skipping -1), kind 2 (HCA)
// entries 0..(t+1)/ratio-1. Split-KV over chunks of rows (all heads of a block share each KV row load), exact
// global softmax with the sink added once. scratch: attend_scratch_floats(n, H, D, max_rows) floats (scores, per-chunk
// stats, partial outputs); q, kv, ring, comp, scratch and o 16-byte aligned, D % 4 == 0, D <= 512.
// err: device flag (bit 1 = invisible entry selected).
struct AttendArgs {
  const float* q = nullptr;
  const float* kv = nullptr;
  const float* ring = nullptr;
  const float* comp = nullptr;
  const int32_t* topk = nullptr;
  const float* sink = nullptr;
  int n = 0, H = 0, window = 0, topk_k = 0, ratio = 0, kind = 0;
  int64_t D = 0, pos0 = 0, n_comp = 0;
  bool official = false;
  float* scratch = nullptr;
  int64_t max_rows = 0;
  float* o = nullptr;
  int* err = nullptr;
  // Graph mode: pos0 from this device scalar, n_comp = (pos0 + n) / ratio, and the split-KV chunking recomputed in
  // the kernels from the actual row count (max_rows is then the capacity bound, launched chunks beyond the actual
  // ones stay empty), so a replayed step sums in exactly the order of an eager one.
  const int64_t* dpos = nullptr;
  // Single-token decode (n == 1): also store this token's kv row into the window ring, i.e. window_store fused into
  // the attention's last kernel (it runs after every kernel that reads the ring). The ring itself (a.ring), writable.
  float* store_ring = nullptr;
  // o leaves with the inverse RoPE of its last derope_dim dims per head already applied (at the query's position,
  // [official] BF16) -- attn_out's norm_rope fused into the single-token merge kernel or the wgmma prefill kernel's
  // epilogue, bit for bit (attend_derope_fusable says whether a's path can).
  const float* derope_inv_freq = nullptr;
  int derope_dim = 0;
  // Every KV row (window ring, this token's kv, compressed entries, top-k) was written before the kernel that precedes
  // the attention in its stream started (a sliding-window layer: the ring and attn_qkv's kv; NOT entries from a joined
  // side branch -- in a captured graph such rows read before the wait raced, as if the join were released when the
  // branch's last kernel starts: session 25): the single-token cluster kernel then requests its rows before
  // griddepcontrol.wait, only the query after it (DSV4_ATTEND_ROWS_EARLY=0: off). The caller's promise; the same values
  // either way.
  bool rows_before_wait = false;
  // The single-token kernels' window rows: kv holds the kv_back positions before pos0 too (kv points at the first of
  // them), so they are read there instead of from the ring -- a verify pair's later row reads the earlier row's kv,
  // which its ring slot does not hold yet (attend_batch runs both rows at once). 0: kv is this token's row only.
  int kv_back = 0;
};
void attend(const AttendArgs& a, cudaStream_t s);
// Batched decode: one token of each of up to kAttendMaxBatch sequences in ONE launch of the single-token cluster
// kernel (grid.z = rows). A row's own pointers and position (pos0 / n_comp / dpos as in AttendArgs; scratch of
// attend_scratch_floats(1, H, D, max_rows) floats, its own); the layer's fields (kind, H, D, window, ratio, topk_k,
// sink, official, derope, err) and n = 1 come from `a`. Each row gets exactly attend() of that token alone.
constexpr int kAttendMaxBatch = 8;
struct AttendRow {
  const float *q = nullptr, *kv = nullptr, *ring = nullptr, *comp = nullptr;
  const int32_t* topk = nullptr;
  float *o = nullptr, *store_ring = nullptr, *scratch = nullptr;
  int64_t pos0 = 0, n_comp = 0, max_rows = 0;
  const int64_t* dpos = nullptr;
  int kv_back = 0;  // AttendArgs::kv_back of this row
};
struct AttendBatch {
  int n = 0;
  AttendRow r[kAttendMaxBatch];
};
// Whether attend_batch takes `a` (one token on the cluster kernel); DSV4_ATTEND_BATCH=0: never (A/B).
bool attend_batch_ok(const AttendArgs& a);
void attend_batch(const AttendArgs& a, const AttendBatch& rows, cudaStream_t s);
bool attend_rows_early_enabled();
void set_attend_rows_early(bool on);
// Official prefill chunks (n >= kGemmMinTokens, eager, D 512, <= 64 heads, prefill GEMM paths on): the tensor-core
// kernels (attend_tc.cuh), whose exactness needs q and the KV rows to be BF16 values (official numerics makes them so).
bool attend_uses_tc(const AttendArgs& a);
int64_t attend_max_rows(int window, int kind, int topk_k, int64_t pos_end, int ratio);
int64_t attend_scratch_floats(int n, int H, int64_t D, int64_t max_rows);
// What attend(a) needs for a's path (every field but scratch and o set): the wgmma prefill kernel's BF16 row copy, or
// the split-KV / attend_tc scratch above.
int64_t attend_scratch_floats(const AttendArgs& a);
// Official prefill chunks on warpgroup MMAs (attend_wg.cuh: a query's whole attention per block, S kept on chip) --
// the default -- or on attend_tc.cuh's mma.sync kernels (DSV4_ATTEND_WG=0 / false).
void set_attend_wg(bool on);
bool attend_wg_enabled();
// Whether attend(a) can apply the inverse RoPE (AttendArgs::derope_inv_freq): one token, or the wgmma prefill kernel.
bool attend_derope_fusable(const AttendArgs& a);

// ring[(pos0 + i) % W] = kv[i] for the last min(n, W) rows.
void window_store(const float* kv, int n, int64_t pos0, int window, int64_t D, float* ring, cudaStream_t s,
                  const int64_t* dpos = nullptr);

// Router: logits [n, E] -> sel [n, k], wts [n, k]. func: 0 sqrtsoftplus, 1 sigmoid, 2 softmax. Hash layers
// (tid2eid != null) take sel from tid2eid[ids[t]]; otherwise top-k of score + bias (ties: lower index).
struct RouterArgs {
  const float* logits = nullptr;
  int n = 0, E = 0, k = 0, func = 0;
  const float* bias = nullptr;
  const int32_t* tid2eid = nullptr;
  const int32_t* ids = nullptr;
  bool norm_topk = true;
  float scaling = 1.0f;
  int32_t* sel = nullptr;
  float* wts = nullptr;
  // One token: the FFN pre's deferred comb, finished beside the routing (DeferredComb; the expert launches before its
  // post fill every SM).
  DeferredComb comb;
  // The router lets its successor launch at its start, before its own wait (griddepcontrol.launch_dependents first):
  // only where that successor reads nothing before ITS wait but constants and data written three or more kernels back
  // (the decode gate/up launch with ExpertArgs::x_early). Same results; the gate/up launch starts ~2 us earlier.
  bool trigger_early = false;
};
void router(const RouterArgs& a, cudaStream_t s);
// ExpertArgs::x_early / RouterArgs::trigger_early in decode steps (CudaBackend; DSV4_EXPERT_X_EARLY=0 / false: off).
void set_expert_x_early(bool on);
bool expert_x_early_enabled();
// The router's comb Sinkhorn in decode steps (CudaBackend; DSV4_ROUTER_SINKHORN=0 / false: the post runs it, A/B).
void set_router_sinkhorn(bool on);
bool router_sinkhorn_enabled();
// The attention pre's comb Sinkhorn in attn_qkv's norm_rope2 launch in decode steps (CudaBackend;
// DSV4_NORM_SINKHORN=0 / false: the post after wo_b runs it, A/B). -4.6 us per layer (session 28: 159.5 vs 164.1).
void set_norm_sinkhorn(bool on);
bool norm_sinkhorn_enabled();
// The decode fusions' switches (CudaBackend's choice per call; tests flip them at run time): the window store inside
// the attention's merge kernel (DSV4_ATTEND_FUSE_STORE=0 / false: window_store's own kernel) and the attention
// output's inverse RoPE inside the merge kernel (DSV4_ATTEND_FUSE_DEROPE=0 / false: attn_out's norm_rope launch).
// Single-token attention as one launch of thread-block clusters (attend_cluster.cuh) instead of three split-KV
// launches: size -1 automatic (the default, DSV4_ATTEND_CLUSTER unset or auto: 16-block clusters for >= 64 heads
// where the device co-schedules them, else the split kernels), 0 the split kernels, 8 or 16 forced.
// attend_cluster_size: the size attend() uses now for head dim D and H heads (0: the split kernels).
void set_attend_cluster(int size);
int attend_cluster_size(int64_t D, int H);
// Heads per block of the 16-block cluster kernel: 8 (default) or 16 (half the blocks, the same bits;
// DSV4_ATTEND_HEADS). attend_cluster16_max_active: how many 16-block clusters of it this GPU holds at once.
void set_attend_heads(int heads);
int attend_heads();
int attend_cluster16_max_active();
void set_attend_store_fuse(bool on);
bool attend_store_fuse_enabled();
void set_attend_derope_fuse(bool on);
bool attend_derope_fuse_enabled();
// Decode: the compressor / indexer ops on a side stream beside attn_qkv's wq_b and query RoPE, joined by attend
// (DSV4_ATTN_FORK=0 / false: one stream). The same kernels either way: bit-identical results.
void set_attn_fork(bool on);
bool attn_fork_enabled();
// With the fork on: each branch joins it at its first op and attend() joins only those (default), or every branch
// joins at the fork and is joined back (DSV4_ATTN_LAZY_FORK=0 / false). The same kernels: bit-identical results.
void set_attn_lazy_fork(bool on);
bool attn_lazy_fork_enabled();
// Decode: the main compressor's projection GEMV (single token) on the 256-thread kernel that shares SMs
// (LinearArgs::beside; default; DSV4_COMP_BESIDE=0 / false: the ring kernel). The ring's bits either way.
void set_comp_beside(bool on);
bool comp_beside_enabled();
// Decode, one token of one sequence on one GPU: the fused indexer scores + top-k on the main stream, its branch joined
// into it (default; DSV4_TOPK_MAIN=0 / false: on its side branch, joined by attend). The same kernels: bit-identical
// results.
void set_topk_main(bool on);
bool topk_main_enabled();
// A CSA layer's single-token step (one GPU, one sequence): wq_b and the indexer's wq_b (stored back to back) as one
// GEMV in attn_qkv, the indexer's queries taken from its output (default; DSV4_WQB_STACK=0 / set_wqb_stack(false): two
// GEMVs; the pair is stored only if it is on when the model loads). The same GEMV per row: bit-identical. Measured
// (docs/BENCHMARKS.md, session 29, one H200, 20 Flash layers): -1.4 us per layer over 5 alternating pairs.
void set_wqb_stack(bool on);
bool wqb_stack_enabled();
// The backend's per-step host transfers (token ids up, logits and the error flag down) through page-locked staging
// buffers, one host synchronisation per step (DSV4_PINNED_IO=1 / set_pinned_io(true); default off -- written in
// session 37, when no GPU could be started to test or time it: the tests toggle it, tools/gpu/probes/
// logits_download_probe.cu times the copies; off: the caller's pageable memory, a wait after the upload and a
// separate error-flag read). The same bytes either way.
void set_pinned_io(bool on);
bool pinned_io_enabled();
// The verify pair (CudaBackend::pair_rows) as a recorded two-row step in reference numerics too (official numerics
// always on one GPU): default on; DSV4_PAIR_ROWS_REFERENCE=0 / false: the two-token chunk in reference numerics.
void set_pair_rows_reference(bool on);
bool pair_rows_reference_enabled();

// Routed experts on the device: table[e] holds expert e's w1/w3/w2 (all in the same format).
struct DevExpert {
  const void* w1 = nullptr;
  const void* w3 = nullptr;
  const void* w2 = nullptr;
  const void* s1 = nullptr;  // scales as in DevLinear::scales() (fp32 for FP8, bytes for FP4)
  const void* s3 = nullptr;
  const void* s2 = nullptr;
  float g1 = 1.0f, g3 = 1.0f, g2 = 1.0f;  // DevLinear::scale2 of each
  // Tile-major copies for the decode MMA walk (expert_tiles.h; measurement mode DSV4_EXPERT_TILES=1), or null.
  const void* t13 = nullptr;  // gate/up: w1 and w3 rows interleaved 8 by 8, with their scales
  const void* t2 = nullptr;   // down
};
inline DevExpert make_dev_expert(const DevLinear& w1, const DevLinear& w3, const DevLinear& w2) {
  return DevExpert{w1.w, w3.w, w2.w, w1.scales(), w3.scales(), w2.scales(), w1.scale2, w3.scale2, w2.scale2};
}
struct ExpertArgs {
  const DevExpert* table = nullptr;  // device array [E]
  WeightFormat fmt = WeightFormat::MXFP4;
  int64_t d = 0, I = 0, sb1 = 0, sb2 = 0;  // sb: scale columns/blocks per row of w1|w3 and w2
  const float* x = nullptr;                // [n, d] (QA8-quantized by the caller in official numerics)
  int n = 0, k = 0;
  const int32_t* sel = nullptr;
  const float* wts = nullptr;              // null: weight 1 (the shared expert via gate_up_act)
  float limit = 0.0f;
  bool official = false;
  float* act = nullptr;                    // [n, k, I]
  const float* act_q = nullptr;            // [n, k, I] act after QA8 (official) or act itself
  float* y = nullptr;                      // [n, k, d]
  // Prefill (n >= kMoeGroupedMinTokens): the slots grouped by expert (moe_group); null: one block row per slot.
  const int32_t* perm = nullptr;     // [n * k] slot indices, expert by expert
  const int32_t* offsets = nullptr;  // [E + 1] where each expert's slots start in perm
  int E = 0;
  // x and act_q hold QA8 values (official numerics, FP8/FP4 experts): exact in BF16, so grouped prefill with
  // MXFP4 / FP8 (power-of-two scales) / BF16 experts runs on the tensor cores (expert_tc_grouped) with exact operands.
  bool x_bf16_exact = false;
  // x / act_q are raw and the single-slot kernels apply QA8 while staging them (where expert_*_stages_x() hold).
  bool qa8_x = false, qa8_act = false;
  // Prefill scratch for expert_tc2 (moe_tc2.cuh): [n * k, max(d, I)] BF16, the slots' rows in expert order. Null:
  // the v1 tensor-core kernels (expert_tc_grouped).
  uint16_t* xg = nullptr;
  size_t xg_bytes = 0;  // xg's size; 0: [n * k, max(d, I)] BF16 (moe_prefill_scratch_bytes() gives what all kernels fit in)
  // Decode (n == 1, ring kernels): the shared expert as slot k of the same launches -- act row k, y row k (act and y
  // then hold k + 1 rows). shared13: its w1|w3 pair (rows [0, I) w1, [I, 2I) w3), shared2: its w2; FP8.
  // expert_ring_shared_ok() says whether they can be fused; passing them where it does not hold throws.
  const DevLinear* shared13 = nullptr;
  const DevLinear* shared2 = nullptr;
  // Decode gate/up with the fused shared expert staging both inputs once (the default MMA launch): x was written
  // three or more kernels back in this stream -- the router and its gate GEMV, the two before, do not write it -- so
  // the shared walk stages x and walks before griddepcontrol.wait, which each warp then passes only before its routed
  // tiles (they need the router's selection and weights). The launcher ignores it on other launches. (CudaBackend
  // sets it with RouterArgs::trigger_early; DSV4_EXPERT_X_EARLY=0: off.)
  bool x_early = false;
  // Every expert of the table has its tile-major copies (DevExpert::t13 / t2): the decode MMA walk reads those
  // instead of the row-major rows (same bytes, same arithmetic: bit-identical results).
  bool tiles = false;
  // Internal to expert_rows_gate_up: the single-token launch over several tokens' slots, x holding x_rows rows.
  int x_rows = 1;
};
// Batched decode (2 .. kGemmMinTokens - 1 tokens, official MXFP4 experts staged with QA8, no fused shared expert):
// the routed experts on the single-token f16 MMA walk, several tokens' k slots per launch (up to 16 slots: two
// tokens of V4's 6), instead of the per-slot kernels. act / y as expert_gate_up / expert_down write them ([n, k, I],
// [n, k, d]); the same function up to summation order. DSV4_EXPERT_ROWS=0: the per-slot kernels (A/B).
bool expert_rows_ok(const ExpertArgs& a);
void expert_rows_gate_up(const ExpertArgs& a, cudaStream_t s);  // a.x raw, a.qa8_x
void expert_rows_down(const ExpertArgs& a, cudaStream_t s);     // a.act_q raw act, a.qa8_act
int expert_rows_per_launch(const ExpertArgs& a);                // tokens per launch
// Fills t13 (tile_bytes(true, d, I) bytes) and t2 (tile_bytes(false, d, I)) with expert e's tile-major copies
// (expert_tiles.h), asynchronously on s. MXFP4 only, d and I multiples of 128; anything else throws.
void build_expert_tiles(const DevExpert& e, WeightFormat fmt, int64_t d, int64_t I, int64_t sb1, int64_t sb2,
                        void* t13, void* t2, cudaStream_t s);
// Decode MXFP4 experts with the activation QA8-quantized while staging (official numerics): the routed weights on
// FP8 tensor-core MMAs (expert_mma.cuh) instead of the FMA ring walk (DSV4_EXPERT_MMA=0 / false). The same function
// up to summation order.
void set_expert_mma(bool on);
// The fused shared expert's FP8 walk on the MMAs too (default on); set_shared_expert_mma(false) / DSV4_SHARED_MMA=0:
// on the FMA ring walk (A/B switch).
void set_shared_expert_mma(bool on);
// The decode expert launches put the routed and the fused shared expert's walks on different warps where both fit
// (default on; DSV4_EXPERT_BALANCE=0 / false: both from warp 0 up). Bit-identical either way.
void set_expert_balance(bool on);
// The MXFP4 MMA launches (expert_mma_mode 2, or 1 without the fused shared expert) on a kernel variant without the FMA
// walks (smaller code, fewer registers; bit-identical). Default on; DSV4_EXPERT_MMA_ONLY=0 / false: off (A/B).
void set_expert_mma_only(bool on);
int64_t expert_mma_only_launches();  // launches that took that variant since the process started (tests)
// That variant's routed MXFP4 walk on f16 MMAs: E2M1 -> f16 by shifts and masks, the activation staged as f16, instead
// of the emulated E4M3 MMA (whose F2FP unpacks of both operands were ~40 % of the walk's instructions). Default on;
// DSV4_EXPERT_F16=0 / false: the E4M3 MMAs (A/B). The same function up to the order inside an MMA.
void set_expert_f16(bool on);
int64_t expert_f16_launches();  // launches that took it since the process started (tests)
// The ring kernel's mma argument for a (0: not the MMA walk, 1: the MMA walk, 2: and the shared expert on MMAs).
int expert_mma_mode_used(const ExpertArgs& a, bool gate_up);
// Ring launches that took the MMA walk since the process started (captured graph launches count once).
int64_t expert_mma_launches();
// The routed MMA walk's K split for a (1, 2 or 4 warps per 16-row tile: split while twice the tiles still fit the
// launch's warps, e.g. a TP2 rank's Flash gate/up; 1 where a is not the MMA walk). set_expert_ksplit(false) /
// DSV4_EXPERT_KSPLIT=0: always 1 (A/B). Another summation order of the same function (the op test bounds it).
int expert_mma_parts(const ExpertArgs& a, bool gate_up);
void set_expert_ksplit(bool on);
// The decode expert launches with the fused shared expert on the MMAs stage both walks' inputs once, in the first
// walk (default; bit-identical: the same staging, fewer block barriers: gate/up 1 instead of 3, down 2 instead of 3). set_expert_stage_once(false)
// / DSV4_EXPERT_STAGE_ONCE=0: each walk stages its own (A/B, and the op test's bit-identity check).
void set_expert_stage_once(bool on);
// ... and, on the f16 walk, as one pass in which each warp requests its 128-blocks together before quantizing them
// (default; DSV4_EXPERT_STAGE_BATCH=0 / set_expert_stage_batch(false): the per-row stagings, one L2 round trip per
// block). The same bits.
void set_expert_stage_batch(bool on);
// Grouped prefill through expert_tc2 (MXFP4, exact BF16 activations, xg set); DSV4_MOE_TC2=0 or set_moe_tc2(false):
// the v1 kernels.
bool expert_tc2_eligible(const ExpertArgs& a, bool gate_up);
void set_moe_tc2(bool on);
bool moe_tc2_enabled();
// Where expert_tc2 runs and K % 128 == 0: the W4A8 kernel on FP8 tensor-core MMAs (moe_f8.cuh) instead (default;
// DSV4_MOE_F8=0 / set_moe_f8(false): expert_tc2). The same function up to summation order.
void set_moe_f8(bool on);
int64_t moe_f8_launches();  // launches of it since the process started (tests)
// ... or the wgmma kernels where the scratch has room (ExpertArgs::xg_bytes): DSV4_MOE_WG / set_moe_wg: 0 never;
// 1 .. 4 the f16 kernel's variants (moe_wg.cuh); 5 .. 10 the BF16 kernel with the scales folded into its operands
// (moe_wb.cuh: 5 / 6 two warpgroups x 64 slots, 7 / 8 four warpgroups x 64 / 128 slots, 9 / 10 = 8 / 7 with the
// activations bulk-copied, 11 = 9 in block pairs multicasting each copy, 12 = 9 with per-warpgroup barriers instead
// of the block's, 13 = 9 with half-width wgmmas on tiles of <= 64 slots, 14 three warpgroups x 128 slots with two A
// register sets); kMoeWgAuto (the default)
// moe_wg_effective(). The same function up to summation order.
constexpr int kMoeWgAuto = -1;
void set_moe_wg(int mode);
int moe_wg_mode();
// The variant kMoeWgAuto takes for nk grouped slots over E experts: 13 (measured fastest at 2K and 8K prompts;
// docs/BENCHMARKS.md, sessions 17-18).
int moe_wg_effective(bool gate_up, int64_t nk, int E);
// Their cp.async pipeline: 4 stages (default) or 8 (DSV4_MOE_PREFILL_STAGES=8; measured no faster, session 15).
void set_moe_prefill_stages(int stages);
int moe_prefill_stages();
int64_t moe_wg_launches();
// Bytes of the grouped-prefill scratch (ExpertArgs::xg) that every prefill expert kernel fits in.
size_t moe_prefill_scratch_bytes(int n, int k, int64_t d, int64_t I, int E);
bool expert_ring_eligible(const ExpertArgs& a, bool gate_up);
bool expert_ring_shared_ok(const ExpertArgs& a);
bool expert_gate_up_stages_x(const ExpertArgs& a);
bool expert_down_stages_x(const ExpertArgs& a);
constexpr int kMoeGroupedMinTokens = 16;
// Counting sort of the n*k routed slots by expert on the device: offsets [E + 1], perm [n*k].
void moe_group(const int32_t* sel, int nk, int E, int32_t* offsets, int32_t* perm, cudaStream_t s);
// act[t, j, :] = silu(min(w1 x, lim)) * clamp(w3 x, ±lim) * wgt ([official] bf16 on w1x, w3x and act). Fused SwiGLU.
void expert_gate_up(const ExpertArgs& a, cudaStream_t s);
// y[t, j, :] = w2 act_q[t, j, :] ([official] bf16).
void expert_down(const ExpertArgs& a, cudaStream_t s);
// SwiGLU for the shared expert computed by two plain linears: act = silu(min(g, lim)) * clamp(u, ±lim) [bf16].
void swiglu(const float* g, const float* u, int64_t count, float limit, bool official, float* act, cudaStream_t s);
// out[t, :] = sum_j y[t, j, :] (+ ys[t, :]) in double, [official] bf16.
void moe_reduce(const float* y, const float* ys, int n, int k, int64_t d, bool official, float* out, cudaStream_t s);

// MTP input fusion: Y[t, s, :] = hp[t, s, :] + ep[t, :] for every stream s ([official] bf16).
void add_streams(const float* hp, const float* ep, int n, int hc, int64_t d, bool official, float* Y, cudaStream_t s);

// Programmatic dependent launch for every kernel of the process (default on; env DSV4_PDL=0 turns it off). The
// tensor-parallel backend turns it off: with NCCL collectives between the kernels, the 43-layer TP2 benchmark stopped
// making progress in prefill on the H200 pair (4 layers ran fine, faster with PDL); under investigation. Since the
// peer all-reduce (peer_allreduce.h), TP turns it on inside decode steps only.
void set_pdl(bool allowed);
// Decode tracing (dsv4 bench --trace-steps): trace_record_launches(true) remembers every kernel launched through
// kernels.cu from then on, per device (e.g. while a decode graph is captured on every TP rank),
// trace_launch_names(device) returns that device's, demangled, in launch order, and clears them. trace_begin(capacity,
// devices): from then on one thread of block 0 of every such kernel on those devices stores %globaltimer (ns) when
// its dependency on the previous kernel is released (after griddepcontrol.wait); trace_end(device) returns that
// device's stamps in that order and stops its trace (throws if more than `capacity` were stamped). Each device has
// its own clock: compare durations across devices, not stamps.
void trace_record_launches(bool on);
std::vector<std::string> trace_launch_names(int device);
void trace_begin(int64_t capacity, const std::vector<int>& devices);
std::vector<uint64_t> trace_end(int device);

// Device-to-device bandwidth probe helper: a streaming read of `bytes` (returns nothing; time it).
void stream_read(const void* p, size_t bytes, float* sink, cudaStream_t s);
// One tiny kernel that waits `ns` nanoseconds on the device (bench-ops: a latency-bound stretch of known length).
void device_sleep(uint64_t ns, cudaStream_t s);

}  // namespace dsv4::cuda
