#include "text/bpe.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

namespace dsv4::text {
namespace {

std::uint64_t hash_key(std::uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

std::uint64_t next_instance_id() {
  static std::atomic<std::uint64_t> n{1};
  return n++;
}

// Per-thread memo of piece -> ids. Keyed by the owning Bpe so two tokenizers never share entries; bounded so that a
// long-running server cannot grow it without limit (it is simply dropped and rebuilt).
struct PieceCache {
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Entry {
    std::uint32_t offset, length;
  };
  std::uint64_t owner = 0;
  std::unordered_map<std::string, Entry, Hash, std::equal_to<>> map;
  std::vector<std::int32_t> ids;

  static constexpr std::size_t kMaxEntries = 1 << 18;
  static constexpr std::size_t kMaxPieceBytes = 256;  // longer pieces are rare and would bloat the cache

  void reset(std::uint64_t new_owner) {
    owner = new_owner;
    map.clear();
    ids.clear();
  }
};

}  // namespace

Bpe::Bpe(const std::int32_t (&byte_ids)[256], const std::vector<Merge>& merges) : instance_id_(next_instance_id()) {
  std::copy(std::begin(byte_ids), std::end(byte_ids), byte_ids_);
  std::size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    const std::uint64_t key = (std::uint64_t(std::uint32_t(m.left)) << 32) | std::uint32_t(m.right);
    std::uint64_t h = hash_key(key) & mask_;
    while (slots_[h].key != kEmpty && slots_[h].key != key) h = (h + 1) & mask_;
    // A repeated pair takes the later line, as Hugging Face's merge map (built by collecting into a hash map) does.
    slots_[h] = Slot{key, static_cast<std::uint32_t>(rank), m.result};
  }
}

const Bpe::Slot* Bpe::find(std::int32_t left, std::int32_t right) const {
  const std::uint64_t key = (std::uint64_t(std::uint32_t(left)) << 32) | std::uint32_t(right);
  std::uint64_t h = hash_key(key) & mask_;
  while (true) {
    const Slot& s = slots_[h];
    if (s.key == key) return &s;
    if (s.key == kEmpty) return nullptr;
    h = (h + 1) & mask_;
  }
}

void Bpe::encode_piece_uncached(std::string_view piece, std::vector<std::int32_t>& out) const {
  const auto n = static_cast<std::int32_t>(piece.size());
  if (n == 0) return;
  struct Candidate {
    std::uint32_t rank;
    std::int32_t left, right;        // symbol indices
    std::int32_t left_id, right_id;  // ids when queued: a changed id means the candidate is stale
    std::int32_t result;
  };
  // Min-heap on (rank, left): lowest rank first, leftmost on ties (symbol index order = text order).
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  thread_local std::vector<std::int32_t> id, prev, next;
  thread_local std::vector<Candidate> heap;
  id.resize(n);
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (std::int32_t k = 0; k < n; ++k) {
    id[k] = byte_ids_[static_cast<std::uint8_t>(piece[k])];
    prev[k] = k - 1;
    next[k] = k + 1 < n ? k + 1 : -1;
  }
  auto push = [&](std::int32_t l, std::int32_t r) {
    if (l < 0 || r < 0) return;
    if (const Slot* s = find(id[l], id[r])) {
      heap.push_back(Candidate{s->rank, l, r, id[l], id[r], s->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (std::int32_t k = 0; k + 1 < n; ++k) push(k, k + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    if (id[c.left] != c.left_id || id[c.right] != c.right_id || next[c.left] != c.right) continue;
    id[c.left] = c.result;
    id[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push(prev[c.left], c.left);
    push(c.left, next[c.left]);
  }
  for (std::int32_t k = 0; k >= 0; k = next[k]) out.push_back(id[k]);
}

void Bpe::encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<std::uint8_t>(piece[0])]);
    return;
  }
  if (piece.size() > PieceCache::kMaxPieceBytes) {
    encode_piece_uncached(piece, out);
    return;
  }
  thread_local PieceCache cache;
  if (cache.owner != instance_id_) cache.reset(instance_id_);
  if (auto it = cache.map.find(piece); it != cache.map.end()) {
    const auto* p = cache.ids.data() + it->second.offset;
    out.insert(out.end(), p, p + it->second.length);
    return;
  }
  const std::size_t before = out.size();
  encode_piece_uncached(piece, out);
  if (cache.map.size() >= PieceCache::kMaxEntries) cache.reset(instance_id_);
  const auto offset = static_cast<std::uint32_t>(cache.ids.size());
  cache.ids.insert(cache.ids.end(), out.begin() + before, out.end());
  cache.map.emplace(std::string(piece), PieceCache::Entry{offset, static_cast<std::uint32_t>(out.size() - before)});
}

}  // namespace dsv4::text
