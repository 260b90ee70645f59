// Fashion-MNIST from its IDX files (plain or gzip'd, inflated with zlib only up to the size the
// header announces): the header and sizes checked, gray replicated to RGB. Legend: n = images,
// H x W = image size.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>

#include <zlib.h>

#include "core/base/error.hpp"
#include "core/data/dataset.hpp"
#include "core/io/files.hpp"  // read_whole_file

namespace vitlens {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Fashion-MNIST (IDX format, http://yann.lecun.com/exdb/mnist/: big-endian magic 0x000008XX where
// 08 = unsigned byte and XX = number of dimensions, then one big-endian uint32 per dimension,
// then the data, row-major).
// ---------------------------------------------------------------------------------------------

namespace {

// The most data bytes an IDX file may announce. The largest Fashion-MNIST file (the training images)
// holds 47,040,000; the loader turns each byte into 3 floats (12 bytes), so this cap keeps any IDX
// file, however it was made, under about 0.8 GB of pixels. A gzip'd file is inflated only up to
// the size its own header announces: a few KB that inflate to gigabytes cost at most this.
constexpr size_t kMaxIdxBytes = size_t{64} << 20;

// Inflates a gzip file (one or more members, as `cat a.gz b.gz`) piece by piece into the caller's
// buffers, so the caller decides from the header how much to take.
class GzipReader {
 public:
  GzipReader(const std::string& packed, std::string path) : path_(std::move(path)) {
    std::memset(&zs_, 0, sizeof zs_);
    if (inflateInit2(&zs_, 15 + 16) != Z_OK) throw Error(path_ + ": cannot start the gzip decoder");
    zs_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
    zs_.avail_in = static_cast<uInt>(packed.size());  // packed.size() <= kMaxIdxBytes + 16 < 4 GiB
  }
  ~GzipReader() { inflateEnd(&zs_); }
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Fills `out` with up to `n` bytes; fewer only where the data ends.
  size_t read(char* out, size_t n) {
    size_t produced = 0;
    while (produced < n && !ended_) {
      const size_t room = std::min<size_t>(n - produced, 1u << 30);
      zs_.next_out = reinterpret_cast<Bytef*>(out + produced);
      zs_.avail_out = static_cast<uInt>(room);
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      produced += room - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        if (zs_.avail_in == 0) ended_ = true;
        else inflateReset(&zs_);  // another gzip member follows: gzip reads on
      } else if (rc == Z_BUF_ERROR && zs_.avail_in == 0) {  // no progress, nothing left to read
        throw Error(path_ + ": gzip data is truncated (the file ends inside the compressed stream)");
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw Error(path_ + ": damaged gzip data (" + (zs_.msg ? std::string(zs_.msg) : "error " + std::to_string(rc)) + ")");
      }
    }
    return produced;
  }

 private:
  z_stream zs_;
  std::string path_;
  bool ended_ = false;
};

uint32_t big_endian_u32(const std::string& b, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data() + at);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct IdxArray {
  std::string path;            // the file actually read (with or without .gz)
  std::string bytes;           // the whole decompressed file
  std::vector<uint32_t> dims;  // e.g. (n, 28, 28) or (n)
  size_t data_offset = 0;      // where the unsigned bytes start
};

// Checks the magic (unsigned bytes, `ndim` dimensions) of the header at the start of `head` and
// fills a.dims; returns the number of data bytes the header announces (at most kMaxIdxBytes).
size_t parse_idx_header(const std::string& head, int ndim, const std::string& what, IdxArray& a) {
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  if (head.empty()) throw Error(a.path + ": file is empty, not an IDX " + what + " file");
  if (head.size() < 4) throw Error(a.path + ": truncated IDX file (" + std::to_string(head.size()) + " bytes, no header)");
  const uint32_t magic = big_endian_u32(head, 0);
  const uint32_t expected = 0x800u + static_cast<uint32_t>(ndim);
  if (magic != expected) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "bad magic 0x%08x, expected 0x%08x (unsigned bytes, %d dimension%s)", magic,
                  expected, ndim, ndim == 1 ? "" : "s");
    throw Error(a.path + ": not an IDX " + what + " file: " + buf);
  }
  if (head.size() < header)
    throw Error(a.path + ": truncated IDX file (" + std::to_string(head.size()) + " bytes, the header alone is " +
                std::to_string(header) + ")");
  size_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    a.dims.push_back(big_endian_u32(head, 4 + 4 * static_cast<size_t>(d)));
    total *= a.dims.back();  // checked after each factor, so the product never overflows
    if (total > kMaxIdxBytes)
      throw Error(a.path + ": IDX header announces more than " + std::to_string(kMaxIdxBytes >> 20) +
                  " MiB of data, more than any Fashion-MNIST file; nothing was decoded");
  }
  a.data_offset = header;
  return total;
}

void check_idx_size(const IdxArray& a, size_t total) {
  const size_t have = a.bytes.size() - a.data_offset;
  if (have < total)
    throw Error(a.path + ": truncated IDX file (header announces " + std::to_string(total) + " data bytes, the file holds " +
                std::to_string(have) + ")");
}

// Reads `dir/name` or `dir/name.gz`, checks the header and that the file holds exactly the bytes
// its header announces. A gzip'd file is inflated header first, then only as far as it announces.
IdxArray read_idx(const std::string& dir, const std::string& name, int ndim, const std::string& what) {
  IdxArray a;
  const fs::path plain = fs::path(dir) / name, packed = fs::path(dir) / (name + ".gz");
  std::error_code ec;
  if (fs::exists(plain, ec)) {
    a.path = plain.string();
  } else if (fs::exists(packed, ec)) {
    a.path = packed.string();
  } else {
    throw Error(packed.string() + ": cannot open Fashion-MNIST " + what + " (no such file, nor " + name +
                " without .gz); is the dataset-fashion-mnist package installed?");
  }
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  std::string file = read_whole_file(a.path, "an IDX file", kMaxIdxBytes + header);
  const bool gzip = file.size() >= 2 && static_cast<unsigned char>(file[0]) == 0x1f &&
                    static_cast<unsigned char>(file[1]) == 0x8b;
  if (!gzip && a.path.size() > 3 && a.path.compare(a.path.size() - 3, 3, ".gz") == 0)
    throw Error(a.path + ": not gzip data (the name ends in .gz but the file does not start with the gzip magic 1f 8b)");
  if (!gzip) {
    a.bytes = std::move(file);
    const size_t total = parse_idx_header(a.bytes, ndim, what, a);
    check_idx_size(a, total);
    if (a.bytes.size() - header > total)
      throw Error(a.path + ": malformed IDX file (" + std::to_string(a.bytes.size() - header - total) +
                  " bytes after the " + std::to_string(total) + " data bytes its header announces)");
    return a;
  }
  GzipReader reader(file, a.path);
  a.bytes.resize(header);
  a.bytes.resize(reader.read(&a.bytes[0], header));
  const size_t total = parse_idx_header(a.bytes, ndim, what, a);
  a.bytes.resize(header + total);
  a.bytes.resize(header + reader.read(&a.bytes[header], total));
  check_idx_size(a, total);
  char more = 0;
  if (reader.read(&more, 1) != 0)
    throw Error(a.path + ": malformed IDX file (more bytes after the " + std::to_string(total) +
                " data bytes its header announces)");
  return a;
}

}  // namespace

std::string default_fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

ImageSet load_fashion_mnist(const std::string& dir, bool train, int limit) {
  if (limit < 0) throw Error("Fashion-MNIST: limit must be >= 0 (0 = all images), got " + std::to_string(limit));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a folder (expected the Fashion-MNIST IDX files in it)");
  const std::string prefix = train ? "train" : "t10k";
  const IdxArray images = read_idx(dir, prefix + "-images-idx3-ubyte", 3, "image");
  const IdxArray labels = read_idx(dir, prefix + "-labels-idx1-ubyte", 1, "label");
  const uint32_t n_images = images.dims[0], rows = images.dims[1], cols = images.dims[2];
  if (n_images != labels.dims[0])
    throw Error(images.path + ": holds " + std::to_string(n_images) + " images but " + labels.path + " holds " +
                std::to_string(labels.dims[0]) + " labels");
  if (n_images == 0) throw Error(images.path + ": holds no images");
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096)
    throw Error(images.path + ": image size " + std::to_string(rows) + "x" + std::to_string(cols) + " is not a valid IDX image size");
  if (n_images > static_cast<uint32_t>(std::numeric_limits<int>::max()))
    throw Error(images.path + ": too many images (" + std::to_string(n_images) + ")");

  ImageSet set;
  set.class_names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                     "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  set.height = static_cast<int>(rows);
  set.width = static_cast<int>(cols);
  set.source = images.path + " + " + labels.path;
  const int n = limit > 0 ? std::min(limit, static_cast<int>(n_images)) : static_cast<int>(n_images);
  const size_t plane = static_cast<size_t>(rows) * cols;

  const auto* label_bytes = reinterpret_cast<const unsigned char*>(labels.bytes.data() + labels.data_offset);
  set.labels.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int label = label_bytes[i];
    if (label >= set.num_classes())
      throw Error(labels.path + ": label " + std::to_string(label) + " at index " + std::to_string(i) +
                  " is not a Fashion-MNIST class (0 to 9)");
    set.labels[static_cast<size_t>(i)] = label;
  }
  // (n, 3, H, W): the one gray plane copied into R, G and B, as PIL's convert("RGB") does.
  const auto* pixel_bytes = reinterpret_cast<const unsigned char*>(images.bytes.data() + images.data_offset);
  set.pixels.resize(static_cast<size_t>(n) * 3 * plane);
  for (int i = 0; i < n; ++i) {
    const unsigned char* src = pixel_bytes + static_cast<size_t>(i) * plane;
    float* dst = set.pixels.data() + static_cast<size_t>(i) * 3 * plane;
    for (size_t k = 0; k < plane; ++k) dst[k] = static_cast<float>(src[k]) / 255.0f;
    std::copy(dst, dst + plane, dst + plane);
    std::copy(dst, dst + plane, dst + 2 * plane);
  }
  return set;
}

}  // namespace vitlens
