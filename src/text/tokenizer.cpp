#include "text/tokenizer.h"

#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace dsv4::text {

struct Tokenizer::Impl {
  std::vector<std::string> bytes_of;   // id -> decoded bytes
  std::vector<std::uint8_t> present;   // id -> 1 if the id names a token
  std::vector<std::uint8_t> special;   // id -> 1 if an added token flagged special
  std::unordered_map<std::string, TokenId> raw_vocab;  // raw bytes -> id (BPE vocabulary)
  std::unordered_map<std::string, TokenId> added_by_content;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized=false (matched first, on the raw text)
  AddedTokenMatcher normalized_matcher;  // normalized=true (matched on what the first pass left)
  std::unique_ptr<Bpe> bpe;

  void encode_plain(std::string_view text, std::vector<TokenId>& out) const;
  void encode_normalized_pass(std::string_view text, std::vector<TokenId>& out) const;
};

namespace {

void check_model_config(const nlohmann::json& j) {
  auto expect_null = [&](const nlohmann::json& obj, const char* key) {
    if (obj.contains(key) && !obj[key].is_null()) fail("unsupported tokenizer.json: model.", key, " must be null");
  };
  const auto& m = j.at("model");
  if (m.value("type", "") != "BPE") fail("unsupported tokenizer.json: model.type must be BPE");
  expect_null(m, "dropout");
  expect_null(m, "continuing_subword_prefix");
  expect_null(m, "end_of_word_suffix");
  if (m.value("byte_fallback", false)) fail("unsupported tokenizer.json: byte_fallback");
  if (m.value("ignore_merges", false)) fail("unsupported tokenizer.json: ignore_merges");
  // The normalizer must be a no-op: added-token matching and the pre-tokenizer both work on the raw text.
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const auto& n = j["normalizer"];
    if (!(n.value("type", "") == "Sequence" && n.contains("normalizers") && n["normalizers"].empty()))
      fail("unsupported tokenizer.json: non-empty normalizer ", n.dump());
  }
  if (j.contains("decoder") && !j["decoder"].is_null() && j["decoder"].value("type", "") != "ByteLevel")
    fail("unsupported tokenizer.json: decoder must be ByteLevel");
  check_pretokenizer_config(j.at("pre_tokenizer"));
}

std::pair<std::string, std::string> split_merge(const nlohmann::json& m) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const auto sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) fail("bad merge line '", s, "'");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  fail("bad merge entry ", m.dump());
}

std::shared_ptr<Tokenizer::Impl> build(const nlohmann::json& j) {
  check_model_config(j);
  auto impl = std::make_shared<Tokenizer::Impl>();
  const auto& model = j.at("model");
  std::unordered_map<std::string, TokenId> vocab;  // byte-level string -> id
  TokenId max_id = -1;
  for (const auto& [tok, idj] : model.at("vocab").items()) {
    const auto id = idj.get<TokenId>();
    if (id < 0) fail("negative token id in vocab");
    vocab.emplace(tok, id);
    max_id = std::max(max_id, id);
  }
  const auto& added = j.contains("added_tokens") ? j["added_tokens"] : nlohmann::json::array();
  for (const auto& a : added) max_id = std::max(max_id, a.at("id").get<TokenId>());
  if (max_id < 0) fail("empty vocabulary");
  impl->bytes_of.resize(max_id + 1);
  impl->present.assign(max_id + 1, 0);
  impl->special.assign(max_id + 1, 0);
  for (const auto& [tok, id] : vocab) {
    impl->bytes_of[id] = token_string_to_bytes(tok);
    impl->present[id] = 1;
    if (auto raw = byte_level_to_bytes(tok)) impl->raw_vocab.emplace(*raw, id);
  }
  std::int32_t byte_ids[256];
  for (int b = 0; b < 256; ++b) {
    auto it = impl->raw_vocab.find(std::string(1, static_cast<char>(b)));
    if (it == impl->raw_vocab.end()) fail("vocabulary lacks the single-byte token for byte ", b);
    byte_ids[b] = it->second;
  }
  std::vector<Bpe::Merge> merges;
  merges.reserve(model.at("merges").size());
  for (const auto& mj : model["merges"]) {
    auto [a, b] = split_merge(mj);
    auto ia = vocab.find(a), ib = vocab.find(b), ir = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || ir == vocab.end())
      fail("merge '", a, " ", b, "' refers to a token missing from the vocabulary");
    merges.push_back(Bpe::Merge{ia->second, ib->second, ir->second});
  }
  impl->bpe = std::make_unique<Bpe>(byte_ids, merges);
  for (const auto& a : added) {
    const auto id = a.at("id").get<TokenId>();
    const auto content = a.at("content").get<std::string>();
    if (find_invalid_utf8(content) != std::string::npos) fail("added token ", id, " is not valid UTF-8");
    // lstrip/rstrip/single_word change matching; DeepSeek uses none of them, so refuse rather than mis-tokenize.
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
      fail("unsupported added token flags (lstrip/rstrip/single_word) on '", content, "'");
    impl->bytes_of[id] = token_string_to_bytes(content);
    impl->present[id] = 1;
    impl->special[id] = a.value("special", false) ? 1 : 0;
    impl->added_by_content.emplace(content, id);
    (a.value("normalized", false) ? impl->normalized_matcher : impl->raw_matcher).add(content, id);
  }
  return impl;
}

}  // namespace

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<TokenId>& out) const {
  thread_local std::vector<Piece> pieces;
  pieces.clear();
  pretokenize(text, pieces);
  for (const Piece& p : pieces) bpe->encode_piece(text.substr(p.begin, p.end - p.begin), out);
}

void Tokenizer::Impl::encode_normalized_pass(std::string_view text, std::vector<TokenId>& out) const {
  std::size_t pos = 0;
  AddedTokenMatcher::Match m;
  while (normalized_matcher.next_match(text, pos, m)) {
    encode_plain(text.substr(pos, m.begin - pos), out);
    out.push_back(m.id);
    pos = m.end;
  }
  encode_plain(text.substr(pos), out);
}

Tokenizer Tokenizer::from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer.json: ", e.what());
  }
  try {
    return Tokenizer(build(j));
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer.json: unexpected structure: ", e.what());
  }
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open tokenizer file '", path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  try {
    return from_json(ss.str());
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

void Tokenizer::encode_append(std::string_view text, std::vector<TokenId>& out) const {
  if (text.size() >= std::numeric_limits<std::uint32_t>::max()) fail("encode: text larger than 4 GiB");
  if (const auto bad = find_invalid_utf8(text); bad != std::string_view::npos)
    fail("encode: invalid UTF-8 at byte ", bad);
  // Two passes like Hugging Face: tokens with normalized=false on the raw text, then normalized=true ones on the
  // gaps (the normalizer is empty, so the gaps are used as they are).
  std::size_t pos = 0;
  AddedTokenMatcher::Match m;
  while (impl_->raw_matcher.next_match(text, pos, m)) {
    impl_->encode_normalized_pass(text.substr(pos, m.begin - pos), out);
    out.push_back(m.id);
    pos = m.end;
  }
  impl_->encode_normalized_pass(text.substr(pos), out);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, out);
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  for (TokenId id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return utf8_lossy(bytes);
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || id >= vocab_size() || !impl_->present[id]) fail("token id ", id, " is not in the vocabulary");
  return impl_->bytes_of[id];
}

bool Tokenizer::is_special(TokenId id) const {
  if (id < 0 || id >= vocab_size() || !impl_->present[id]) fail("token id ", id, " is not in the vocabulary");
  return impl_->special[id] != 0;
}

std::optional<TokenId> Tokenizer::find_token(std::string_view text) const {
  if (auto it = impl_->added_by_content.find(std::string(text)); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->raw_vocab.find(std::string(text)); it != impl_->raw_vocab.end()) return it->second;
  return std::nullopt;
}

TokenId Tokenizer::vocab_size() const { return static_cast<TokenId>(impl_->bytes_of.size()); }
std::size_t Tokenizer::added_token_count() const { return impl_->added_by_content.size(); }

}  // namespace dsv4::text
