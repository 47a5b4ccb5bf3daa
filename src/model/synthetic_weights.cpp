#include "model/synthetic_weights.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "numeric/codecs.h"

namespace dsv4 {

namespace {

struct PoolRng {  // splitmix64
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); }
};

using Pools = std::map<std::pair<ckpt::DType, bool>, std::vector<uint8_t>>;

// Fills a pool of `bytes` for tensors of dtype t. `scale`: the tensor is a block scale (E8M0 / E4M3 / F32 companion).
void fill(std::vector<uint8_t>& p, ckpt::DType t, bool scale, PoolRng& r, int64_t experts) {
  using ckpt::DType;
  const size_t n = p.size();
  switch (t) {
    case DType::F8_E8M0:  // 2^-9 .. 2^-5
      for (auto& b : p) b = static_cast<uint8_t>(118 + r.next() % 5);
      break;
    case DType::F8_E4M3:
      for (auto& b : p) {
        // |x| <= 1 for weights (exponent field <= 7), 2^-6..2^-2 for NVFP4 block scales; never the NaN codes.
        const uint8_t mag = scale ? static_cast<uint8_t>(0x18 + r.next() % 0x20) : static_cast<uint8_t>(r.next() % 0x39);
        b = static_cast<uint8_t>(mag | (scale ? 0 : (r.next() & 0x80)));
      }
      break;
    case DType::U8:
    case DType::I8:  // packed E2M1 pairs: every byte is valid
      for (auto& b : p) b = static_cast<uint8_t>(r.next());
      break;
    case DType::BF16:
    case DType::F16:
      for (size_t i = 0; i + 1 < n; i += 2) {
        const float v = (r.uniform() - 0.5f) * 0.1f;
        const uint16_t h = t == DType::BF16 ? num::encode_bf16(v) : num::encode_f16(v);
        std::memcpy(&p[i], &h, 2);
      }
      break;
    case DType::F32:
      for (size_t i = 0; i + 3 < n; i += 4) {
        const float v = scale ? 0.001f + 0.004f * r.uniform() : 0.01f + 0.05f * r.uniform();
        std::memcpy(&p[i], &v, 4);
      }
      break;
    case DType::I64:  // hash routing rows: distinct experts per token (odd stride mod a power-of-two expert count)
      for (size_t i = 0; i + 7 < n; i += 8) {
        const int64_t row = static_cast<int64_t>(i / 8 / 6), j = static_cast<int64_t>(i / 8 % 6);
        const int64_t e = (row * 7 + j * 41) % experts;
        std::memcpy(&p[i], &e, 8);
      }
      break;
    default: fail("synthetic weights: no generator for dtype ", ckpt::dtype_name(t));
  }
}

bool is_scale(const std::string& name) {
  auto ends = [&](const char* s) {
    const size_t k = std::strlen(s);
    return name.size() >= k && name.compare(name.size() - k, k, s) == 0;
  };
  return ends(".scale") || ends(".weight_scale") || ends(".weight_scale_2") || ends(".input_scale");
}

}  // namespace

ModelConfig truncate_layers(const ModelConfig& c, int layers, bool keep_mtp) {
  if (layers < 1 || layers > c.n_layers) fail("--layers must be in [1, ", c.n_layers, "] (got ", layers, ")");
  ModelConfig t = c;
  t.n_layers = layers;
  t.n_mtp_layers = keep_mtp ? c.n_mtp_layers : 0;
  t.compress_ratios.resize(static_cast<size_t>(layers));
  t.attn_kinds.resize(static_cast<size_t>(layers));
  for (int m = 0; m < t.n_mtp_layers; ++m) {  // the MTP blocks' entries follow the main layers'
    t.compress_ratios.push_back(c.compress_ratios.at(static_cast<size_t>(c.n_layers + m)));
    t.attn_kinds.push_back(c.attn_kinds.at(static_cast<size_t>(c.n_layers + m)));
  }
  t.n_hash_layers = std::min(t.n_hash_layers, layers);
  return t;
}

SyntheticCheckpoint make_synthetic_checkpoint(const std::string& which, int layers, const std::string& format, uint64_t seed,
                                              bool with_mtp) {
  ModelConfig full;
  if (which == "flash") full = flash_config();
  else if (which == "pro") full = pro_config();
  else fail("--synthetic must be flash or pro (got '", which, "')");
  ReleaseFormat f;
  if (format == "instruct") f = ReleaseFormat::instruct();
  else if (format == "base") f = ReleaseFormat::base();
  else if (format == "nvfp4") f = ReleaseFormat::nvfp4();
  else fail("synthetic format must be instruct, base or nvfp4 (got '", format, "')");
  f.with_mtp = with_mtp;
  ModelConfig cfg = truncate_layers(full, layers, with_mtp);
  const std::vector<InventoryTensor> inv = official_inventory(cfg, f);

  auto pools = std::make_shared<Pools>();
  for (const InventoryTensor& t : inv) {
    auto& p = (*pools)[{t.dtype, is_scale(t.name)}];
    p.resize(std::max<size_t>(p.size(), t.bytes()));
  }
  PoolRng r{seed * 0x9E3779B97F4A7C15ull + 7};
  for (auto& [key, p] : *pools) fill(p, key.first, key.second, r, cfg.n_routed_experts);

  std::vector<ckpt::HeaderEntry> entries;
  std::vector<const uint8_t*> data;
  for (const InventoryTensor& t : inv) {
    entries.push_back(ckpt::HeaderEntry{t.name, t.dtype, t.shape, 0, t.bytes()});
    data.push_back((*pools)[{t.dtype, is_scale(t.name)}].data());
  }
  SyntheticCheckpoint s{cfg, ckpt::Checkpoint::in_memory("synthetic " + which + " (" + std::to_string(layers) + " layers)", entries, data), pools};
  return s;
}

}  // namespace dsv4
