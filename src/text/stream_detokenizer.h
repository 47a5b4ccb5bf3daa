#pragma once
// Incremental detokenizer for streaming (CHAT_FORMAT.md §3.5): token bytes accumulate in a buffer and only text that
// can no longer change is returned — a trailing, still-incomplete UTF-8 sequence (<= 3 bytes) is held back. The
// concatenation of every push() plus finish() equals Tokenizer::decode() of all ids.
#include <string>

#include "text/tokenizer.h"

namespace dsv4::text {

class StreamDetokenizer {
 public:
  explicit StreamDetokenizer(const Tokenizer& tok, bool skip_special = false) : tok_(tok), skip_special_(skip_special) {}

  // Text that became final with this token (often empty while a multi-byte character is incomplete).
  std::string push(TokenId id);
  // Whatever is held back, decoded lossily (an incomplete tail becomes U+FFFD). Resets the stream.
  std::string finish();
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsv4::text
