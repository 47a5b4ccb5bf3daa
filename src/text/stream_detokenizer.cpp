#include "text/stream_detokenizer.h"

#include "text/utf8.h"

namespace dsv4::text {

std::string StreamDetokenizer::push(TokenId id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_bytes(id);
  const std::size_t n = utf8_stable_prefix_len(pending_);
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDetokenizer::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv4::text
