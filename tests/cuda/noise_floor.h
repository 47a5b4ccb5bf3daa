#pragma once
// The official-numerics noise floor of a checkpoint, measured on the CPU alone: copy the checkpoint, move every
// other element of every F32 tensor up by ONE ulp, and compare the CPU official logits of the two. Official numerics
// (UE8M0 block scales, BF16/E4M3 grids, top-k selections) turn such last-bit differences into whole-step jumps, so
// this is how far two correct implementations that differ only in fp32 rounding order can drift apart on this
// checkpoint; the CUDA-vs-CPU official comparison (model_test.cpp) is held to it with a 2x margin.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../model/fixture_util.h"
#include "backend/cpu/cpu_backend.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/tiny_model.h"

namespace dsv4::test {

struct NoiseFloor {
  double rel = 0;        // rel L2 of perturbed vs unperturbed CPU official logits
  double disagree = 0;   // fraction of positions whose argmax differs
  int tensors = 0;       // F32 tensors perturbed
};

// Copies `dir` to `out` and moves every other element (starting at element `parity`) of each F32 tensor by one ulp,
// up (toward +inf) or down.
inline int perturb_checkpoint_one_ulp(const std::string& dir, const std::string& out, int parity, bool up) {
  namespace fs = std::filesystem;
  fs::remove_all(out);
  fs::create_directories(out);
  int count = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const fs::path dst = fs::path(out) / e.path().filename();
    fs::copy_file(e.path(), dst);
    if (e.path().extension() != ".safetensors") continue;
    std::vector<uint8_t> bytes;
    {
      std::ifstream f(dst, std::ios::binary | std::ios::ate);
      bytes.resize(static_cast<size_t>(f.tellg()));
      f.seekg(0);
      f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    const ckpt::ParsedHeader h = ckpt::parse_safetensors_header(bytes.data(), bytes.size(), dst.string());
    for (const auto& t : h.tensors) {
      if (t.dtype != ckpt::DType::F32) continue;
      ++count;
      uint8_t* p = bytes.data() + h.data_offset + t.begin;
      for (uint64_t i = static_cast<uint64_t>(parity); i < (t.end - t.begin) / 4; i += 2) {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        v = std::nextafter(v, up ? INFINITY : -INFINITY);
        std::memcpy(p + 4 * i, &v, 4);
      }
    }
    std::ofstream f(dst, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) fail("cannot write ", dst.string());
  }
  return count;
}

inline void drift(const std::vector<float>& la, const std::vector<float>& lb, size_t V, NoiseFloor& nf);

// One perturbation is one sample of a chaotic process, so the floor is the largest drift (rel L2 and top-1
// disagreement separately) over the four perturbations {even, odd elements} x {up, down}.
inline NoiseFloor measure_noise_floor(const std::string& dir, const std::vector<int32_t>& ids, const std::string& scratch) {
  NoiseFloor nf;
  Model a(dir, make_cpu_backend(), Numerics::Official);
  const auto la = run_logits(a, ids, 0);
  for (int parity = 0; parity < 2; ++parity)
    for (bool up : {true, false}) {
      NoiseFloor one;
      one.tensors = perturb_checkpoint_one_ulp(dir, scratch, parity, up);
      Model b(scratch, make_cpu_backend(), Numerics::Official);
      const auto lb = run_logits(b, ids, 0);
      drift(la, lb, static_cast<size_t>(a.config().vocab_size), one);
      nf.rel = std::max(nf.rel, one.rel);
      nf.disagree = std::max(nf.disagree, one.disagree);
      nf.tensors = one.tensors;
    }
  return nf;
}

inline void drift(const std::vector<float>& la, const std::vector<float>& lb, size_t V, NoiseFloor& nf) {
  const size_t T = la.size() / V;
  double num = 0, den = 0;
  size_t differ = 0;
  for (size_t t = 0; t < T; ++t) {
    size_t ia = 0, ib = 0;
    for (size_t v = 0; v < V; ++v) {
      const double d = static_cast<double>(lb[t * V + v]) - la[t * V + v];
      num += d * d;
      den += static_cast<double>(la[t * V + v]) * la[t * V + v];
      if (la[t * V + v] > la[t * V + ia]) ia = v;
      if (lb[t * V + v] > lb[t * V + ib]) ib = v;
    }
    differ += ia != ib;
  }
  nf.rel = std::sqrt(num / std::max(den, 1e-30));
  nf.disagree = static_cast<double>(differ) / static_cast<double>(T);
}

// The random tiny checkpoints of the CudaTiny tests (src/model/tiny_model.cpp) and their token sequence: long enough
// to wrap the window and fill several compressed entries of every ratio.
inline std::string tiny_model_dir(const std::string& format, const std::string& schedule) {
  const std::string dir = std::string(DSV4_BINARY_DIR) + "/cuda_tiny_" + format + "_" + schedule;
  std::filesystem::create_directories(dir);
  TinySpec sp;
  sp.format = format;
  sp.schedule = schedule;
  sp.seed = 7;
  sp.vocab = 512;
  write_tiny_model(dir, sp);
  return dir;
}
inline std::vector<int32_t> tiny_ids() {
  std::vector<int32_t> ids;
  for (int i = 0; i < 150; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % 512));
  return ids;
}

}  // namespace dsv4::test
