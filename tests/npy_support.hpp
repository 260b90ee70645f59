#pragma once
// Reading the .npy files the parity fixture scripts write, for test_parity.cpp and
// test_foreign_parity.cpp (the reader itself is tested in test_parity.cpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

inline std::string npy_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path + " (run the fixture script that makes it)");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A float32 array from .npy bytes (numpy/lib/format.py). Only what the fixtures use is accepted:
// version 1.0 or 2.0, descr '<f4', fortran_order False; anything else throws, naming the file.
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;  // C order
};

[[noreturn]] inline void npy_fail(const std::string& what, const std::string& why) {
  throw std::runtime_error(what + ": " + why);
}

// The text after `'key':` in the header dict, with leading spaces skipped.
inline std::string npy_field(const std::string& header, const std::string& key, const std::string& what) {
  const std::string tag = "'" + key + "':";
  const size_t at = header.find(tag);
  if (at == std::string::npos) npy_fail(what, "header has no '" + key + "': " + header);
  size_t begin = at + tag.size();
  while (begin < header.size() && header[begin] == ' ') ++begin;
  return header.substr(begin);
}

inline NpyArray parse_npy(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) npy_fail(what, "not a .npy file");
  const auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<uint8_t>(bytes[i])); };
  size_t header_len = 0, header_begin = 0;
  if (byte(6) == 1) {
    header_len = byte(8) | (byte(9) << 8);
    header_begin = 10;
  } else if (byte(6) == 2 && bytes.size() >= 12) {
    header_len = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
    header_begin = 12;
  } else {
    npy_fail(what, "unsupported .npy version " + std::to_string(byte(6)));
  }
  if (header_begin + header_len > bytes.size()) npy_fail(what, "header runs past the end");
  const std::string header = bytes.substr(header_begin, header_len);

  if (npy_field(header, "descr", what).compare(0, 5, "'<f4'") != 0)
    npy_fail(what, "descr is not '<f4': " + header);
  if (npy_field(header, "fortran_order", what).compare(0, 5, "False") != 0)
    npy_fail(what, "fortran_order is not False: " + header);
  const std::string shape_text = npy_field(header, "shape", what);
  if (shape_text.empty() || shape_text[0] != '(') npy_fail(what, "shape is not a tuple: " + header);

  NpyArray array;
  size_t pos = 1;
  size_t count = 1;
  while (pos < shape_text.size() && shape_text[pos] != ')') {
    const char ch = shape_text[pos];
    if (ch == ' ' || ch == ',') {
      ++pos;
    } else if (ch >= '0' && ch <= '9') {
      size_t used = 0;
      const int64_t dim = std::stoll(shape_text.substr(pos), &used);
      array.shape.push_back(dim);
      count *= static_cast<size_t>(dim);
      pos += used;
    } else {
      npy_fail(what, "bad shape: " + header);
    }
  }
  if (pos >= shape_text.size()) npy_fail(what, "unterminated shape: " + header);

  const size_t data_begin = header_begin + header_len;
  if (bytes.size() - data_begin != count * sizeof(float))
    npy_fail(what, std::to_string(bytes.size() - data_begin) + " data bytes for " + std::to_string(count) +
                       " float32 values");
  array.values.resize(count);
  // .npy '<f4' is little-endian, as is every machine vitlens builds for.
  std::memcpy(array.values.data(), bytes.data() + data_begin, count * sizeof(float));
  return array;
}

inline NpyArray read_npy(const std::string& path) { return parse_npy(npy_file_bytes(path), path); }

// Version 1.0 .npy bytes with the given header dict, padded as numpy pads it.
inline std::string npy_with_header(const std::string& dict, const std::vector<float>& values) {
  std::string header = dict;
  header += std::string(63 - (10 + header.size()) % 64, ' ') + "\n";
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xFF);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return bytes;
}

// Largest |got - want| over n values; NaN anywhere counts as infinitely different.
inline double max_abs_diff(const float* got, const float* want, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (!(diff <= worst)) worst = std::isnan(diff) ? INFINITY : diff;
  }
  return worst;
}

}  // namespace
