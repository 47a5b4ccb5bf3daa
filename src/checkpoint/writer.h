#pragma once
// A small safetensors writer (used by tests, fixtures and `dsv4 make-tiny`). Tensors are written in insertion
// order; the header is padded with spaces to a multiple of 8 bytes as the reference implementation does.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/dtype.h"

namespace dsv4::ckpt {

class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  bool has(const std::string& name) const;
  size_t size() const { return tensors_.size(); }
  // Writes one file. Throws dsv4::Error on I/O failure or if bytes.size() != numel*itemsize for some tensor.
  void write(const std::string& path) const;
  // Writes `shards` files model-0000i-of-0000N.safetensors (tensors split round-robin by byte size) and
  // model.safetensors.index.json into dir.
  void write_sharded(const std::string& dir, int shards) const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  static void write_items(const std::string& path, const std::vector<const Item*>& items,
                          const std::map<std::string, std::string>& metadata);
  std::vector<Item> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dsv4::ckpt
