#pragma once
// safetensors reading: header parsing with full validation, mmapped zero-copy tensor views, and sharded checkpoints
// (model.safetensors.index.json). Every violation throws dsv4::Error naming the file and, where known, the tensor.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/dtype.h"
#include "core/mapped_file.h"

namespace dsv4::ckpt {

struct HeaderEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets relative to the start of the data section
  uint64_t end = 0;
};

struct ParsedHeader {
  std::vector<HeaderEntry> tensors;           // in header order
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
  uint64_t data_offset = 0;                   // 8 + header length
};

// Parses and validates the header of a safetensors file held in [data, data+size). Checks: size >= 8, header length
// sane (<= 100 MiB and within the file), JSON well-formed, each entry has a known dtype, a shape of non-negative
// ints, data_offsets [begin, end] with begin <= end inside the data section, product(shape)*itemsize == end-begin,
// no two tensors overlapping, no duplicate names. `label` (usually the path) prefixes every error message.
// Pure function of its input; this is what the fuzz target drives.
ParsedHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& label);

// A zero-copy view of one tensor inside a mapped file.
struct TensorView {
  const HeaderEntry* entry = nullptr;
  const uint8_t* data = nullptr;
  const std::string* file = nullptr;  // path of the shard holding it

  const std::string& name() const { return entry->name; }
  DType dtype() const { return entry->dtype; }
  const std::vector<int64_t>& shape() const { return entry->shape; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(entry->end - entry->begin); }
  int64_t dim(int i) const { return entry->shape.at(static_cast<size_t>(i)); }
  int ndim() const { return static_cast<int>(entry->shape.size()); }
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // mmaps and validates
  const std::string& path() const { return file_.path(); }
  const ParsedHeader& header() const { return header_; }
  size_t file_size() const { return file_.size(); }
  TensorView view(size_t i) const;

 private:
  MappedFile file_;
  ParsedHeader header_;
};

// A checkpoint directory: either model.safetensors.index.json (weight_map: tensor -> shard file), or, without an
// index, every *.safetensors file in the directory. Tensor names must be unique across shards; an index that names
// a tensor its shard does not hold (or a missing shard) is an error.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);
  // Tensors that live in memory (synthetic benchmark weights): each entry's data pointer must outlive the checkpoint;
  // `label` names it in error messages. Sizes are checked against dtype x shape as for files.
  static Checkpoint in_memory(const std::string& label, const std::vector<HeaderEntry>& entries,
                              const std::vector<const uint8_t*>& data);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const TensorView* find(const std::string& name) const;  // nullptr if absent
  const TensorView& get(const std::string& name) const;   // throws naming the tensor if absent
  std::vector<std::string> names() const;                 // sorted
  size_t tensor_count() const { return index_.size(); }
  uint64_t total_tensor_bytes() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, TensorView> index_;
  std::shared_ptr<std::vector<HeaderEntry>> mem_entries_;  // in_memory(): the entries the views point to
  std::shared_ptr<std::string> mem_label_;
};

}  // namespace dsv4::ckpt
