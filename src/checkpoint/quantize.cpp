#include "checkpoint/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "checkpoint/linear.h"
#include "core/error.h"
#include "numeric/codecs.h"

namespace dsv4 {

using ckpt::DType;

std::vector<uint8_t> to_bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h = num::encode_bf16(v[i]);
    std::memcpy(&b[2 * i], &h, 2);
  }
  return b;
}

void add_quantized_linear(ckpt::SafetensorsWriter& w, const std::string& base, const std::vector<float>& W,
                          int64_t out, int64_t in, WeightFormat fmt) {
  DSV4_CHECK(static_cast<int64_t>(W.size()) == out * in, base);
  switch (fmt) {
    case WeightFormat::F32: w.add_f32(base + ".weight", {out, in}, W); return;
    case WeightFormat::BF16: w.add(base + ".weight", DType::BF16, {out, in}, to_bf16_bytes(W)); return;
    case WeightFormat::F16: {
      std::vector<uint8_t> b(W.size() * 2);
      for (size_t i = 0; i < W.size(); ++i) {
        uint16_t h = num::encode_f16(W[i]);
        std::memcpy(&b[2 * i], &h, 2);
      }
      w.add(base + ".weight", DType::F16, {out, in}, std::move(b));
      return;
    }
    case WeightFormat::FP8_E8M0:
    case WeightFormat::FP8_F32: {
      const int64_t so = (out + 127) / 128, si = (in + 127) / 128;
      std::vector<uint8_t> q(static_cast<size_t>(out * in));
      std::vector<float> scales(static_cast<size_t>(so * si));
      for (int64_t bo = 0; bo < so; ++bo)
        for (int64_t bi = 0; bi < si; ++bi) {
          float amax = 0;
          for (int64_t o = bo * 128; o < std::min(out, bo * 128 + 128); ++o)
            for (int64_t k = bi * 128; k < std::min(in, bi * 128 + 128); ++k) amax = std::max(amax, std::fabs(W[o * in + k]));
          amax = std::max(amax, 1e-12f);
          float s = fmt == WeightFormat::FP8_E8M0 ? num::ue8m0_scale(amax, 448.0f) : amax / 448.0f;
          scales[static_cast<size_t>(bo * si + bi)] = s;
          for (int64_t o = bo * 128; o < std::min(out, bo * 128 + 128); ++o)
            for (int64_t k = bi * 128; k < std::min(in, bi * 128 + 128); ++k)
              q[static_cast<size_t>(o * in + k)] = num::encode_e4m3(W[o * in + k] / s);
        }
      w.add(base + ".weight", DType::F8_E4M3, {out, in}, std::move(q));
      if (fmt == WeightFormat::FP8_F32) {
        w.add_f32(base + ".scale", {so, si}, scales);
      } else {
        std::vector<uint8_t> sb(scales.size());
        for (size_t i = 0; i < scales.size(); ++i) sb[i] = num::encode_e8m0_ceil(scales[i]);
        w.add(base + ".scale", DType::F8_E8M0, {so, si}, std::move(sb));
      }
      return;
    }
    case WeightFormat::MXFP4:
    case WeightFormat::NVFP4: {
      const int64_t block = fmt == WeightFormat::MXFP4 ? 32 : 16;
      DSV4_CHECK(in % block == 0, base, ": in=", in, " not a multiple of ", block);
      const int64_t nb = in / block;
      float global = 1.0f;
      if (fmt == WeightFormat::NVFP4) {  // ModelOpt: global scale so that block scales fit E4M3 (max 448)
        float amax = 0;
        for (float v : W) amax = std::max(amax, std::fabs(v));
        global = std::max(amax, 1e-12f) / (6.0f * 448.0f);
      }
      std::vector<uint8_t> packed(static_cast<size_t>(out * in / 2), 0);
      std::vector<uint8_t> sc(static_cast<size_t>(out * nb));
      for (int64_t o = 0; o < out; ++o)
        for (int64_t b = 0; b < nb; ++b) {
          float amax = 0;
          for (int64_t k = b * block; k < (b + 1) * block; ++k) amax = std::max(amax, std::fabs(W[o * in + k]));
          float s;
          if (fmt == WeightFormat::MXFP4) {
            uint8_t e = num::encode_e8m0_ceil(std::max(amax, 1e-30f) / 6.0f);
            sc[static_cast<size_t>(o * nb + b)] = e;
            s = num::decode_e8m0(e);
          } else {
            uint8_t e = num::encode_e4m3(std::max(amax / 6.0f / global, 0.0f));
            if (num::decode_e4m3(e) == 0.0f) e = 0x08;  // smallest normal rather than a zero scale
            sc[static_cast<size_t>(o * nb + b)] = e;
            s = num::decode_e4m3(e) * global;
          }
          for (int64_t k = b * block; k < (b + 1) * block; ++k) {
            uint8_t nib = num::encode_e2m1(W[o * in + k] / s);
            packed[static_cast<size_t>((o * in + k) / 2)] |= static_cast<uint8_t>((k & 1) ? nib << 4 : nib);
          }
        }
      if (fmt == WeightFormat::MXFP4) {
        w.add(base + ".weight", DType::I8, {out, in / 2}, std::move(packed));
        w.add(base + ".scale", DType::F8_E8M0, {out, nb}, std::move(sc));
      } else {
        w.add(base + ".weight", DType::U8, {out, in / 2}, std::move(packed));
        w.add(base + ".weight_scale", DType::F8_E4M3, {out, nb}, std::move(sc));
        w.add_f32(base + ".weight_scale_2", {}, {global});
        w.add_f32(base + ".input_scale", {}, {1.0f});
      }
      return;
    }
  }
}

}  // namespace dsv4
