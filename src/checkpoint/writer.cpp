// safetensors writer. Output is what the reference implementation writes: 8-byte little-endian header length, a JSON
// header padded with spaces to a multiple of 8, then the tensors back to back (no holes, which strict readers
// such as the Python safetensors package refuse).
#include "checkpoint/writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4::ckpt {

namespace {

namespace fs = std::filesystem;

// numel * itemsize, or fails naming the tensor when the shape is negative or the count overflows.
uint64_t expected_bytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  uint64_t bytes = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) fail("safetensors writer: tensor '", name, "': negative dimension ", d);
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
      fail("safetensors writer: tensor '", name, "': element count overflows");
  }
  return bytes;
}

// On failure the partial temporary file is removed, so that nothing half-written is left behind.
void write_all(std::FILE* f, const void* p, size_t n, const std::string& tmp, const std::string& path) {
  if (n != 0 && std::fwrite(p, 1, n, f) != n) {
    const int e = errno;
    std::fclose(f);
    std::remove(tmp.c_str());
    fail(path, ": write failed: ", std::strerror(e));
  }
}

std::string shard_name(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n);
  return buf;
}

}  // namespace

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  // "__metadata__" is the header's reserved key; a tensor by that name could not be read back.
  if (name.empty() || name == "__metadata__") fail("safetensors writer: invalid tensor name '", name, "'");
  if (has(name)) fail("safetensors writer: tensor '", name, "' added twice");
  tensors_.push_back(Item{name, dtype, std::move(shape), std::move(bytes)});
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  // safetensors is little-endian, as is every host dsv4 targets (x86-64, aarch64 LE), so the bytes copy as-is.
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  add(name, DType::F32, std::move(shape), std::move(bytes));
}

bool SafetensorsWriter::has(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return true;
  return false;
}

void SafetensorsWriter::write_items(const std::string& path, const std::vector<const Item*>& items,
                                    const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps tensors in insertion order in the header, matching their order in the data section.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header["__metadata__"] = std::move(md);
  }
  uint64_t offset = 0;
  for (const Item* t : items) {
    const uint64_t need = expected_bytes(t->name, t->dtype, t->shape);
    if (need != t->bytes.size())
      fail(path, ": tensor '", t->name, "': ", t->bytes.size(), " bytes given, shape and dtype ",
           dtype_name(t->dtype), " need ", need);
    header[t->name] = {{"dtype", std::string(dtype_name(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + need}}};
    offset += need;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {  // dump() refuses strings that are not valid UTF-8
    fail(path, ": tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  // Write to a temporary name and rename, so an interrupted write never leaves a truncated file under `path`.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(path, ": cannot open for writing: ", std::strerror(errno));
  write_all(f, len, sizeof len, tmp, path);
  write_all(f, text.data(), text.size(), tmp, path);
  for (const Item* t : items) write_all(f, t->bytes.data(), t->bytes.size(), tmp, path);
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    fail(path, ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail(path, ": cannot rename from ", tmp, ": ", ec.message());
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<const Item*> items;
  items.reserve(tensors_.size());
  for (const auto& t : tensors_) items.push_back(&t);
  write_items(path, items, metadata_);
}

void SafetensorsWriter::write_sharded(const std::string& dir, int shards) const {
  if (shards < 1) fail(dir, ": shard count must be at least 1, got ", shards);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, ": cannot create directory: ", ec.message());

  // Greedy balance: each tensor (in insertion order) goes to the shard holding the fewest bytes so far (ties to the
  // lowest index), which spreads small tensors round-robin and keeps the shards close in size.
  std::vector<std::vector<const Item*>> parts(static_cast<size_t>(shards));
  std::vector<uint64_t> load(static_cast<size_t>(shards), 0);
  uint64_t total = 0;
  for (const auto& t : tensors_) {
    size_t best = 0;
    for (size_t s = 1; s < load.size(); ++s)
      if (load[s] < load[best]) best = s;
    parts[best].push_back(&t);
    load[best] += t.bytes.size();
    total += t.bytes.size();
  }

  nlohmann::json weight_map = nlohmann::json::object();
  for (int s = 0; s < shards; ++s) {
    const std::string name = shard_name(s, shards);
    write_items((fs::path(dir) / name).string(), parts[static_cast<size_t>(s)], metadata_);
    for (const Item* t : parts[static_cast<size_t>(s)]) weight_map[t->name] = name;
  }
  // total_size is written after the shards, whose writes have checked each tensor's byte count against its shape.
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::ofstream out(index_path, std::ios::binary | std::ios::trunc);
  if (!out) fail(index_path, ": cannot open for writing");
  out << index.dump(2) << '\n';
  out.close();
  if (!out) fail(index_path, ": write failed");
}

}  // namespace dsv4::ckpt
