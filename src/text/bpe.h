#pragma once
// Byte-pair encoding of one pre-tokenized piece (CHAT_FORMAT.md §4.6): repeatedly merge the adjacent pair with the
// lowest merge rank (leftmost on ties), using a linked list of symbols and a min-heap with lazy invalidation, so a
// long piece costs O(n log n). Results are memoised per thread (pieces repeat a lot: " the", "\n", "    ").
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::text {

class Bpe {
 public:
  struct Merge {
    std::int32_t left, right, result;
  };
  // byte_ids[b] = id of the single-byte token for byte b; merges in rank order (index = rank).
  Bpe(const std::int32_t (&byte_ids)[256], const std::vector<Merge>& merges);

  // Appends the ids of `piece` (raw bytes, non-empty) to `out`.
  void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const;

  // The same without the cache (used by tests to check the cache is transparent).
  void encode_piece_uncached(std::string_view piece, std::vector<std::int32_t>& out) const;

 private:
  struct Slot {
    std::uint64_t key;  // (left << 32) | right; kEmpty when free
    std::uint32_t rank;
    std::int32_t result;
  };
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  const Slot* find(std::int32_t left, std::int32_t right) const;

  std::int32_t byte_ids_[256];
  std::vector<Slot> slots_;  // open addressing, power-of-two size
  std::uint64_t mask_ = 0;
  std::uint64_t instance_id_;  // keys the per-thread cache to this model
};

}  // namespace dsv4::text
