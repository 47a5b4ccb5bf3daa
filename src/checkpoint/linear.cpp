#include "checkpoint/linear.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "numeric/codecs.h"

namespace dsv4 {

using ckpt::DType;

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::F16: return "F16";
    case WeightFormat::FP8_E8M0: return "FP8(128x128 E8M0)";
    case WeightFormat::FP8_F32: return "FP8(128x128 F32)";
    case WeightFormat::MXFP4: return "MXFP4(1x32 E8M0)";
    case WeightFormat::NVFP4: return "NVFP4(1x16 E4M3)";
  }
  return "?";
}

uint64_t LinearRef::stored_bytes() const {
  uint64_t b = weight ? weight->nbytes() : 0;
  for (auto* t : {scale, scale2, input_scale})
    if (t) b += t->nbytes();
  return b;
}

void tensor_to_f32(const ckpt::TensorView& t, float* out) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::F32: std::memcpy(out, t.data, static_cast<size_t>(n) * 4); break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, t.data + 2 * i, 2);
        out[i] = num::decode_bf16(v);
      }
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, t.data + 2 * i, 2);
        out[i] = num::decode_f16(v);
      }
      break;
    default: fail(*t.file, ": tensor '", t.name(), "' has dtype ", ckpt::dtype_name(t.dtype()), ", expected BF16/F16/F32");
  }
}

static float scale_value(const ckpt::TensorView& s, int64_t idx, const LinearRef& w) {
  float v;
  if (s.dtype() == DType::F8_E8M0) {
    uint8_t b = s.data[idx];
    if (b == 255) fail(*s.file, ": tensor '", s.name(), "' holds scale byte 255 (NaN) at index ", idx, " (weight ", w.name, ")");
    v = num::decode_e8m0(b);
  } else if (s.dtype() == DType::F32) {
    std::memcpy(&v, s.data + 4 * idx, 4);
  } else if (s.dtype() == DType::F8_E4M3) {
    v = num::decode_e4m3(s.data[idx]);
  } else {
    fail(*s.file, ": scale tensor '", s.name(), "' has unsupported dtype ", ckpt::dtype_name(s.dtype()));
  }
  if (!std::isfinite(v)) fail(*s.file, ": tensor '", s.name(), "' holds a non-finite scale at index ", idx);
  return v;
}

void dequantize_rows(const LinearRef& w, int64_t r0, int64_t r1, float* out) {
  const int64_t in = w.in;
  const ckpt::TensorView& t = *w.weight;
  switch (w.fmt) {
    case WeightFormat::F32:
    case WeightFormat::BF16:
    case WeightFormat::F16: {
      // Row slices of a row-major tensor: convert just that range.
      const size_t es = ckpt::dtype_size(t.dtype());
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = t.data + static_cast<size_t>(r * in) * es;
        float* o = out + (r - r0) * in;
        for (int64_t k = 0; k < in; ++k) {
          if (w.fmt == WeightFormat::F32) std::memcpy(&o[k], row + 4 * k, 4);
          else {
            uint16_t v;
            std::memcpy(&v, row + 2 * k, 2);
            o[k] = w.fmt == WeightFormat::BF16 ? num::decode_bf16(v) : num::decode_f16(v);
          }
        }
      }
      break;
    }
    case WeightFormat::FP8_E8M0:
    case WeightFormat::FP8_F32: {
      const int64_t sb_cols = w.scale->dim(1);
      for (int64_t r = r0; r < r1; ++r) {
        float* o = out + (r - r0) * in;
        const uint8_t* row = t.data + r * in;
        for (int64_t kb = 0; kb < sb_cols; ++kb) {
          float s = scale_value(*w.scale, (r / 128) * sb_cols + kb, w);
          int64_t k1 = std::min(in, (kb + 1) * 128);
          for (int64_t k = kb * 128; k < k1; ++k) o[k] = num::decode_e4m3(row[k]) * s;
        }
      }
      break;
    }
    case WeightFormat::MXFP4:
    case WeightFormat::NVFP4: {
      const int64_t block = w.fmt == WeightFormat::MXFP4 ? 32 : 16;
      const int64_t nb = in / block;
      float global = 1.0f;
      if (w.fmt == WeightFormat::NVFP4) global = scale_value(*w.scale2, 0, w);
      for (int64_t r = r0; r < r1; ++r) {
        float* o = out + (r - r0) * in;
        const uint8_t* row = t.data + r * (in / 2);
        for (int64_t b = 0; b < nb; ++b) {
          float s = scale_value(*w.scale, r * nb + b, w) * global;
          for (int64_t k = b * block; k < (b + 1) * block; ++k) o[k] = num::decode_e2m1(num::fp4_nibble(row, k)) * s;
        }
      }
      break;
    }
  }
}

}  // namespace dsv4
