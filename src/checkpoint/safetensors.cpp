// safetensors header parsing and validation. The parser treats its input as hostile: every length, offset and shape
// is checked before it is used, all arithmetic on them is overflow-checked, and every failure is a dsv4::Error
// whose message starts with the file label (and names the tensor when one is involved).
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4::ckpt {

namespace {

using nlohmann::json;

// The reference implementation refuses headers above ~100 MB; a real DeepSeek-V4 shard header is well under 1 MiB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// A valid header nests three levels (top object, entry object, shape array). Anything far deeper is garbage, and
// refusing it early keeps hostile inputs from building deep trees whose recursive handling could exhaust the stack.
constexpr int kMaxJsonDepth = 32;

uint64_t read_le_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// What the parse callback learns while nlohmann builds the DOM: the top-level key order (std::map-backed json
// loses it, and ordered_json has linear-time lookups that a hostile header could turn quadratic), duplicate keys
// (nlohmann silently keeps the last one), and excessive nesting.
struct ParseWatch {
  std::vector<std::string> order;
  std::unordered_set<std::string> top_keys;
  std::unordered_set<std::string> entry_keys;  // keys of the object under the most recent top-level key
  std::string current;                         // most recent top-level key
  std::string duplicate_error;                 // first duplicate found, as an error-message tail
  bool too_deep = false;
};

[[noreturn]] void fail_tensor(const std::string& label, const std::string& name, const std::string& what) {
  fail(label, ": tensor '", name, "': ", what);
}

json parse_json_watched(std::string_view text, ParseWatch& w) {
  auto cb = [&w](int depth, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // `depth` is the parent's level here; the new container sits one below it.
        if (depth + 1 > kMaxJsonDepth) {
          w.too_deep = true;
          return false;  // discard: nothing below this point is stored
        }
        return true;
      case json::parse_event_t::key: {
        if (!parsed.is_string()) return true;
        const std::string& k = parsed.get_ref<const std::string&>();
        if (depth == 1) {
          w.current = k;
          w.entry_keys.clear();
          if (!w.top_keys.insert(k).second) {
            if (w.duplicate_error.empty()) w.duplicate_error = "tensor '" + k + "': duplicate name in header";
          } else {
            w.order.push_back(k);
          }
        } else if (depth == 2) {
          if (!w.entry_keys.insert(k).second && w.duplicate_error.empty())
            w.duplicate_error = "tensor '" + w.current + "': duplicate key '" + k + "'";
        }
        return true;
      }
      default:
        return true;
    }
  };
  return json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
}

std::string json_kind(const json& v) {
  if (v.is_number_float()) return "a non-integer number";
  if (v.is_number_integer() && !v.is_number_unsigned()) return "a negative integer";
  return std::string("a ") + v.type_name();
}

std::vector<int64_t> parse_shape(const json& v, const std::string& label, const std::string& name) {
  if (!v.is_array()) fail_tensor(label, name, "\"shape\" must be an array, got " + json_kind(v));
  std::vector<int64_t> shape;
  shape.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& d = v[i];
    if (!d.is_number_unsigned())
      fail_tensor(label, name, "shape[" + std::to_string(i) + "] must be a non-negative integer, got " + json_kind(d));
    uint64_t u = d.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_tensor(label, name, "shape[" + std::to_string(i) + "] = " + std::to_string(u) + " is too large");
    shape.push_back(static_cast<int64_t>(u));
  }
  return shape;
}

HeaderEntry parse_entry(const std::string& name, const json& v, uint64_t data_size, const std::string& label) {
  if (!v.is_object()) fail_tensor(label, name, "entry must be an object, got " + json_kind(v));
  HeaderEntry e;
  e.name = name;

  auto dt = v.find("dtype");
  if (dt == v.end()) fail_tensor(label, name, "missing \"dtype\"");
  if (!dt->is_string()) fail_tensor(label, name, "\"dtype\" must be a string, got " + json_kind(*dt));
  const std::string& dts = dt->get_ref<const std::string&>();
  auto parsed = parse_dtype(dts);
  if (!parsed) fail_tensor(label, name, "unknown dtype \"" + dts + "\"");
  e.dtype = *parsed;

  auto sh = v.find("shape");
  if (sh == v.end()) fail_tensor(label, name, "missing \"shape\"");
  e.shape = parse_shape(*sh, label, name);

  auto off = v.find("data_offsets");
  if (off == v.end()) fail_tensor(label, name, "missing \"data_offsets\"");
  if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
    fail_tensor(label, name, "\"data_offsets\" must be [begin, end] of two non-negative integers");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.begin > e.end)
    fail_tensor(label, name, "data_offsets begin " + std::to_string(e.begin) + " > end " + std::to_string(e.end));
  if (e.end > data_size)
    fail_tensor(label, name, "data_offsets end " + std::to_string(e.end) + " is past the end of the data section (" +
                                 std::to_string(data_size) + " bytes; file truncated?)");

  // product(shape) * itemsize, refusing any intermediate overflow so that a huge shape cannot wrap around to a
  // size that happens to match the offsets.
  uint64_t bytes = dtype_size(e.dtype);
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
      fail_tensor(label, name, "shape element count overflows");
  }
  if (bytes != e.end - e.begin)
    fail_tensor(label, name, "size mismatch: shape and dtype " + std::string(dtype_name(e.dtype)) + " need " +
                                 std::to_string(bytes) + " bytes but data_offsets span " +
                                 std::to_string(e.end - e.begin));
  return e;
}

}  // namespace

ParsedHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& label) {
  if (data == nullptr || size < 8)
    fail(label, ": file too small for a safetensors header (", size, " bytes, need at least 8)");
  const uint64_t n = read_le_u64(data);
  if (n > kMaxHeaderBytes) fail(label, ": header length ", n, " exceeds the ", kMaxHeaderBytes, "-byte limit");
  if (n > size - 8) fail(label, ": header length ", n, " runs past the end of the file (", size, " bytes)");

  ParsedHeader out;
  out.data_offset = 8 + n;
  const uint64_t data_size = size - out.data_offset;

  ParseWatch watch;
  json root = parse_json_watched(std::string_view(reinterpret_cast<const char*>(data + 8), n), watch);
  if (watch.too_deep) fail(label, ": header JSON nests deeper than ", kMaxJsonDepth, " levels");
  if (root.is_discarded()) fail(label, ": header is not well-formed JSON");
  if (!root.is_object()) fail(label, ": header must be a JSON object, got ", json_kind(root));
  if (!watch.duplicate_error.empty()) fail(label, ": ", watch.duplicate_error);

  out.tensors.reserve(watch.order.size());
  for (const std::string& key : watch.order) {
    auto it = root.find(key);
    if (it == root.end()) continue;  // cannot happen: every recorded key is in the object
    if (key == "__metadata__") {
      if (!it->is_object()) fail(label, ": \"__metadata__\" must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail(label, ": \"__metadata__\" value for key '", m.key(), "' is not a string");
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    out.tensors.push_back(parse_entry(key, *it, data_size, label));
  }

  // Overlap check: sort the non-empty ranges by begin; each must end at or before the next one starts. Empty
  // tensors hold no bytes, so they cannot alias anything.
  std::vector<const HeaderEntry*> ranges;
  ranges.reserve(out.tensors.size());
  for (const auto& e : out.tensors)
    if (e.end > e.begin) ranges.push_back(&e);
  std::sort(ranges.begin(), ranges.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const HeaderEntry* a = ranges[i - 1];
    const HeaderEntry* b = ranges[i];
    if (a->end > b->begin)
      fail(label, ": tensor '", b->name, "' [", b->begin, ", ", b->end, ") overlaps tensor '", a->name, "' [",
           a->begin, ", ", a->end, ")");
  }
  return out;
}

int64_t TensorView::numel() const {
  // Cannot overflow: the parser proved product(shape) * itemsize fits in 64 bits.
  int64_t n = 1;
  for (int64_t d : entry->shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  header_ = parse_safetensors_header(file_.data(), file_.size(), path);
}

TensorView SafetensorsFile::view(size_t i) const {
  if (i >= header_.tensors.size())
    fail(path(), ": tensor index ", i, " out of range (", header_.tensors.size(), " tensors)");
  const HeaderEntry& e = header_.tensors[i];
  TensorView v;
  v.entry = &e;
  v.data = file_.data() + header_.data_offset + e.begin;
  v.file = &file_.path();
  return v;
}

namespace {

namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";

std::string read_text_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(p.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(p.string(), ": read error");
  return ss.str();
}

// A shard name from the index must stay inside the checkpoint directory.
bool safe_shard_name(const std::string& s) {
  if (s.empty()) return false;
  fs::path p(s);
  if (p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == "..") return false;
  return true;
}

// weight_map: tensor -> shard file name, as declared by the index.
std::map<std::string, std::string> read_index(const fs::path& index_path) {
  const std::string label = index_path.string();
  json root = json::parse(read_text_file(index_path), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) fail(label, ": not well-formed JSON");
  if (!root.is_object()) fail(label, ": must be a JSON object");
  auto wm = root.find("weight_map");
  if (wm == root.end() || !wm->is_object()) fail(label, ": missing \"weight_map\" object");
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) fail(label, ": tensor '", it.key(), "': weight_map value must be a shard file name");
    const std::string& shard = it->get_ref<const std::string&>();
    if (!safe_shard_name(shard)) fail(label, ": tensor '", it.key(), "': invalid shard name '", shard, "'");
    out[it.key()] = shard;
  }
  return out;
}

}  // namespace

Checkpoint Checkpoint::in_memory(const std::string& label, const std::vector<HeaderEntry>& entries,
                                 const std::vector<const uint8_t*>& data) {
  if (entries.size() != data.size()) fail(label, ": ", entries.size(), " entries but ", data.size(), " data pointers");
  Checkpoint ck;
  ck.dir_ = label;
  ck.mem_label_ = std::make_shared<std::string>(label);
  ck.mem_entries_ = std::make_shared<std::vector<HeaderEntry>>(entries);
  for (size_t i = 0; i < entries.size(); ++i) {
    const HeaderEntry& e = (*ck.mem_entries_)[i];
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) fail(label, ": tensor '", e.name, "' has a negative dim");
      numel *= static_cast<uint64_t>(d);
    }
    if (e.end - e.begin != numel * dtype_size(e.dtype))
      fail(label, ": tensor '", e.name, "' holds ", e.end - e.begin, " bytes, its dtype and shape need ", numel * dtype_size(e.dtype));
    if (!data[i]) fail(label, ": tensor '", e.name, "' has no data");
    if (!ck.index_.emplace(e.name, TensorView{&e, data[i], ck.mem_label_.get()}).second)
      fail(label, ": duplicate tensor '", e.name, "'");
  }
  return ck;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  std::error_code ec;
  const fs::path root(dir);
  if (!fs::is_directory(root, ec)) fail(dir, ": not a checkpoint directory");

  const fs::path index_path = root / kIndexName;
  const bool has_index = fs::exists(index_path, ec);
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shard_names;
  if (has_index) {
    weight_map = read_index(index_path);
    std::set<std::string> uniq;
    for (const auto& [tensor, shard] : weight_map) {
      if (uniq.insert(shard).second) {
        if (!fs::is_regular_file(root / shard, ec))
          fail(index_path.string(), ": tensor '", tensor, "': shard '", shard, "' does not exist in ", dir);
      }
    }
    shard_names.assign(uniq.begin(), uniq.end());
  } else {
    fs::directory_iterator it(root, ec), end;
    if (ec) fail(dir, ": cannot list directory: ", ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) fail(dir, ": cannot list directory: ", ec.message());
      const fs::path& p = it->path();
      if (p.extension() == ".safetensors" && it->is_regular_file(ec)) shard_names.push_back(p.filename().string());
    }
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) fail(dir, ": no ", kIndexName, " and no *.safetensors files");
  }

  // Tensor names must be unique across shards: the index (or the caller) could not tell which copy is meant.
  std::map<std::string, size_t> file_of;  // shard name -> position in files_
  for (const std::string& shard : shard_names) {
    ck.files_.push_back(std::make_unique<SafetensorsFile>((root / shard).string()));
    const SafetensorsFile& f = *ck.files_.back();
    file_of[shard] = ck.files_.size() - 1;
    for (size_t i = 0; i < f.header().tensors.size(); ++i) {
      TensorView v = f.view(i);
      auto [pos, inserted] = ck.index_.emplace(v.name(), v);
      if (!inserted)
        fail(f.path(), ": tensor '", v.name(), "' is also in ", *pos->second.file, " (names must be unique across shards)");
    }
  }

  // Every tensor the index names must be in the shard it names.
  for (const auto& [tensor, shard] : weight_map) {
    auto it = ck.index_.find(tensor);
    const std::string& expect = ck.files_[file_of.at(shard)]->path();
    if (it == ck.index_.end())
      fail(index_path.string(), ": tensor '", tensor, "' is listed for shard '", shard, "' but no shard holds it");
    if (*it->second.file != expect)
      fail(index_path.string(), ": tensor '", tensor, "' is listed for shard '", shard, "' but is in ",
           *it->second.file);
  }
  return ck;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &it->second;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  const TensorView* v = find(name);
  if (!v) fail(dir_, ": tensor '", name, "' not found in checkpoint");
  return *v;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& kv : index_) out.push_back(kv.first);
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& kv : index_) total += kv.second.nbytes();
  return total;
}

}  // namespace dsv4::ckpt
