#pragma once
// Output files are written whole or not at all: bytes go to a temporary file in the same folder,
// are flushed, and the temporary is renamed over the target. A failure removes the temporary and
// leaves any existing file untouched.
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace vitlens {

void write_file_atomic(const std::string& path, const std::string& bytes);
void write_png_atomic(const std::string& path, const cv::Mat& rgb8);  // CV_8UC3 RGB or CV_8UC1

// The .npy format (numpy/lib/format.py, version 1.0): magic, header dict, raw little-endian data.
// With data == nullptr, only the header (the caller appends the product(shape) floats).
std::string npy_bytes_f32(const std::vector<size_t>& shape, const float* data);

// Throws vitlens::Error when `dir` is missing, not a folder or not writable.
void require_writable_dir(const std::string& dir);

}  // namespace vitlens
