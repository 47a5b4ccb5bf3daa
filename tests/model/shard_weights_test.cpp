// Tensor-parallel weight shards (issue 8): every rank's slice of every linear dequantizes to exactly the matching rows
// or columns of the full weight, in every stored format; the split follows sharding.h's per-name rules; widths that
// would cut a tile are refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/shard_weights.h"
#include "model/sharding.h"
#include "model/tiny_model.h"

namespace dsv4 {
namespace {

struct Loaded {
  ModelConfig cfg;
  ckpt::Checkpoint ck;
  ModelWeights w;
};

std::unique_ptr<Loaded> load_tiny(const std::string& format, bool tp_ready) {
  const std::string dir = std::string(DSV4_BINARY_DIR) + "/test_shard_" + format + std::to_string(tp_ready) + "_" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  TinySpec sp;
  sp.format = format;
  sp.vocab = 1024;
  sp.layers = 3;
  sp.tp_ready = tp_ready;
  write_tiny_model(dir, sp);
  ModelConfig cfg = load_model_config(dir + "/config.json");
  auto* l = new Loaded{cfg, ckpt::Checkpoint::open(dir), ModelWeights{}};
  l->w = resolve_model_weights(l->ck, l->cfg);
  std::filesystem::remove_all(dir);  // stays mapped
  return std::unique_ptr<Loaded>(l);
}

std::vector<float> dequant(const LinearRef& r) {
  std::vector<float> v(static_cast<size_t>(r.out * r.in));
  dequantize_rows(r, 0, r.out, v.data());
  return v;
}

class ShardFormats : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardFormats, EverySliceDequantizesToThePieceOfTheFullWeight) {
  auto m = load_tiny(GetParam(), true);
  const auto full = m->w.all_linears();
  for (int tp : {2, 4, 8}) {
    for (int rank = 0; rank < tp; ++rank) {
      ModelWeights s = shard_model_weights(m->w, m->cfg, rank, tp);
      const auto part = s.all_linears();
      ASSERT_EQ(part.size(), full.size());
      int rows_split = 0, cols_split = 0;
      for (size_t i = 0; i < full.size(); ++i) {
        const LinearRef& F = *full[i];
        const LinearRef& P = *part[i];
        ASSERT_EQ(F.name, P.name);
        const Split rule = shard_split(F.name + ".weight");
        const std::vector<float> fv = dequant(F), pv = dequant(P);
        if (rule == Split::Replicated) {
          EXPECT_EQ(P.weight, F.weight) << F.name << " must be shared, not copied";
          EXPECT_EQ(pv, fv) << F.name;
          continue;
        }
        if (rule == Split::Rows) {
          ++rows_split;
          ASSERT_EQ(P.out * tp, F.out) << F.name;
          ASSERT_EQ(P.in, F.in) << F.name;
          const int64_t r0 = P.out * rank;
          for (int64_t r = 0; r < P.out; ++r)
            for (int64_t k = 0; k < P.in; ++k)
              ASSERT_EQ(pv[static_cast<size_t>(r * P.in + k)], fv[static_cast<size_t>((r0 + r) * F.in + k)])
                  << F.name << " tp " << tp << " rank " << rank << " row " << r << " col " << k;
        } else {
          ++cols_split;
          ASSERT_EQ(P.in * tp, F.in) << F.name;
          ASSERT_EQ(P.out, F.out) << F.name;
          const int64_t c0 = P.in * rank;
          for (int64_t r = 0; r < P.out; ++r)
            for (int64_t k = 0; k < P.in; ++k)
              ASSERT_EQ(pv[static_cast<size_t>(r * P.in + k)], fv[static_cast<size_t>(r * F.in + c0 + k)])
                  << F.name << " tp " << tp << " rank " << rank << " row " << r << " col " << k;
        }
      }
      // head + per layer (3 main + MTP): wq_b, wo_a, 8 experts x (w1, w3), shared (w1, w3) rows; wo_b and w2 cols.
      EXPECT_EQ(rows_split, 1 + 4 * (2 + 2 * 8 + 2));
      EXPECT_EQ(cols_split, 4 * (1 + 8 + 1));
      // The attention sinks follow the query heads.
      for (size_t l = 0; l < s.layers.size(); ++l) {
        const TensorView* fs = m->w.layers[l].attn_sink;
        const TensorView* ps = s.layers[l].attn_sink;
        ASSERT_EQ(ps->dim(0) * tp, fs->dim(0));
        EXPECT_EQ(0, std::memcmp(ps->data, fs->data + ps->nbytes() * static_cast<size_t>(rank), ps->nbytes()));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ShardFormats, ::testing::Values("fp8", "base", "nvfp4", "bf16"));

TEST(ShardWeights, RefusesSplitsThatCutTilesOrHeads) {
  auto m = load_tiny("fp8", false);  // 4 heads in 2 groups, o_lora 32, expert width 64
  EXPECT_THROW(shard_model_weights(m->w, m->cfg, 0, 2), Error);
  EXPECT_THROW(shard_model_weights(m->w, m->cfg, 0, 3), Error);
  auto t = load_tiny("fp8", true);
  EXPECT_THROW(shard_model_weights(t->w, t->cfg, 2, 2), Error);   // rank outside [0, tp)
  EXPECT_THROW(shard_model_weights(t->w, t->cfg, 0, 16), Error);  // 8 heads do not split 16 ways
  // A row slice that starts inside an FP8 128-row tile is refused with the tensor's name.
  try {
    slice_linear_rows(t->w.layers[0].wq_b, 64, 128, t->w);
    FAIL() << "expected a tile-cut error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.attn.wq_b"), std::string::npos) << e.what();
  }
  // A dim that is not a multiple of the FP8 tile: 192 rows in 2 scale rows. Splitting at 96 would hand rank 1 rows
  // 96..127 with tile 1's scale; it must be refused (and 128 is a legal cut).
  {
    std::vector<uint8_t> w(192 * 128, 0x38), sc(2, 127);
    ckpt::Checkpoint ck = ckpt::Checkpoint::in_memory(
        "mem", {{"x.weight", ckpt::DType::F8_E4M3, {192, 128}, 0, 192 * 128}, {"x.scale", ckpt::DType::F8_E8M0, {2, 1}, 0, 2}},
        {w.data(), sc.data()});
    LinearRef r;
    r.name = "x";
    r.fmt = WeightFormat::FP8_E8M0;
    r.out = 192, r.in = 128;
    r.weight = &ck.get("x.weight");
    r.scale = &ck.get("x.scale");
    ModelWeights keep;
    EXPECT_THROW(slice_linear_rows(r, 96, 192, keep), Error);
    const LinearRef ok = slice_linear_rows(r, 128, 192, keep);
    EXPECT_EQ(ok.out, 64);
    EXPECT_EQ(ok.scale->dim(0), 1);
    EXPECT_EQ(ok.scale->data, sc.data() + 1);
  }
  // TP 1 is the identity.
  ModelWeights one = shard_model_weights(t->w, t->cfg, 0, 1);
  EXPECT_EQ(one.layers[0].wq_b.weight, t->w.layers[0].wq_b.weight);
}

}  // namespace
}  // namespace dsv4
