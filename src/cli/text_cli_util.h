#pragma once
// Helpers shared by the text subcommands (tokenize, detokenize, render, parse).
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace dsv4::cli {

// Whole file as bytes; throws dsv4::Error if it cannot be read.
std::string read_file_bytes(const std::string& path);
// "1,2,3", "1, 2, 3" or "[1,2,3]"; an empty list is allowed. Throws dsv4::Error on anything else.
std::vector<text::TokenId> parse_id_list(const std::string& s);
// Writes bytes to stdout exactly (no newline added); throws dsv4::Error on a write failure.
void write_stdout(const std::string& bytes);
// "[1,2,3]"
std::string ids_to_json(const std::vector<text::TokenId>& ids);

}  // namespace dsv4::cli
