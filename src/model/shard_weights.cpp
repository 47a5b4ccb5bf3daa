#include "model/shard_weights.h"

#include <cstring>
#include <deque>

#include "core/error.h"
#include "model/sharding.h"

namespace dsv4 {

namespace {

// Views and bytes created for the shards; kept alive by ModelWeights::owned.
struct ShardStore {
  std::deque<ckpt::HeaderEntry> entries;
  std::deque<TensorView> views;
  std::deque<std::vector<uint8_t>> bytes;
};

ShardStore& new_store(ModelWeights& keep) {
  auto s = std::make_shared<ShardStore>();
  keep.owned.push_back(s);
  return *s;
}

// The stored extent of logical range [a, b) of a dim whose logical length is `logical`, when one stored unit covers
// `per` logical elements (the format says how many: 1 for plain weights, 2 for packed FP4 bytes along the input dim,
// 128 for FP8 scale tiles, 32/16 for MXFP4/NVFP4 scale blocks along the input dim). The slice must fall on whole
// stored units, or it would cut a tile/block/packed byte. (Guessing `per` from the two lengths is wrong whenever the
// dim is not a multiple of the block: 192 rows in 2 FP8 tiles would look like blocks of 96.)
std::pair<int64_t, int64_t> stored_range(const TensorView& t, int dim, int64_t a, int64_t b, int64_t logical, int64_t per) {
  const int64_t stored = t.dim(dim);
  if (stored != (logical + per - 1) / per)
    fail("'", t.name(), "': dim ", dim, " holds ", stored, " units for ", logical, " elements in blocks of ", per);
  if (per == 1) return {a, b};
  if (a % per != 0 || (b % per != 0 && b != logical))
    fail("tensor-parallel split of '", t.name(), "' at [", a, ", ", b, ") cuts a block of ", per,
         " elements (a 128x128 FP8 scale tile, an FP4 scale block or a packed byte); this model cannot be split this way");
  return {a / per, (b + per - 1) / per};
}

const TensorView* slice_view(const TensorView* t, int dim, int64_t a, int64_t b, int64_t logical, int64_t per,
                             ShardStore& st) {
  if (!t) return nullptr;
  if (t->ndim() == 0 || (t->ndim() == 1 && t->dim(0) == 1)) return t;  // per-tensor scalars apply to every shard
  if (t->ndim() <= dim) fail("'", t->name(), "' has no dim ", dim, " to split");
  const auto [s0, s1] = stored_range(*t, dim, a, b, logical, per);
  const int64_t rows = t->dim(0);
  const size_t row_bytes = t->nbytes() / static_cast<size_t>(rows);
  ckpt::HeaderEntry e = *t->entry;
  e.shape[static_cast<size_t>(dim)] = s1 - s0;
  TensorView v = *t;
  if (dim == 0) {
    e.begin = 0;
    e.end = row_bytes * static_cast<size_t>(s1 - s0);
    v.data = t->data + row_bytes * static_cast<size_t>(s0);
  } else {
    if (t->ndim() != 2) fail("'", t->name(), "': column split needs a 2-d tensor");
    const size_t unit = row_bytes / static_cast<size_t>(t->dim(1));  // bytes per stored column
    const size_t piece = unit * static_cast<size_t>(s1 - s0);
    st.bytes.emplace_back(piece * static_cast<size_t>(rows));
    std::vector<uint8_t>& buf = st.bytes.back();
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(buf.data() + piece * static_cast<size_t>(r), t->data + row_bytes * static_cast<size_t>(r) + unit * static_cast<size_t>(s0), piece);
    e.begin = 0;
    e.end = buf.size();
    v.data = buf.data();
  }
  st.entries.push_back(std::move(e));
  v.entry = &st.entries.back();
  st.views.push_back(v);
  return &st.views.back();
}

LinearRef slice_linear(const LinearRef& r, int dim, int64_t a, int64_t b, ShardStore& st) {
  const int64_t logical = dim == 0 ? r.out : r.in;
  if (a < 0 || b > logical || a >= b) fail("'", r.name, "': bad slice [", a, ", ", b, ") of ", logical);
  LinearRef s = r;
  const bool fp8 = r.fmt == WeightFormat::FP8_E8M0 || r.fmt == WeightFormat::FP8_F32;
  const bool fp4 = r.fmt == WeightFormat::MXFP4 || r.fmt == WeightFormat::NVFP4;
  const int64_t fp4_block = r.fmt == WeightFormat::NVFP4 ? 16 : 32;
  const int64_t w_per = fp4 && dim == 1 ? 2 : 1;                               // packed E2M1 pairs along the input
  const int64_t s_per = fp8 ? 128 : (fp4 ? (dim == 1 ? fp4_block : 1) : 1);  // FP8 tiles; FP4 blocks per row
  s.weight = slice_view(r.weight, dim, a, b, logical, w_per, st);
  s.scale = slice_view(r.scale, dim, a, b, logical, s_per, st);
  (dim == 0 ? s.out : s.in) = b - a;
  return s;
}

}  // namespace

LinearRef slice_linear_rows(const LinearRef& r, int64_t r0, int64_t r1, ModelWeights& keep) {
  return slice_linear(r, 0, r0, r1, new_store(keep));
}
LinearRef slice_linear_cols(const LinearRef& r, int64_t c0, int64_t c1, ModelWeights& keep) {
  return slice_linear(r, 1, c0, c1, new_store(keep));
}

ModelWeights shard_model_weights(const ModelWeights& w, const ModelConfig& c, int rank, int tp) {
  check_tp(c, tp);
  if (rank < 0 || rank >= tp) fail("tensor-parallel rank ", rank, " outside [0, ", tp, ")");
  ModelWeights s = w;
  if (tp == 1) return s;
  ShardStore& st = new_store(s);
  auto part = [&](int64_t len) { return std::pair<int64_t, int64_t>{len / tp * rank, len / tp * (rank + 1)}; };
  auto rows = [&](LinearRef& l) { auto [a, b] = part(l.out); l = slice_linear(l, 0, a, b, st); };
  auto cols = [&](LinearRef& l) { auto [a, b] = part(l.in); l = slice_linear(l, 1, a, b, st); };
  auto split_layer = [&](LayerWeights& L) {
    rows(L.wq_b);  // query heads
    rows(L.wo_a);  // whole head groups (o_groups % tp == 0)
    cols(L.wo_b);  // row-parallel: partial sums + all-reduce
    if (L.attn_sink) {
      auto [a, b] = part(L.attn_sink->dim(0));
      L.attn_sink = slice_view(L.attn_sink, 0, a, b, L.attn_sink->dim(0), 1, st);
    }
    for (ExpertWeights& e : L.experts) rows(e.w1), rows(e.w3), cols(e.w2);
    if (L.shared) rows(L.shared->w1), rows(L.shared->w3), cols(L.shared->w2);
  };
  rows(s.head);  // vocabulary-parallel
  for (LayerWeights& L : s.layers) split_layer(L);
  if (s.mtp) split_layer(*s.mtp);
  return s;
}

}  // namespace dsv4
