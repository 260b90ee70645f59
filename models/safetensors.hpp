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

using TensorMap = std::map<std::string, TensorData>;  // by tensor name, sorted

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // __metadata__
  TensorMap tensors;
};

// Largest model file vitlens reads (checked before reading): above ViT-G/14's 1.84 billion
// parameters in F32 (7.4 GB). The file is read tensor by tensor into each tensor's floats.
constexpr uint64_t kMaxModelFileBytes = uint64_t{8} << 30;

// The largest header vitlens reads, as safetensors' own reader (its MAX_HEADER_SIZE): a real
// model's header is a few hundred KB.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100000000;

// Throws vitlens::Error with a one-line message naming the file and the tensor or field on any
// malformed input: truncated file, header length past the end or above kMaxSafetensorsHeaderBytes,
// a header that is not exactly a JSON object padded with spaces (so a wrong header length is
// refused, not read as data), a key twice in one object, an unknown field, bad
// dtype/shape/data_offsets (out of range, size not matching dtype * shape, tensors not packed
// back to back up to the end of the file). The header is read without building a JSON DOM, so
// its cost stays near its own size.
SafetensorsFile read_safetensors(const std::string& path);
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& what);

// Only the header's __metadata__, reading only the header (checked as above, except the tensors'
// offsets against the data): a folder of large models can be listed by their configs.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

std::string safetensors_bytes(const SafetensorsFile& file);  // F32 data, names sorted
void write_safetensors(const std::string& path, const SafetensorsFile& file);  // atomic

// "[3, 48, 4, 4]", for messages about a tensor's shape.
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace vitlens
