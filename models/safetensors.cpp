// safetensors reading and writing, with every malformed case turned into a one-line error.
#include "models/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/base/error.hpp"
#include "core/io/files.hpp"  // InputFile

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

// The longest string a header may hold: a vitlens config with every head described, or a
// training record with a long run's loss curve, is well under 1 MB.
constexpr size_t kMaxHeaderStringBytes = size_t{16} << 20;

struct Span {
  uint64_t begin, end;
  std::string name;
};

std::string hex_byte(char c) {
  static const char digits[] = "0123456789abcdef";
  const auto b = static_cast<unsigned char>(c);
  return {digits[b >> 4], digits[b & 15]};
}

// One tensor's header entry as written: {"dtype": str, "shape": [uint], "data_offsets": [uint, uint]}.
struct Entry {
  std::string dtype;
  std::vector<uint64_t> shape, offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
};

// The header's JSON read event by event (nlohmann's SAX interface) straight into its entries:
// each tensor's Entry and __metadata__'s strings. Anything the format does not allow is refused
// the moment it is met: a key twice in one object (a DOM parser keeps the last silently), an
// unknown field, a value of the wrong type, or nesting below the shape arrays. So a header costs
// little more than its own bytes, where a DOM of small objects costs about twenty times them.
class HeaderReader final : public nlohmann::json_sax<json> {
 public:
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> metadata;
  std::string error;  // why the parse stopped; empty on success or on a JSON syntax error

  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("true or false"); }
  bool number_integer(number_integer_t v) override {
    if (v >= 0) return number_unsigned(static_cast<number_unsigned_t>(v));
    return value("a negative number");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ != 3) return value("a number");
    if (field_ == Field::Offsets && entry_->offsets.size() == 2)
      return fail(tensor_where() + " has data_offsets of more than two numbers; the format gives [begin, end]");
    if (field_ == Field::Shape && entry_->shape.size() == kMaxRank)
      return fail(tensor_where() + " has a shape of more than " + std::to_string(kMaxRank) + " dimensions");
    (field_ == Field::Shape ? entry_->shape : entry_->offsets).push_back(v);
    return true;
  }
  bool number_float(number_float_t, const string_t&) override { return value("a fractional number"); }
  bool binary(binary_t&) override { return value("binary data"); }
  bool string(string_t& s) override {
    if (depth_ == 2 && in_metadata_) {
      metadata.emplace(std::move(key_), std::move(s));
      return true;
    }
    if (depth_ == 2 && field_ == Field::Dtype) {
      entry_->dtype = std::move(s);
      return true;
    }
    return value("a string");
  }
  bool start_object(std::size_t) override {
    if (depth_ == 0 || (depth_ == 1 && (in_metadata_ || entry_))) {
      ++depth_;
      return true;
    }
    return value("an object");
  }
  bool end_object() override {
    if (depth_ == 2 && entry_) {
      const char* missing = !entry_->has_dtype ? "dtype" : !entry_->has_shape ? "shape array" : !entry_->has_offsets ? "data_offsets [begin, end]" : nullptr;
      if (missing) return fail(tensor_where() + " has no " + missing);
    }
    --depth_;
    if (depth_ == 1) {
      entry_ = nullptr;
      in_metadata_ = false;
    }
    return true;
  }
  bool start_array(std::size_t) override {
    // Only a tensor entry's shape or data_offsets: field_ still names the last entry's field while
    // __metadata__ is read, and an array there has no entry to fill.
    if (depth_ == 2 && entry_ && !in_metadata_ && (field_ == Field::Shape || field_ == Field::Offsets)) {
      ++depth_;
      return true;
    }
    return value("an array");
  }
  bool end_array() override {
    --depth_;
    if (field_ == Field::Offsets && entry_->offsets.size() != 2)
      return fail(tensor_where() + " has data_offsets of " + std::to_string(entry_->offsets.size()) +
                  " numbers; the format gives two, [begin, end]");
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      if (k == "__metadata__") {
        if (seen_metadata_) return fail("__metadata__ appears twice in the safetensors header");
        seen_metadata_ = in_metadata_ = true;
        return true;
      }
      if (k.size() > kMaxTensorNameBytes)
        return fail("a tensor name in the safetensors header is " + std::to_string(k.size()) + " bytes long; names are at most " +
                    std::to_string(kMaxTensorNameBytes));
      if (entries.size() >= kMaxTensors)
        return fail("the safetensors header lists more than " + std::to_string(kMaxTensors) +
                    " tensors; a Vision Transformer has a few thousand at most");
      const auto [it, added] = entries.emplace(std::move(k), Entry{});
      name_ = &it->first;
      if (!added) return fail(tensor_where() + " appears twice in the header");
      entry_ = &it->second;
      return true;
    }
    if (depth_ == 2 && in_metadata_) {
      if (metadata.count(k)) return fail("__metadata__ key '" + capped_key(k) + "' appears twice");
      if (metadata.size() >= kMaxMetadataKeys)
        return fail("__metadata__ has more than " + std::to_string(kMaxMetadataKeys) + " keys; a model file has a few");
      key_ = std::move(k);
      return true;
    }
    // depth 2 in a tensor entry: one of its three fields, each once.
    bool* seen = k == "dtype" ? &entry_->has_dtype : k == "shape" ? &entry_->has_shape : k == "data_offsets" ? &entry_->has_offsets : nullptr;
    if (!seen)
      return fail(tensor_where() + " has the field '" + capped_key(k) + "'; the format has dtype, shape and data_offsets only");
    if (*seen) return fail(tensor_where() + " has the field '" + k + "' twice");
    *seen = true;
    field_ = k == "dtype" ? Field::Dtype : k == "shape" ? Field::Shape : Field::Offsets;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  enum class Field { Dtype, Shape, Offsets };
  // Far above any real file (a ViT-G has about 700 tensors of rank 4 at most, vitlens writes 3
  // metadata keys), and low enough that the entries cost a few MB whatever the header holds.
  static constexpr size_t kMaxTensorNameBytes = 1024;
  static constexpr size_t kMaxTensors = 100000;
  static constexpr size_t kMaxMetadataKeys = 10000;
  static constexpr size_t kMaxRank = 16;

  static std::string capped_key(const std::string& k) { return k.size() > 100 ? k.substr(0, 100) + "..." : k; }

  std::string tensor_where() const { return "tensor '" + *name_ + "'"; }
  bool fail(const std::string& why) {
    error = why;
    return false;
  }
  // A value where the format has none of its kind: says what the place holds.
  bool value(const char* kind) {
    if (depth_ == 0) return fail("safetensors header is not a JSON object");
    if (depth_ == 1 && in_metadata_) return fail("__metadata__ is not a JSON object");
    if (depth_ == 1) return fail(tensor_where() + " entry is not a JSON object");
    if (in_metadata_) return fail("__metadata__ value '" + capped_key(key_) + "' is not a string");
    switch (field_) {
      case Field::Dtype: return fail(tensor_where() + " has a dtype that is not a string");
      case Field::Shape:
        return fail(tensor_where() + (depth_ == 2 ? " has a shape that is not an array" : " has a shape entry that is not a non-negative integer"));
      case Field::Offsets: break;
    }
    return fail(tensor_where() + " has data_offsets that are not two non-negative integers [begin, end] (" + kind + ")");
  }

  int depth_ = 0;  // 1: the header object, 2: an entry or __metadata__, 3: a shape or data_offsets array
  bool seen_metadata_ = false, in_metadata_ = false;
  Entry* entry_ = nullptr;              // the tensor entry being read (depth >= 2)
  const std::string* name_ = nullptr;   // its name
  Field field_ = Field::Dtype;          // the entry's field being read
  std::string key_;                     // the __metadata__ key whose value comes next
};

// The header's bytes as the format has them (https://huggingface.co/docs/safetensors, "Format"):
// a JSON object starting with '{', padded at the end with spaces (0x20) only. Anything else after
// the object (NUL bytes, a newline, the data itself) means the header length is wrong, and every
// tensor would be read from the wrong place. Returns the JSON's length.
size_t json_length(const char* header, uint64_t length, const std::string& what) {
  if (length == 0) throw Error(what + ": safetensors header is empty (header length 0)");
  if (header[0] != '{') throw Error(what + ": safetensors header is not a JSON object (it must begin with '{')");
  size_t end = static_cast<size_t>(length);
  while (end > 0 && header[end - 1] == ' ') --end;
  if (header[end - 1] != '}')
    throw Error(what + ": safetensors header length " + std::to_string(length) + " does not end at its JSON: byte " +
                std::to_string(end - 1) + " of the header is 0x" + hex_byte(header[end - 1]) +
                ", but only spaces may follow the JSON (a wrong header length, or a damaged file)");
  // One pass over the text before parsing it. JSON text has no raw NUL, and nlohmann's reader
  // would take one for the end of the input. And that reader keeps two growing copies of the
  // token it reads, so one string as long as the header would cost four times the header:
  // strings are limited here, before any of them is copied.
  bool in_string = false, escaped = false;
  size_t run = 0;
  for (size_t i = 0; i < end; ++i) {
    const char c = header[i];
    if (c == '\0')
      throw Error(what + ": safetensors header holds a NUL byte at offset " + std::to_string(i) + ": not JSON text");
    if (!in_string) {
      in_string = c == '"';
      run = 0;
      continue;
    }
    if (escaped) escaped = false;
    else if (c == '\\') escaped = true;
    else if (c == '"') in_string = false;
    if (++run > kMaxHeaderStringBytes)
      throw Error(what + ": safetensors header holds a string of more than " + std::to_string(kMaxHeaderStringBytes >> 20) +
                  " MB (from byte " + std::to_string(i + 1 - run) + "); a model's names and metadata are far shorter");
  }
  return end;
}

// The header's entries, or a one-line error: the length against the format's cap and the file's
// size, then the JSON and its padding.
void parse_header(const char* header, uint64_t header_len, uint64_t file_size, const std::string& what,
                  HeaderReader& reader) {
  if (header_len > kMaxSafetensorsHeaderBytes)
    throw Error(what + ": not a safetensors file: header length " + std::to_string(header_len) + " is above the " +
                std::to_string(kMaxSafetensorsHeaderBytes) + " bytes the format allows");
  if (header_len > file_size - 8)
    throw Error(what + ": not a safetensors file: header length " + std::to_string(header_len) +
                " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  const size_t json_len = json_length(header, header_len, what);
  if (!json::sax_parse(header, header + json_len, &reader)) {
    if (!reader.error.empty()) throw Error(what + ": " + reader.error);
    throw Error(what + ": safetensors header is not valid JSON");
  }
}

void check_has_length(uint64_t file_size, const std::string& what) {
  if (file_size < 8)
    throw Error(what + ": not a safetensors file: " + std::to_string(file_size) +
                " bytes, shorter than the 8-byte header length");
}

// A file's header length and its header bytes, read from the file (the bytes only when the
// length is one parse_header accepts: it says why not).
struct FileHeader {
  uint64_t length = 0;
  std::string text;
};

FileHeader read_file_header(const InputFile& in, const std::string& path) {
  check_has_length(in.size(), path);
  unsigned char length[8];
  in.read_at(0, length, 8);
  FileHeader header;
  header.length = read_le64(length);
  if (header.length <= kMaxSafetensorsHeaderBytes && header.length <= in.size() - 8) {
    header.text.resize(static_cast<size_t>(header.length));
    in.read_at(8, header.text.data(), header.text.size());
  }
  return header;
}

}  // namespace

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  // Only the header is read, so a file of any size may be listed.
  const InputFile in(path, "a model file", std::numeric_limits<uint64_t>::max());
  const FileHeader header = read_file_header(in, path);
  HeaderReader reader;
  parse_header(header.text.data(), header.length, in.size(), path, reader);
  return std::move(reader.metadata);
}

namespace {

// One header entry as a tensor without its values: the dtype known, the shape within int64, the
// offsets inside the DATA_SIZE bytes after the header and spanning exactly the shape's bytes.
TensorData checked_tensor(const std::string& where, const Entry& entry, uint64_t data_size) {
  const int elem = dtype_size(entry.dtype);
  if (elem == 0) throw Error(where + " has dtype '" + entry.dtype + "'; vitlens reads F32, F16, BF16 and F64");
  TensorData tensor;
  tensor.source_dtype = entry.dtype;
  uint64_t numel = 1;
  for (const uint64_t dim : entry.shape) {
    // Every dimension fits int64, and numel * 16 cannot wrap (checked before multiplying).
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (dim > 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim))
      throw Error(where + " has a shape too large for this machine");
    numel *= dim;
    tensor.shape.push_back(static_cast<int64_t>(dim));
  }
  const uint64_t begin = entry.offsets[0], end = entry.offsets[1];
  if (end < begin) throw Error(where + " has data_offsets that are not 0 <= begin <= end");
  if (end > data_size)
    throw Error(where + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                "] run past the end of the data (" + std::to_string(data_size) + " bytes): file truncated?");
  if (end - begin != numel * static_cast<uint64_t>(elem))
    throw Error(where + " data_offsets span " + std::to_string(end - begin) + " bytes, but " + entry.dtype + " shape needs " +
                std::to_string(numel * static_cast<uint64_t>(elem)));
  return tensor;
}

// The format packs the tensors back to back from the first data byte to the last: a gap, an
// overlap or bytes after the last tensor mean offsets (or a header length) that are wrong.
// Sorts SPANS by where they start.
void check_packed(std::vector<Span>& spans, uint64_t data_size, const std::string& what) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t next = 0;
  const std::string* previous = nullptr;
  for (const Span& s : spans) {
    if (s.begin < next)
      throw Error(what + ": tensor '" + s.name + "' data overlaps tensor '" + *previous + "'");
    if (s.begin > next)
      throw Error(what + ": tensor '" + s.name + "' starts at data byte " + std::to_string(s.begin) + ", but the tensors before it end at " +
                  std::to_string(next) + "; the format packs tensors without gaps");
    next = s.end;
    previous = &s.name;
  }
  if (next != data_size)
    throw Error(what + ": the tensors end at data byte " + std::to_string(next) + ", but the file has " + std::to_string(data_size) +
                " bytes of data after the header; the format packs tensors up to the end of the file (a wrong header length?)");
}

// Fills TENSOR's values (float32) from its SRC bytes, read as its source dtype (little-endian).
void convert_values(TensorData& tensor, const unsigned char* src) {
  const size_t numel = tensor.numel();
  tensor.values.resize(numel);
  const std::string& dtype = tensor.source_dtype;
  if (numel == 0) {
    // nothing to copy (and memcpy from a null pointer is undefined)
  } else if (dtype == "F32") {
    std::memcpy(tensor.values.data(), src, numel * 4);
  } else if (dtype == "F64") {
    for (size_t i = 0; i < numel; ++i) {
      double v;
      std::memcpy(&v, src + 8 * i, 8);
      tensor.values[i] = static_cast<float>(v);  // to nearest, as IEEE 754 converts (far out of range: +-inf)
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
}

// The tensors of a parsed header, checked against the DATA_SIZE bytes after it; then, only with
// the whole header checked, each tensor's values from `fill(name, tensor, its first byte in the data)`.
SafetensorsFile tensors_of(HeaderReader& reader, uint64_t data_size, const std::string& what,
                           const std::function<void(const std::string&, TensorData&, uint64_t)>& fill) {
  SafetensorsFile file;
  file.metadata = std::move(reader.metadata);
  std::vector<Span> spans;
  for (auto& [name, entry] : reader.entries) {
    file.tensors.emplace(name, checked_tensor(what + ": tensor '" + name + "'", entry, data_size));
    spans.push_back({entry.offsets[0], entry.offsets[1], name});
  }
  check_packed(spans, data_size, what);
  for (const Span& s : spans) fill(s.name, file.tensors.at(s.name), s.begin);
  return file;
}

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& what) {
  const auto* raw = reinterpret_cast<const unsigned char*>(bytes.data());
  check_has_length(bytes.size(), what);
  const uint64_t header_len = read_le64(raw);
  HeaderReader reader;
  parse_header(bytes.data() + 8, header_len, bytes.size(), what, reader);
  const uint64_t data_start = 8 + header_len;
  return tensors_of(reader, bytes.size() - data_start, what,
                    [&](const std::string&, TensorData& tensor, uint64_t begin) {
                      convert_values(tensor, raw + data_start + begin);
                    });
}

// As parse_safetensors, read in parts: the header, then each tensor's bytes straight into its
// values (F32) or through one buffer of the largest other tensor (F16, BF16, F64), so loading
// never holds a copy of the whole file beside the floats.
SafetensorsFile read_safetensors(const std::string& path) {
  const InputFile in(path, "a model file", kMaxModelFileBytes);
  const FileHeader header = read_file_header(in, path);
  HeaderReader reader;
  parse_header(header.text.data(), header.length, in.size(), path, reader);
  const uint64_t data_start = 8 + header.length;
  std::vector<unsigned char> buffer;
  return tensors_of(reader, in.size() - data_start, path, [&](const std::string& name, TensorData& tensor, uint64_t begin) {
    const size_t bytes = tensor.numel() * static_cast<size_t>(dtype_size(tensor.source_dtype));
    try {
      if (tensor.source_dtype == "F32") {
        tensor.values.resize(tensor.numel());
        in.read_at(data_start + begin, tensor.values.data(), bytes);
      } else {
        buffer.resize(bytes);
        in.read_at(data_start + begin, buffer.data(), bytes);
        convert_values(tensor, buffer.data());
      }
    } catch (const std::bad_alloc&) {
      throw Error(path + ": out of memory reading tensor '" + name + "' (" + mebibytes(tensor.numel() * 4) +
                  " as floats)");
    }
  });
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
