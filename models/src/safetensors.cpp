// safetensors reading and writing, with every malformed case turned into a one-line error.
#include "vitlens/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "vitlens/error.hpp"
#include "vitlens/files.hpp"
#include "vitlens/image.hpp"

namespace vitlens {

size_t TensorData::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

namespace {

using nlohmann::json;

int dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "F64") return 8;
  return 0;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;  // +-0
    } else {  // subnormal: renormalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf / nan
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct Span {
  uint64_t begin, end;
  std::string name;
};

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& what) {
  const auto* raw = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 8)
    throw Error(what + ": not a safetensors file: " + std::to_string(bytes.size()) +
                " bytes, shorter than the 8-byte header length");
  const uint64_t header_len = read_le64(raw);
  if (header_len > bytes.size() - 8)
    throw Error(what + ": not a safetensors file: header length " + std::to_string(header_len) +
                " runs past the end of the file (" + std::to_string(bytes.size()) + " bytes)");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const json::exception&) {
    throw Error(what + ": safetensors header is not valid JSON");
  }
  if (!header.is_object()) throw Error(what + ": safetensors header is not a JSON object");

  SafetensorsFile file;
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = bytes.size() - data_start;
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error(what + ": __metadata__ is not a JSON object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) throw Error(what + ": __metadata__ value '" + m.key() + "' is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = what + ": tensor '" + name + "'";
    if (!entry.is_object()) throw Error(where + " entry is not a JSON object");
    if (!entry.contains("dtype")) throw Error(where + " has no dtype");
    if (!entry["dtype"].is_string()) throw Error(where + " has a dtype that is not a string");
    if (!entry.contains("shape") || !entry["shape"].is_array()) throw Error(where + " has no shape array");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
      throw Error(where + " has no data_offsets [begin, end]");
    const std::string dtype = entry["dtype"].get<std::string>();
    const int elem = dtype_size(dtype);
    if (elem == 0) throw Error(where + " has dtype '" + dtype + "'; vitlens reads F32, F16, BF16 and F64");
    TensorData tensor;
    tensor.source_dtype = dtype;
    uint64_t numel = 1;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw Error(where + " has a shape entry that is not a non-negative integer");
      const auto dim = d.get<int64_t>();
      if (dim > 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / static_cast<uint64_t>(dim))
        throw Error(where + " has a shape too large for this machine");
      numel *= static_cast<uint64_t>(dim);
      tensor.shape.push_back(dim);
    }
    const json& off = entry["data_offsets"];
    if (!off[0].is_number_integer() || !off[1].is_number_integer() || off[0].get<int64_t>() < 0 ||
        off[1].get<int64_t>() < off[0].get<int64_t>())
      throw Error(where + " has data_offsets that are not 0 <= begin <= end");
    const auto begin = static_cast<uint64_t>(off[0].get<int64_t>());
    const auto end = static_cast<uint64_t>(off[1].get<int64_t>());
    if (end > data_size)
      throw Error(where + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] run past the end of the data (" + std::to_string(data_size) + " bytes): file truncated?");
    if (end - begin != numel * static_cast<uint64_t>(elem))
      throw Error(where + " data_offsets span " + std::to_string(end - begin) + " bytes, but " + dtype + " shape needs " +
                  std::to_string(numel * static_cast<uint64_t>(elem)));
    spans.push_back({begin, end, name});
    tensor.values.resize(numel);
    const unsigned char* src = raw + data_start + begin;
    if (numel == 0) {
      // nothing to copy (and memcpy from a null pointer is undefined)
    } else if (dtype == "F32") {
      std::memcpy(tensor.values.data(), src, numel * 4);
    } else if (dtype == "F64") {
      for (size_t i = 0; i < numel; ++i) {
        double v;
        std::memcpy(&v, src + 8 * i, 8);
        tensor.values[i] = static_cast<float>(v);
      }
    } else if (dtype == "F16") {
      for (size_t i = 0; i < numel; ++i)
        tensor.values[i] = half_to_float(static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8)));
    } else {  // BF16: the top 16 bits of a float32
      for (size_t i = 0; i < numel; ++i) {
        const uint32_t bits = static_cast<uint32_t>(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
        std::memcpy(&tensor.values[i], &bits, 4);
      }
    }
    file.tensors.emplace(name, std::move(tensor));
  }
  // Empty tensors occupy no bytes and cannot overlap anything.
  spans.erase(std::remove_if(spans.begin(), spans.end(), [](const Span& s) { return s.begin == s.end; }), spans.end());
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      throw Error(what + ": tensor '" + spans[i].name + "' data overlaps tensor '" + spans[i - 1].name + "'");
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  return parse_safetensors(read_whole_file(path, "a model file", kMaxModelFileBytes), path);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

std::string safetensors_bytes(const SafetensorsFile& file) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    if (tensor.values.size() != tensor.numel())
      throw Error("tensor '" + name + "' has " + std::to_string(tensor.values.size()) + " values for its shape");
    const uint64_t bytes = tensor.values.size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::string out(8, '\0');
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += text;
  out.reserve(out.size() + offset);
  for (const auto& entry : file.tensors)
    out.append(reinterpret_cast<const char*>(entry.second.values.data()), entry.second.values.size() * 4);
  return out;
}

void write_safetensors(const std::string& path, const SafetensorsFile& file) {
  write_file_atomic(path, safetensors_bytes(file));
}

}  // namespace vitlens
