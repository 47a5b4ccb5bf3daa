#pragma once
// safetensors dtype tags, as they appear in headers ("BF16", "F8_E4M3", ...).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dsv4::ckpt {

enum class DType : uint8_t {
  BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2, F8_E8M0,
};

size_t dtype_size(DType t);                            // bytes per element
std::string_view dtype_name(DType t);                  // the safetensors tag
std::optional<DType> parse_dtype(std::string_view s);  // nullopt for unknown tags

}  // namespace dsv4::ckpt
