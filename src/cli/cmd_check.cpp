// dsv4 check: the same tokens through two backends (default CPU vs CUDA, official numerics), compared after every
// sub-layer (cosine similarity and relative error of the residual streams) and at the logits (top-1 agreement).
// The A/B tool for finding the first layer where a fast path departs from the reference.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/backend_factory.h"

namespace {

struct Capture {
  std::map<std::pair<int, std::string>, std::vector<float>> acts;
  std::vector<float> logits;
};

Capture run(const std::string& dir, const std::string& backend, int tp, const std::string& numerics,
            const std::vector<int32_t>& ids) {
  dsv4::Model m(dir, dsv4::make_backend(backend, tp), dsv4::parse_numerics(numerics));
  const auto& c = m.config();
  const int n = static_cast<int>(ids.size());
  dsv4::Forward fwd(m, n);
  Capture cap;
  fwd.set_observer([&](int layer, const char* site, const float* X, int rows) {
    auto& v = cap.acts[{layer, site}];
    v.resize(static_cast<size_t>(rows) * c.hc_mult * c.hidden);
    m.backend().download_f32(v.data(), X, v.size());
  });
  auto st = m.backend().new_sequence(n);
  cap.logits.resize(static_cast<size_t>(n) * c.vocab_size);
  fwd.forward(*st, ids.data(), n, 0, cap.logits.data());
  return cap;
}

int cmd_check(const std::vector<std::string>& args) {
  CLI::App app{"Compare two backends layer by layer on the same tokens (cosine, relative error, top-1)", "dsv4 check"};
  std::string model, ids_path, a = "cpu", b = "cuda", numerics = "official", b_numerics;
  int layers = 0, tokens = 64, a_tp = 1, b_tp = 1;
  double min_cos = 0.999;
  app.add_option("--model", model, "model directory")->required();
  app.add_option("--layers", layers, "report only the first N layers (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--ids", ids_path, "int32 LE token ids (default: a fixed pseudo-random sequence)");
  app.add_option("--tokens", tokens, "length of the default sequence")->check(CLI::Range(2, 65536));
  app.add_option("--a", a, "reference backend (cpu|cuda)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--b", b, "backend under test (cpu|cuda)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--a-tp", a_tp, "tensor-parallel GPUs of side a (cuda)")->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("--b-tp", b_tp, "tensor-parallel GPUs of side b (cuda), e.g. --a cuda --b cuda --b-tp 2")->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("--numerics", numerics, "reference|official (both sides)")->check(CLI::IsMember({"reference", "official"}));
  app.add_option("--b-numerics", b_numerics, "numerics of side b if different")->check(CLI::IsMember({"reference", "official"}));
  app.add_option("--min-cosine", min_cos, "exit 1 if any sub-layer falls below this cosine");
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  if (b_numerics.empty()) b_numerics = numerics;

  std::vector<int32_t> ids;
  const auto cfg = dsv4::load_model_config(model + "/config.json");
  if (!ids_path.empty()) {
    std::ifstream f(ids_path, std::ios::binary | std::ios::ate);
    if (!f) dsv4::fail(ids_path, ": cannot open");
    auto size = static_cast<size_t>(f.tellg());
    if (size < 8 || size % 4) dsv4::fail(ids_path, ": need at least two int32 ids");
    ids.resize(size / 4);
    f.seekg(0);
    f.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(size));
  } else {
    uint64_t x = 12345;  // fixed LCG: the same tokens on every run
    for (int i = 0; i < tokens; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      ids.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(cfg.vocab_size)));
    }
  }
  Capture A = run(model, a, a_tp, numerics, ids), B = run(model, b, b_tp, b_numerics, ids);
  std::printf("%s (%s) vs %s (%s), %zu tokens\n%-7s %-5s %10s %12s\n", a.c_str(), numerics.c_str(), b.c_str(),
              b_numerics.c_str(), ids.size(), "layer", "site", "cosine", "rel err");
  double worst = 1.0;
  for (const auto& [key, va] : A.acts) {
    if (layers > 0 && key.first >= layers) continue;
    const auto& vb = B.acts.at(key);
    double dot = 0, na = 0, nb = 0, diff = 0;
    for (size_t i = 0; i < va.size(); ++i) {
      dot += double(va[i]) * vb[i];
      na += double(va[i]) * va[i];
      nb += double(vb[i]) * vb[i];
      diff += (double(va[i]) - vb[i]) * (double(va[i]) - vb[i]);
    }
    double cos = dot / std::sqrt(std::max(na * nb, 1e-300)), rel = std::sqrt(diff / std::max(na, 1e-300));
    worst = std::min(worst, cos);
    std::printf("%-7d %-5s %10.6f %12.3e%s\n", key.first, key.second.c_str(), cos, rel, cos < min_cos ? "  <--" : "");
  }
  const size_t V = static_cast<size_t>(cfg.vocab_size), T = ids.size();
  size_t agree = 0;
  double num = 0, den = 0;
  for (size_t t = 0; t < T; ++t) {
    size_t ia = 0, ib = 0;
    for (size_t v = 0; v < V; ++v) {
      if (A.logits[t * V + v] > A.logits[t * V + ia]) ia = v;
      if (B.logits[t * V + v] > B.logits[t * V + ib]) ib = v;
      double d = double(A.logits[t * V + v]) - B.logits[t * V + v];
      num += d * d;
      den += double(A.logits[t * V + v]) * A.logits[t * V + v];
    }
    agree += ia == ib;
  }
  std::printf("logits: rel L2 %.3e, top-1 agreement %zu/%zu (%.2f%%); worst sub-layer cosine %.6f\n",
              std::sqrt(num / std::max(den, 1e-300)), agree, T, 100.0 * double(agree) / double(T), worst);
  return worst < min_cos ? 1 : 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("check", "A/B two backends layer by layer (cosine, rel err, top-1)", cmd_check);
