// libFuzzer target for parse_safetensors_header. Contract under test: for any bytes, the parser either throws
// dsv4::Error or returns a header whose every tensor lies inside the buffer, has the size its shape and dtype
// imply, and overlaps no other tensor. Any other exception, a sanitizer report, or a broken invariant is a crash.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

void check_invariants(const dsv4::ckpt::ParsedHeader& h, const uint8_t* data, size_t size) {
  require(h.data_offset >= 8 && h.data_offset <= size);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  volatile uint8_t sink = 0;
  for (const auto& t : h.tensors) {
    require(t.begin <= t.end && t.end <= size - h.data_offset);
    uint64_t bytes = dsv4::ckpt::dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      require(d >= 0);
      require(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes));
    }
    require(bytes == t.end - t.begin);
    if (t.end > t.begin) {
      // Touch both ends so that AddressSanitizer would flag a range outside the input buffer.
      sink = sink + data[h.data_offset + t.begin] + data[h.data_offset + t.end - 1];
      ranges.emplace_back(t.begin, t.end);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) require(ranges[i - 1].second <= ranges[i].first);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto h = dsv4::ckpt::parse_safetensors_header(data, size, "fuzz-input");
    check_invariants(h, data, size);
  } catch (const dsv4::Error&) {
    // Rejecting bad input with dsv4::Error is the expected outcome.
  }
  return 0;
}
