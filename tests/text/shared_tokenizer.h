#pragma once
// The real tokenizer, loaded once per test binary (loading parses 6 MB of JSON).
#include "test_paths.h"
#include "text/tokenizer.h"

namespace dsv4::text::testing {

inline const Tokenizer& v4_tokenizer() {
  static const Tokenizer tok = Tokenizer::from_file(tokenizer_path());
  return tok;
}

}  // namespace dsv4::text::testing
