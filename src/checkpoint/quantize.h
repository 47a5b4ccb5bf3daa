#pragma once
// Weight quantizers that write the released storage formats (used by `dsv4 make-tiny` and tests): the inverse of
// dequantize_rows for each WeightFormat.
#include <cstdint>
#include <vector>

#include "checkpoint/writer.h"

namespace dsv4 {

enum class WeightFormat;

// Adds "<base>.weight" (+ scale companions) for W[out, in] (fp32 row-major) in format `fmt` to the writer.
void add_quantized_linear(ckpt::SafetensorsWriter& w, const std::string& base, const std::vector<float>& W,
                          int64_t out, int64_t in, WeightFormat fmt);
// BF16 bytes of a float array (RNE).
std::vector<uint8_t> to_bf16_bytes(const std::vector<float>& v);

}  // namespace dsv4
