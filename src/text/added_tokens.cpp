#include "text/added_tokens.h"

#include <cstring>

#include "core/error.h"

namespace dsv4::text {

std::int32_t AddedTokenMatcher::child(std::int32_t node, std::uint8_t b) const {
  for (const auto& [byte, next] : nodes_[node].children)
    if (byte == b) return next;
  return -1;
}

void AddedTokenMatcher::add(std::string_view content, std::int32_t id) {
  if (content.empty()) fail("added token ", id, " has empty content");
  std::int32_t node = 0;
  for (char ch : content) {
    const auto b = static_cast<std::uint8_t>(ch);
    std::int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<std::int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      nodes_[node].children.emplace_back(b, next);
    }
    node = next;
  }
  // Two added tokens with the same content: the first one listed keeps the string (Hugging Face's token->id map
  // keeps the first insertion as well).
  if (nodes_[node].id < 0) nodes_[node].id = id;
  can_start_[static_cast<std::uint8_t>(content[0])] = true;
}

bool AddedTokenMatcher::next_match(std::string_view text, std::size_t from, Match& m) const {
  const auto* data = reinterpret_cast<const std::uint8_t*>(text.data());
  for (std::size_t i = from; i < text.size(); ++i) {
    if (!can_start_[data[i]]) continue;
    std::int32_t node = 0, best_id = -1;
    std::size_t best_end = 0;
    for (std::size_t j = i; j < text.size(); ++j) {
      node = child(node, data[j]);
      if (node < 0) break;
      if (nodes_[node].id >= 0) {
        best_id = nodes_[node].id;
        best_end = j + 1;
      }
    }
    if (best_id >= 0) {
      m = Match{i, best_end, best_id};
      return true;
    }
  }
  return false;
}

}  // namespace dsv4::text
