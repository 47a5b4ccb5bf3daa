#pragma once
// The DeepSeek-V3/V4 pre-tokenizer: three regex splits with "Isolated" behaviour, applied in sequence
// (CHAT_FORMAT.md §4.4), implemented by hand on code-point classes instead of with a regex engine. Each
// alternative of the third regex is reproduced with Oniguruma's leftmost-first, greedy-with-backtracking
// semantics; tests/scripts/text_parity.sh checks the result against Hugging Face `tokenizers` on a large corpus.
#include <cstdint>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv4::text {

struct Piece {
  std::uint32_t begin, end;  // byte offsets into the text given to pretokenize()
};

// Throws dsv4::Error unless `pre_tokenizer` (the tokenizer.json field) is exactly the pipeline implemented here;
// a different model's pre-tokenizer must fail loudly, never be approximated.
void check_pretokenizer_config(const nlohmann::json& pre_tokenizer);

// Appends the pieces of `text` (valid UTF-8, no added tokens inside) to `out`, in order, covering all of it.
void pretokenize(std::string_view text, std::vector<Piece>& out);

}  // namespace dsv4::text
