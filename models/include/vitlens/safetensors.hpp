#pragma once
// safetensors files (https://huggingface.co/docs/safetensors): 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str:
// str}}, then raw little-endian C-order data. vitlens reads F32, F16, BF16 and F64 (converted
// to float) and writes F32.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vitlens {

struct TensorData {
  std::vector<int64_t> shape;
  std::vector<float> values;  // C order, product(shape) values
  std::string source_dtype = "F32";  // as stored in the file
  size_t numel() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // __metadata__
  std::map<std::string, TensorData> tensors;
};

// Largest model file vitlens reads (checked before reading): above ViT-G/14's 1.84 billion
// parameters in F32 (7.4 GB). The file is read once; its tensors are then converted to float.
constexpr uint64_t kMaxModelFileBytes = uint64_t{8} << 30;

// Throws vitlens::Error with a one-line message naming the file and the tensor or field on any
// malformed input: truncated file, header length past the end, header not JSON or not an object,
// bad dtype/shape/data_offsets (out of range, overlapping, size not matching dtype * shape).
SafetensorsFile read_safetensors(const std::string& path);
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& what);

std::string safetensors_bytes(const SafetensorsFile& file);  // F32 data, names sorted
void write_safetensors(const std::string& path, const SafetensorsFile& file);  // atomic

// "[3, 48, 4, 4]", for messages about a tensor's shape.
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace vitlens
