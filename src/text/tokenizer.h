#pragma once
// The DeepSeek-V4 tokenizer, loaded from a Hugging Face tokenizer.json (byte-level BPE + added tokens + the
// DeepSeek pre-tokenizer). encode() is exactly Hugging Face `tokenizers`' encode(text, add_special_tokens=False):
// added tokens are matched anywhere in the text and no BOS/EOS is added. Thread-safe: a loaded Tokenizer is
// immutable; per-thread caches live in thread_local storage.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::text {

using TokenId = std::int32_t;

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  static Tokenizer from_json(std::string_view tokenizer_json_text);

  // Throws dsv4::Error on invalid UTF-8 (there is no defined tokenization of it; HF cannot even receive it).
  std::vector<TokenId> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<TokenId>& out) const;

  // Concatenated token bytes, then UTF-8 with each invalid subpart replaced by U+FFFD (HF decode semantics).
  // skip_special drops added tokens flagged special. Throws dsv4::Error on an id outside the vocabulary.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // The raw bytes one token stands for (may be an incomplete UTF-8 sequence).
  std::string_view token_bytes(TokenId id) const;
  bool is_special(TokenId id) const;
  // Id of an added token's content, or of a vocabulary entry given as raw bytes.
  std::optional<TokenId> find_token(std::string_view text) const;
  // One past the largest id (129280 for DeepSeek-V4).
  TokenId vocab_size() const;
  std::size_t added_token_count() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace dsv4::text
