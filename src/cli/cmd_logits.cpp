// dsv4 logits: full-sequence logits for a token file, in chunks of any size (the golden-test contract of issue 3).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <vector>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/backend_factory.h"

namespace {

std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) dsv4::fail(path, ": cannot open ids file");
  std::streamsize size = f.tellg();
  if (size <= 0 || size % 4 != 0) dsv4::fail(path, ": ids file must hold a non-empty array of int32 (size ", size, ")");
  std::vector<int32_t> ids(static_cast<size_t>(size / 4));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(ids.data()), size);
  return ids;
}

int cmd_logits(const std::vector<std::string>& args) {
  CLI::App app{"Write logits[T, vocab] (float32 LE) for the int32 LE token ids in IDS_FILE", "dsv4 logits"};
  std::string model, ids_path, out_path, backend = "cpu", numerics = "reference";
  int chunk = 0, tp = 1;
  app.add_option("--model", model, "model directory")->required();
  app.add_option("--ids", ids_path, "int32 little-endian token ids")->required();
  app.add_option("--out", out_path, "output float32 little-endian logits [T, vocab]")->required();
  app.add_option("--chunk", chunk, "prefill chunk size (1 = pure decode); default: whole sequence")->check(CLI::PositiveNumber);
  app.add_option("--backend", backend, "cpu|cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--numerics", numerics, "reference|official")->check(CLI::IsMember({"reference", "official"}));
  app.add_option("--tp", tp, "tensor-parallel GPUs for --backend cuda (1, 2, 4, 8)")->check(CLI::IsMember({1, 2, 4, 8}));
  if (int rc = dsv4::cli::parse_args(app, args); rc >= 0) return rc;
  std::vector<int32_t> ids = read_ids(ids_path);
  dsv4::Model m(model, dsv4::make_backend(backend, tp), dsv4::parse_numerics(numerics));
  const auto& cfg = m.config();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= cfg.vocab_size)
      dsv4::fail(ids_path, ": token id ", ids[i], " at index ", i, " is outside the vocabulary [0, ", cfg.vocab_size, ")");
  const int T = static_cast<int>(ids.size());
  const int step = chunk > 0 ? std::min(chunk, T) : T;
  dsv4::Forward fwd(m, step);
  auto st = m.backend().new_sequence(T);
  std::vector<float> logits(static_cast<size_t>(T) * static_cast<size_t>(cfg.vocab_size));
  for (int p = 0; p < T; p += step) {
    int n = std::min(step, T - p);
    fwd.forward(*st, ids.data() + p, n, p, logits.data() + static_cast<size_t>(p) * cfg.vocab_size);
  }
  std::ofstream o(out_path, std::ios::binary);
  if (!o) dsv4::fail(out_path, ": cannot open for writing");
  o.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  if (!o) dsv4::fail(out_path, ": write failed");
  return 0;
}

}  // namespace

DSV4_REGISTER_COMMAND("logits", "logits of a token sequence (golden-test contract)", cmd_logits);
