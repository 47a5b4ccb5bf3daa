#pragma once
// Added-token matching (CHAT_FORMAT.md §4.2): find occurrences of the added tokens' contents anywhere in the text,
// leftmost first and, at one start position, the longest — the Aho-Corasick "leftmost-longest" rule Hugging Face
// uses. A byte trie is enough: only positions whose byte can start a token are probed.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::text {

class AddedTokenMatcher {
 public:
  void add(std::string_view content, std::int32_t id);
  bool empty() const { return nodes_.size() <= 1; }

  struct Match {
    std::size_t begin, end;
    std::int32_t id;
  };
  // Next leftmost-longest match starting at or after `from`; returns false if there is none.
  bool next_match(std::string_view text, std::size_t from, Match& m) const;

 private:
  struct Node {
    std::int32_t id = -1;  // token ending here
    std::vector<std::pair<std::uint8_t, std::int32_t>> children;
  };
  std::int32_t child(std::int32_t node, std::uint8_t b) const;
  std::vector<Node> nodes_{Node{}};
  bool can_start_[256] = {};
};

}  // namespace dsv4::text
