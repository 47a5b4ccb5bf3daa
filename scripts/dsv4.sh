#!/usr/bin/env bash
# One entry point for a fresh Debian machine: installs what is missing, builds, then runs the requested job.
#   scripts/dsv4.sh run    build + run the main job on the embedded default model
#   scripts/dsv4.sh test   build + run the whole test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-}"
case "$job" in run|test) ;; *) echo "usage: $0 run|test" >&2; exit 2 ;; esac

# --- dependencies ------------------------------------------------------------------------------------------------
apt_pkgs=(cmake g++ make pkg-config libgtest-dev nlohmann-json3-dev libpcre2-dev libcpp-httplib-dev libcli11-dev
          libomp-dev python3 python3-pip)
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "dsv4: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
if [ "$job" = test ]; then
  # Test tooling only (oracles for the tokenizer parity test, the OpenAI SDK for server tests); never an engine dep.
  python3 - <<'PY' 2>/dev/null || python3 -m pip install -q -r tools/requirements-test.txt
import importlib, sys
for m in [l.split("==")[0].split(">=")[0].strip().replace("-", "_") for l in open("tools/requirements-test.txt") if l.strip() and not l.startswith("#")]:
    importlib.import_module({"openai": "openai"}.get(m, m))
PY
fi

# --- build ---------------------------------------------------------------------------------------------------------
jobs=$(nproc)
if [ "$job" = test ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON >/dev/null  # CUDA code is compiled wherever nvcc is
  cmake --build build -j"$jobs"
else
  # The run job builds only the binary, and the CUDA backend only when a GPU is there to run it.
  cuda=OFF; command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && cuda=ON
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=$cuda >/dev/null
  cmake --build build -j"$jobs" --target dsv4
fi

# --- job -----------------------------------------------------------------------------------------------------------
if [ "$job" = test ]; then
  ctest --test-dir build --output-on-failure -j"$jobs"
else
  ./build/dsv4 --version
  # The embedded default model: a small random DeepSeek-V4 (official FP8 + FP4 layout, the real V4 vocabulary and
  # tokenizer), generated deterministically on first use rather than committed.
  [ -f models/default/model.safetensors ] || ./build/dsv4 make-tiny --out models/default --seed 1
  ./build/dsv4 inspect models/default
  # Random weights: the text is meaningless; the run proves the whole path (encode, prefill, sample, parse, stream).
  ./build/dsv4 run --model models/default --mode thinking --max-tokens 64 --seed 1 \
    --prompt "What is the capital of France? Answer in one word."
fi
