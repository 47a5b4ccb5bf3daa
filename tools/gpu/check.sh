#!/usr/bin/env bash
# ONE script for the GPU machine: builds dsv4 (Release, CUDA tests registered), runs every CTest test and the CUDA
# op/model tests, runs `dsv4 logits --backend cuda` on each golden fixture against its golden logits, runs
# compute-sanitizer on a small subset, and micro-benchmarks the kernels (`dsv4 bench-ops`). Logs and a summary go to
# $OUT (default build-gpu/out). Exit status: non-zero if any step failed. Budget: < 7 minutes on one H200.
# Knobs (environment): PREBUILT=DIR uses DIR/dsv4 and DIR/test_cuda built on the dev machine (carry them; saves the
# ~3 min CUDA compile of device time) instead of configuring and building; SKIP_CTEST=1 skips the full build + CTest
# (the CPU suites, which the dev machine runs anyway); SKIP_SANITIZER=1 skips compute-sanitizer (SANITIZER_FILTER: its
# gtest filter instead of the default subset); GTEST_FILTER selects
# test_cuda tests (default: all but the CPU-only NoiseFloor.*; the parameterized suites are named Formats/CudaTiny.*,
# Formats/TpTiny.*, Fixtures/CudaFixture.*: a pattern like 'CudaTiny*' does not match them); SKIP_GOLDEN=1 / SKIP_BENCH_OPS=1 skip those steps;
# BENCH_SYNTH="ARGS1;ARGS2" runs `dsv4 bench --synthetic ARGS` for each (default: Flash 20 layers at 8K on one GPU
# and, with 2+ GPUs, Flash 43 layers TP2; BENCH_SYNTH=none skips; SYNTH_TIMEOUT=S limits each, default 420);
# PROFILE_DECODE=1 adds tools/gpu/profile_decode.sh (per-kernel time of a decode step under ncu); TRACE=1 the in-graph
# per-kernel trace (dsv4 bench --trace-steps); AB="DSV4_X DSV4_Y=V" the 20-layer bench once per entry (a bare name: set to 0;
# AB_LAYERS=N other depths, AB_PROMPT="T1 T2 ..." prompt tokens, one A/B per size, AB_REPS=N repeats); AB_TP likewise with --tp 2 on two GPUs; AB_BIN=PATH [AB_BIN_ENV=...] alternates this binary with another one; PHASE_BIN=PATH runs a phase-stamp binary (tools/gpu/phase_build.sh); PROBE=tools/gpu/probes/X.cu builds and runs that probe;
# PACK=1 leaves only summary.md and one archive in $OUT. With 2+ GPUs the TP tests are required to run.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-$ROOT/build-gpu}
OUT=${OUT:-$BUILD/out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.md
: > "$SUMMARY"
status=0
note() { echo "$*" | tee -a "$SUMMARY"; }
step() {  # step NAME TIMEOUT_S CMD...: runs CMD with a timeout, log in $OUT/NAME.log, records pass/fail
  local name=$1 t=$2; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then note "- $name: OK ($((SECONDS - t0)) s)"; else note "- $name: FAILED rc=$rc ($((SECONDS - t0)) s), see $name.log"; tail -40 "$OUT/$name.log"; status=1; fi
  return $rc
}

# Build dependencies the GPU image may lack (PCRE2 dev files, GoogleTest, CLI11): a relocatable copy in .gpudeps/usr
# (ignored by git; made on the dev machine from its system packages and sent along with the run).
if [ -d "$ROOT/.gpudeps/usr" ]; then
  DEPS=$ROOT/.gpudeps/usr
  export CMAKE_PREFIX_PATH=$DEPS${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export PKG_CONFIG_PATH=$DEPS/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CPATH=$DEPS/include:$DEPS/include/x86_64-linux-gnu${CPATH:+:$CPATH}
  export LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
note "# dsv4 GPU check $(date -u +%Y-%m-%dT%H:%MZ), commit ${DSV4_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$SUMMARY"

export DSV4_GPU_TESTS=1
NGPU=$(nvidia-smi --list-gpus | wc -l)
[ "$NGPU" -ge 2 ] && export DSV4_REQUIRE_TP=1
# NCCL: the CUDA toolkit's, else the one in torch's pip wheel (nvidia-nccl-cu*).
if ! ls /usr/local/cuda/lib64/libnccl.so* /usr/local/cuda/lib/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* > /dev/null 2>&1; then
  NCCL_ROOT=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null) && export NCCL_ROOT &&
    export LD_LIBRARY_PATH=$NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} && note "- NCCL from $NCCL_ROOT"
fi
if [ -n "${PREBUILT:-}" ]; then
  BIN=$(cd "$PREBUILT" && pwd)
  mkdir -p "$BUILD"
  # The test binary has the dev machine's source dir compiled in (fixtures, make-tiny outputs under build-cuda):
  # PREBUILT_SRC names it; when that path does not exist here, it is made a link to this checkout.
  if [ -n "${PREBUILT_SRC:-}" ] && [ ! -e "$PREBUILT_SRC" ]; then
    mkdir -p "$(dirname "$PREBUILT_SRC")" && ln -s "$ROOT" "$PREBUILT_SRC" && note "- linked $PREBUILT_SRC -> $ROOT"
  fi
  note "- prebuilt binaries from $PREBUILT"
  # A prebuilt dsv4 links the dev machine's libcpp-httplib (and its TLS / compression libraries), which the GPU image
  # lacks: without .gpudeps (tools/gpu/make_deps.sh, carried) every bench step would fail with rc 127.
  for b in dsv4 test_cuda; do
    if missing=$(ldd "$BIN/$b" 2>&1 | grep "not found"); then
      note "- prebuilt $b cannot load: $(echo "$missing" | tr -s ' \t' ' ' | tr '\n' ';') -- run tools/gpu/make_deps.sh and carry .gpudeps"
      cat "$SUMMARY"; exit 1
    fi
  done
else
  step configure 60 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release || { cat "$SUMMARY"; exit 1; }
  # The CUDA targets first, so that an unrelated build break elsewhere cannot hide the GPU results.
  step build 240 cmake --build "$BUILD" -j16 --target dsv4 test_cuda || { cat "$SUMMARY"; exit 1; }
  BIN=$BUILD
fi
DSV4=$BIN/dsv4

# NoiseFloor.* is CPU only (~3 min): the dev machine runs it. GTEST_FILTER overrides the selection.
step test_cuda 240 "$BIN/test_cuda" --gtest_filter="${GTEST_FILTER:--NoiseFloor.*}"
grep -E '^\[(op|cuda-vs-cpu|cuda-session|cuda-mtp|cuda-graph|cuda-graph-bench)\]|FAILED|PASSED' "$OUT/test_cuda.log" >> "$SUMMARY"
# A filter that matches nothing passes in gtest: here it is a mistake (e.g. 'DecodeFusions*' for a test whose suite is
# CudaGraph -- '*DecodeFusions*' matches), so it fails the run.
if grep -q '^\[  PASSED  \] 0 tests' "$OUT/test_cuda.log"; then
  note "- test_cuda: the filter '${GTEST_FILTER:-}' selected no test: FAILED"
  status=1
fi

# CUDA logits vs the golden (HF fp64) logits, reference numerics, chunk whole / 1 / 7.
cat > "$BUILD/cmp.py" <<'PY'
import sys, numpy as np
got = np.fromfile(sys.argv[1], dtype=np.float32); ref = np.fromfile(sys.argv[2], dtype=np.float32)
V = int(sys.argv[3]); tol = float(sys.argv[4])
assert got.size == ref.size, (got.size, ref.size)
g = got.reshape(-1, V); r = ref.reshape(-1, V)
rel = float(np.linalg.norm(g - r) / np.linalg.norm(r)); mad = float(np.abs(g - r).max()); top = float((g.argmax(1) == r.argmax(1)).mean())
ok = mad <= tol * float(np.abs(r).max())
print(f"max|diff| {mad:.3g} (tol {tol:.0e} x max|golden|), rel L2 {rel:.3g}, top-1 {100*top:.1f}% -> {'OK' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
for dir in "$ROOT"/tests/fixtures/*/; do
  [ -f "$dir/logits.bin" ] && [ -z "${SKIP_GOLDEN:-}" ] || continue
  case_name=$(basename "$dir")
  V=$(python3 -c "import json;print(json.load(open('$dir/config.json'))['vocab_size'])")
  for chunk in 0 1 7; do
    args=(logits --model "$dir" --ids "$dir/ids.bin" --out "$BUILD/logits_${case_name}_$chunk.bin" --backend cuda --numerics reference)
    [ "$chunk" -gt 0 ] && args+=(--chunk "$chunk")
    if timeout 60 "$DSV4" "${args[@]}" > "$BUILD/logits_${case_name}_$chunk.log" 2>&1; then
      res=$(python3 "$BUILD/cmp.py" "$BUILD/logits_${case_name}_$chunk.bin" "$dir/logits.bin" "$V" 1e-4) || status=1
      note "- golden $case_name chunk=$chunk (cuda, reference): $res"
    else
      note "- golden $case_name chunk=$chunk: dsv4 logits FAILED: $(tail -2 "$BUILD/logits_${case_name}_$chunk.log")"; status=1
    fi
    rm -f "$BUILD/logits_${case_name}_$chunk.bin"
  done
done

grep -E '^\[tp\]' "$OUT/test_cuda.log" >> "$SUMMARY"
if [ -z "${SKIP_BENCH_OPS:-}" ]; then
  step bench 60 "$DSV4" bench-ops --reps 30
  cat "$OUT/bench.log" >> "$SUMMARY"
fi

# A model that cannot fit is refused before any weight is uploaded (memory plan), with a clear message.
if [ "${BENCH_SYNTH:-}" != none ]; then
  if timeout 120 "$DSV4" bench --synthetic flash --layers 43 > "$OUT/too_big.log" 2>&1; then
    note "- too_big: FAILED (Flash at full depth on one GPU did not refuse)"; status=1
  elif grep -q "use more GPUs" "$OUT/too_big.log"; then
    note "- too_big: OK ($(grep -o 'the model.s weights need [0-9.]* GiB' "$OUT/too_big.log"))"
  else
    note "- too_big: FAILED (no clear error)"; tail -3 "$OUT/too_big.log"; status=1
  fi
fi

# Whole-model benchmarks on synthetic full-size weights.
BENCH_SYNTH=${BENCH_SYNTH:-"flash --layers 20 --context 8192"}
[ "$NGPU" -ge 2 ] && [ "$BENCH_SYNTH" = "flash --layers 20 --context 8192" ] && BENCH_SYNTH="$BENCH_SYNTH;flash --layers 43 --tp 2 --context 8192"
if [ "$BENCH_SYNTH" != none ]; then
  i=0
  IFS=';' read -ra benches <<< "$BENCH_SYNTH"
  for b in "${benches[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    step "synth$i" "${SYNTH_TIMEOUT:-420}" "$DSV4" bench --synthetic $b --json "$OUT/synth$i.json"
    { echo "\$ dsv4 bench --synthetic $b"; grep -v '^\[bench\]' "$OUT/synth$i.log" | grep -v '^{'; } >> "$SUMMARY"
  done
fi

# PROFILE_DECODE=1: per-kernel GPU time of one Flash decode step (4 layers) under Nsight Compute, next to the step time.
if [ -n "${PROFILE_DECODE:-}" ]; then
  step profile_decode 300 env OUT="$OUT/profile" "$ROOT/tools/gpu/profile_decode.sh" "$DSV4"
  cat "$OUT/profile/summary.txt" >> "$SUMMARY" 2>/dev/null
fi

# TRACE=1: each kernel's share of a real (graph-replayed) decode step, Flash 4 layers (dsv4 bench --trace-steps).
if [ -n "${TRACE:-}" ]; then
  step trace 180 "$DSV4" bench --synthetic flash --layers 4 --context 8192 --prompt 256 --trace-steps 30
  grep -v '^\[bench\]' "$OUT/trace.log" | grep -v '^{' >> "$SUMMARY"
  if [ "${NGPU:-1}" -ge 2 ]; then  # rank 0's kernels under --tp 2 (peer_all_reduce_kernel: the all-reduces, peer wait included)
    step trace_tp2 180 "$DSV4" bench --synthetic flash --layers 4 --tp 2 --context 8192 --prompt 256 --trace-steps 30
    grep -v '^\[bench\]' "$OUT/trace_tp2.log" | grep -v '^{' >> "$SUMMARY"
  fi
fi

# PROBE=FILE.cu: build a standalone probe (tools/gpu/probes) for this GPU and run it; its output goes to the summary.
if [ -n "${PROBE:-}" ]; then
  step probe_build 120 nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a "$ROOT/$PROBE" -o "$BUILD/probe" &&
    step probe 120 "$BUILD/probe" && cat "$OUT/probe.log" >> "$SUMMARY"
fi

# AB="VAR1 VAR2=V ...": the Flash bench (AB_LAYERS layers, default 20; AB_PROMPT tokens of prompt, default 2K, or
# several prompt sizes "8192 2048": the whole A/B once per size) once per entry (VAR alone: VAR=0;
# several variables in one entry joined by commas: A=1,B=2), after one with none; AB_REPS=N repeats that sequence N
# times (base and variants alternate: drift shows). AB_ARGS="--batch 4": more bench arguments for every A/B run (the
# batched step's line is in the summary then).
AB_LAYERS=${AB_LAYERS:-20}
AB_ARGS=${AB_ARGS:-}
ab_line() { grep -E "per layer|decode step with LM head|prefill [0-9]+ tokens|moe/gate_up|moe/down|attend +[0-9.]+ ms|batched decode, " "$1" | tr -s ' ' | tr '\n' ' '; }
if [ -n "${AB:-}" ]; then
  for prompt in ${AB_PROMPT:-2048}; do
    for rep in $(seq 1 "${AB_REPS:-1}"); do
      # shellcheck disable=SC2086  # AB_ARGS: several arguments
      step "ab_base_p${prompt}_r$rep" 150 "$DSV4" bench --synthetic flash --layers "$AB_LAYERS" --context 8192 --prompt "$prompt" $AB_ARGS
      note "- A/B (${AB_LAYERS}L, ${prompt}-token prompt, rep $rep) base: $(ab_line "$OUT/ab_base_p${prompt}_r$rep.log")"
      for v in $AB; do
        case "$v" in *=*) kv=$v ;; *) kv="$v=0" ;; esac  # VAR alone means VAR=0; VAR=VALUE as given
        name=$(echo "$kv" | tr '=,' '__')
        # shellcheck disable=SC2046,SC2086  # the entry's comma-separated assignments become separate env arguments
        step "ab_${name}_p${prompt}_r$rep" 150 env $(echo "$kv" | tr ',' ' ') "$DSV4" bench --synthetic flash --layers "$AB_LAYERS" --context 8192 --prompt "$prompt" $AB_ARGS
        note "- A/B (${AB_LAYERS}L, ${prompt}-token prompt, rep $rep) $kv: $(ab_line "$OUT/ab_${name}_p${prompt}_r$rep.log")"
      done
    done
  done
fi
# AB_BIN=PATH: the same 20-layer bench alternating THIS binary with another dsv4 binary (e.g. the previous commit's,
# carried along), AB_REPS times; AB_BIN_ENV="A=1 B=2": environment for the other binary only (to match switches).
if [ -n "${AB_BIN:-}" ]; then
  for prompt in ${AB_PROMPT:-2048}; do
    for rep in $(seq 1 "${AB_REPS:-1}"); do
      # shellcheck disable=SC2086  # AB_ARGS / AB_BIN_ENV: several words
      step "abbin_other_p${prompt}_r$rep" 150 env ${AB_BIN_ENV:-} "$AB_BIN" bench --synthetic flash --layers "$AB_LAYERS" --context 8192 --prompt "$prompt" $AB_ARGS
      note "- A/B binaries (${AB_LAYERS}L, ${prompt}-token prompt, rep $rep) other ($AB_BIN ${AB_BIN_ENV:-}): $(ab_line "$OUT/abbin_other_p${prompt}_r$rep.log")"
      # shellcheck disable=SC2086
      step "abbin_this_p${prompt}_r$rep" 150 "$DSV4" bench --synthetic flash --layers "$AB_LAYERS" --context 8192 --prompt "$prompt" $AB_ARGS
      note "- A/B binaries (${AB_LAYERS}L, ${prompt}-token prompt, rep $rep) this: $(ab_line "$OUT/abbin_this_p${prompt}_r$rep.log")"
    done
  done
fi
# PHASE_BIN=PATH: a phase-stamp binary (tools/gpu/phase_build.sh) on the 20-layer bench; its [phases] lines in
# phases.log and their medians per kernel (tools/gpu/phase_summary.py) in the summary.
if [ -n "${PHASE_BIN:-}" ]; then
  phase_prompt=${AB_PROMPT:-2048}
  # DSV4_PHASE_FIRST: the first printed launch (kernels.cu); ~300 instrumented launches per 20-layer step, so 9000 is
  # about 30 steps in: inside the bench's 60 timed replays, after its prefills and the graphs' recording.
  step phases 150 env DSV4_PHASE_FIRST="${PHASE_FIRST:-9000}" "$PHASE_BIN" bench --synthetic flash --layers "$AB_LAYERS" --context 8192 --prompt "${phase_prompt%% *}"
  note "- phase stamps ($PHASE_BIN):"
  note "$(python3 "$ROOT/tools/gpu/phase_summary.py" "$OUT/phases.log" 2>&1)"
fi
# AB_TP="VAR1 VAR2=V ...": the same A/B on two GPUs (Flash 20 layers, --tp 2), where there are two; AB_REPS as above.
if [ -n "${AB_TP:-}" ] && [ "${NGPU:-1}" -ge 2 ]; then
  abt_line() { grep -E "per layer|prefill [0-9]+ tokens|moe/gate_up|moe/down|attend +[0-9.]+ ms" "$1" | tr -s ' ' | tr '\n' ' '; }
  for prompt in ${AB_PROMPT:-2048}; do
    for rep in $(seq 1 "${AB_REPS:-1}"); do
      for v in base $AB_TP; do
        case "$v" in base) kv="DSV4_AB_BASE=1" ;; *=*) kv=$v ;; *) kv="$v=0" ;; esac
        name=$(echo "$kv" | tr '=,' '__')
        # shellcheck disable=SC2046
        step "abtp_${name}_p${prompt}_r$rep" 150 env $(echo "$kv" | tr ',' ' ') "$DSV4" bench --synthetic flash --layers 20 --tp 2 --context 8192 --prompt "$prompt"
        note "- A/B TP2 (${prompt}-token prompt, rep $rep) $kv: $(abt_line "$OUT/abtp_${name}_p${prompt}_r$rep.log")"
      done
    done
  done
fi

# Every other CTest test (CPU reference, checkpoint, text, ...): the CUDA ones ran above, directly.
if [ -z "${SKIP_CTEST:-}" ] && [ -z "${PREBUILT:-}" ]; then
  step build_all 120 cmake --build "$BUILD" -j16
  step ctest 240 ctest --test-dir "$BUILD" -j16 --timeout 200 --output-on-failure -E '^(CudaOps|Fixtures/CudaFixture|Formats/CudaTiny|CudaModel|CudaSession|CudaMtp|CudaGraph|NoiseFloor)\.'
  grep -E "tests passed|tests failed" "$OUT/ctest.log" >> "$SUMMARY"
else
  note "- ctest: skipped (SKIP_CTEST or PREBUILT)"
fi

# compute-sanitizer (memcheck) on the cheaper op tests.
if [ -n "${SKIP_SANITIZER:-}" ]; then
  note "- sanitizer: skipped (SKIP_SANITIZER)"
elif command -v compute-sanitizer > /dev/null; then
  step sanitizer 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/test_cuda" \
    --gtest_filter="${SANITIZER_FILTER:-CudaOps.NormRopeSim8Kv:CudaOps.Compressors:CudaOps.MhcPrePost:CudaOps.AttentionWindowPlusTopk:CudaOps.AttentionDecodeFusedWindowStore:CudaOps.Fp8LinearWqaShape:CudaOps.TopkExactTies:CudaOps.IndexerTopkFused:CudaOps.LinearFormatsAndSplits:CudaOps.RingGemvShapes:CudaOps.Fp8LinearGroupedWoA:CudaOps.Mxfp4ExpertsAndRouter:CudaOps.Mxfp4ExpertsGroupedPrefill}"
else
  note "- sanitizer: compute-sanitizer not found"
fi

note ""
note "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
# The device tool brings back only a few files: everything but the summary goes into one archive.
if [ -n "${PACK:-}" ]; then
  pack=$(mktemp /tmp/check_out.XXXXXX.tgz)
  (cd "$OUT" && tar czf "$pack" --exclude=./summary.md . && find . -mindepth 1 -not -name summary.md -delete &&
    mv "$pack" check_out.tgz) 2>/dev/null
fi
cat "$SUMMARY"
exit $status
