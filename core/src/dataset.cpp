// Training data (issue 7): Fashion-MNIST IDX files, ImageFolder trees, the photo corpus, the seeded
// generator and the augmentations. Legend: n = images, C = classes, H x W = image size, S = side.
#include "vitlens/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>

#include <opencv2/imgproc.hpp>
#include <zlib.h>

#include "vitlens/error.hpp"
#include "vitlens/image.hpp"

namespace vitlens {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Rng: splitmix64 seeding + xoshiro256** (https://prng.di.unimi.it/, the authors' reference C).
// ---------------------------------------------------------------------------------------------

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& word : s) word = splitmix64(x);  // never all zero: splitmix64 is a bijection of distinct inputs
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int Rng::below(int n) {
  if (n <= 0) throw Error("Rng::below: n must be > 0, got " + std::to_string(n));
  // 2^64 mod n values at the top would make small results likelier: draw again when we land there.
  const uint64_t range = static_cast<uint64_t>(n);
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % range;
  uint64_t r = next();
  while (r >= limit) r = next();
  return static_cast<int>(r % range);
}

void Rng::shuffle(std::vector<int32_t>& v) {
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(below(static_cast<int>(i)));
    std::swap(v[i - 1], v[j]);
  }
}

// ---------------------------------------------------------------------------------------------
// ImageSet
// ---------------------------------------------------------------------------------------------

int ImageSet::size() const { return static_cast<int>(labels.size()); }
int ImageSet::num_classes() const { return static_cast<int>(class_names.size()); }
const float* ImageSet::image(int i) const {
  return pixels.data() + static_cast<size_t>(i) * 3 * static_cast<size_t>(height) * static_cast<size_t>(width);
}

// ---------------------------------------------------------------------------------------------
// Fashion-MNIST (IDX format, http://yann.lecun.com/exdb/mnist/: big-endian magic 0x000008XX where
// 08 = unsigned byte and XX = number of dimensions, then one big-endian uint32 per dimension,
// then the data, row-major).
// ---------------------------------------------------------------------------------------------

namespace {

// The largest decompressed IDX file we accept: the Fashion-MNIST training images are 47 MB, and a
// few KB of gzip can expand to gigabytes.
constexpr size_t kMaxIdxBytes = size_t{1} << 30;

std::string gunzip(const std::string& packed, const std::string& path) {
  z_stream zs;
  std::memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, 15 + 16) != Z_OK) throw Error(path + ": cannot start the gzip decoder");
  std::string out;
  // The gzip trailer stores the size mod 2^32: a good first guess for a well-formed file.
  size_t guess = packed.size() * 4;
  if (packed.size() >= 18) {
    const auto* t = reinterpret_cast<const unsigned char*>(packed.data() + packed.size() - 4);
    guess = std::max<size_t>(guess, t[0] | (t[1] << 8) | (t[2] << 16) | (static_cast<size_t>(t[3]) << 24));
    // deflate expands at most about 1032:1: a damaged trailer must not make us reserve 4 GB.
    guess = std::min(guess, packed.size() * 1032 + 1024);
  }
  out.resize(std::min(guess + 1, kMaxIdxBytes));
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
  zs.avail_in = static_cast<uInt>(packed.size());
  size_t produced = 0;
  int rc = Z_OK;
  while (true) {
    if (produced == out.size()) {
      if (out.size() >= kMaxIdxBytes) {
        inflateEnd(&zs);
        throw Error(path + ": decompresses to more than " + std::to_string(kMaxIdxBytes >> 20) + " MiB; not an IDX file vitlens reads");
      }
      out.resize(std::min(out.size() * 2, kMaxIdxBytes));
    }
    const size_t room = std::min<size_t>(out.size() - produced, 1u << 30);
    zs.next_out = reinterpret_cast<Bytef*>(&out[produced]);
    zs.avail_out = static_cast<uInt>(room);
    rc = inflate(&zs, Z_NO_FLUSH);
    produced += room - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      inflateReset(&zs);  // another gzip member follows (as `cat a.gz b.gz`): gzip reads on
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_out != 0) {  // no progress with room to write: input ran out
      inflateEnd(&zs);
      throw Error(path + ": gzip data is truncated (the file ends inside the compressed stream)");
    }
    if (rc == Z_BUF_ERROR) continue;
    const std::string why = zs.msg ? zs.msg : "error " + std::to_string(rc);
    inflateEnd(&zs);
    throw Error(path + ": damaged gzip data (" + why + ")");
  }
  inflateEnd(&zs);
  out.resize(produced);
  return out;
}

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

// Reads `dir/name` or `dir/name.gz`, checks the magic (unsigned bytes, `ndim` dimensions) and that
// the file holds exactly the bytes its header announces.
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
  a.bytes = read_whole_file(a.path, "an IDX file", kMaxIdxBytes);
  const bool gzip = a.bytes.size() >= 2 && static_cast<unsigned char>(a.bytes[0]) == 0x1f &&
                    static_cast<unsigned char>(a.bytes[1]) == 0x8b;
  if (gzip) {
    a.bytes = gunzip(a.bytes, a.path);
  } else if (a.path.size() > 3 && a.path.compare(a.path.size() - 3, 3, ".gz") == 0) {
    throw Error(a.path + ": not gzip data (the name ends in .gz but the file does not start with the gzip magic 1f 8b)");
  }
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  if (a.bytes.empty()) throw Error(a.path + ": file is empty, not an IDX " + what + " file");
  if (a.bytes.size() < 4) throw Error(a.path + ": truncated IDX file (" + std::to_string(a.bytes.size()) + " bytes, no header)");
  const uint32_t magic = big_endian_u32(a.bytes, 0);
  const uint32_t expected = 0x800u + static_cast<uint32_t>(ndim);
  if (magic != expected) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "bad magic 0x%08x, expected 0x%08x (unsigned bytes, %d dimension%s)", magic,
                  expected, ndim, ndim == 1 ? "" : "s");
    throw Error(a.path + ": not an IDX " + what + " file: " + buf);
  }
  if (a.bytes.size() < header)
    throw Error(a.path + ": truncated IDX file (" + std::to_string(a.bytes.size()) + " bytes, the header alone is " +
                std::to_string(header) + ")");
  size_t total = 1;
  for (int d = 0; d < ndim; ++d) {
    a.dims.push_back(big_endian_u32(a.bytes, 4 + 4 * static_cast<size_t>(d)));
    total *= a.dims.back();  // <= 2^32 per dimension, and the product is checked against the file size below
    if (total > kMaxIdxBytes) throw Error(a.path + ": IDX header announces more than " + std::to_string(kMaxIdxBytes >> 20) + " MiB of data");
  }
  a.data_offset = header;
  const size_t have = a.bytes.size() - header;
  if (have < total)
    throw Error(a.path + ": truncated IDX file (header announces " + std::to_string(total) + " data bytes, the file holds " +
                std::to_string(have) + ")");
  if (have > total)
    throw Error(a.path + ": malformed IDX file (" + std::to_string(have - total) + " bytes after the " +
                std::to_string(total) + " data bytes its header announces)");
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

// ---------------------------------------------------------------------------------------------
// ImageFolder and the photo corpus
// ---------------------------------------------------------------------------------------------

namespace {

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

void note_skip(FolderReport* report, const std::string& message) {
  if (!report) return;
  ++report->skipped;
  if (report->examples.size() < 5) report->examples.push_back(message);
}

// Area and bilinear resampling round a sum of weights that should be 1: a white pixel can come
// out as 1.0000001. Every image here promises [0, 1].
float unit(float v) { return std::min(1.0f, std::max(0.0f, v)); }

// (h, w, 3) interleaved float -> (3, h, w) planar, written to `out`, clamped to [0, 1].
void append_planar(const cv::Mat& rgb, float* out) {
  const size_t plane = static_cast<size_t>(rgb.rows) * static_cast<size_t>(rgb.cols);
  for (int y = 0; y < rgb.rows; ++y) {
    const cv::Vec3f* row = rgb.ptr<cv::Vec3f>(y);
    for (int x = 0; x < rgb.cols; ++x) {
      const size_t at = static_cast<size_t>(y) * static_cast<size_t>(rgb.cols) + static_cast<size_t>(x);
      for (int c = 0; c < 3; ++c) out[static_cast<size_t>(c) * plane + at] = unit(row[x][c]);
    }
  }
}

// Down with area averaging (no aliasing), up with bilinear, as the header promises.
int interpolation_for(int from_side, int to_side) { return to_side < from_side ? cv::INTER_AREA : cv::INTER_LINEAR; }

// torchvision Resize(S) then CenterCrop(S): the short side becomes S, the long side
// int(S * long / short) (Resize truncates), and the crop starts at round((side - S) / 2).
// A very elongated image (a 1 x 5000 strip at side 224 would be resized to 1.1 million x 224
// first) is cut to its centred square of the short side before resizing instead: the same
// pixels, up to the crop's rounding, without the huge intermediate.
cv::Mat resize_and_centre_crop(const cv::Mat& source, int side) {
  cv::Mat rgb = source;
  const int short_side = std::min(rgb.rows, rgb.cols);
  if (std::max(rgb.rows, rgb.cols) > 8 * short_side) {
    const int top = (rgb.rows - short_side) / 2, left = (rgb.cols - short_side) / 2;
    rgb = rgb(cv::Rect(left, top, short_side, short_side));
  }
  int w = side, h = side;
  if (rgb.cols > rgb.rows) w = static_cast<int>(static_cast<long long>(side) * rgb.cols / rgb.rows);
  if (rgb.rows > rgb.cols) h = static_cast<int>(static_cast<long long>(side) * rgb.rows / rgb.cols);
  cv::Mat resized;
  if (w == rgb.cols && h == rgb.rows) {
    resized = rgb;
  } else {
    cv::resize(rgb, resized, cv::Size(w, h), 0, 0, interpolation_for(short_side, side));
  }
  const int top = static_cast<int>(std::lround((h - side) / 2.0));
  const int left = static_cast<int>(std::lround((w - side) / 2.0));
  return resized(cv::Rect(left, top, side, side));
}

// Regular files under `dir` (recursively when asked), hidden ones left out, sorted by path.
std::vector<fs::path> list_files(const fs::path& dir, bool recursive) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (recursive) {
    fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink |
                                                 fs::directory_options::skip_permission_denied, ec);
    if (ec) throw Error(dir.string() + ": cannot list the folder (" + ec.message() + ")");
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) throw Error(dir.string() + ": cannot list the folder (" + ec.message() + ")");
      if (hidden(it->path())) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_directory(ec)) files.push_back(it->path());
      if (it.depth() > 32) it.disable_recursion_pending();  // a symlink loop must end somewhere
    }
  } else {
    fs::directory_iterator it(dir, ec);
    if (ec) throw Error(dir.string() + ": cannot list the folder (" + ec.message() + ")");
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) throw Error(dir.string() + ": cannot list the folder (" + ec.message() + ")");
      if (!hidden(it->path()) && !it->is_directory(ec)) files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

void require_folder(const std::string& dir, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw Error(dir + ": no such folder (" + what + ")");
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a folder (" + what + ")");
}

}  // namespace

ImageSet load_image_folder(const std::string& dir, int img_size, FolderReport* report) {
  if (img_size < 1 || img_size > 4096)
    throw Error(dir + ": image size must be 1 to 4096 px, got " + std::to_string(img_size));
  require_folder(dir, "expected one subfolder of images per class");
  std::vector<fs::path> class_dirs;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw Error(dir + ": cannot list the folder (" + ec.message() + ")");
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) throw Error(dir + ": cannot list the folder (" + ec.message() + ")");
    if (it->is_directory(ec) && !hidden(it->path())) class_dirs.push_back(it->path());
  }
  // Byte order of the names, as Python's sorted() in torchvision's find_classes.
  std::sort(class_dirs.begin(), class_dirs.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  if (class_dirs.empty()) throw Error(dir + ": has no class folders (expected one subfolder of images per class)");
  if (class_dirs.size() == 1)
    throw Error(dir + ": has a single class folder (" + class_dirs[0].filename().string() +
                "); a classifier needs at least 2 classes, one subfolder each");

  ImageSet set;
  set.height = set.width = img_size;
  set.source = dir;
  const size_t image_floats = 3 * static_cast<size_t>(img_size) * static_cast<size_t>(img_size);
  for (size_t c = 0; c < class_dirs.size(); ++c) {
    const std::string name = class_dirs[c].filename().string();
    set.class_names.push_back(name);
    const std::vector<fs::path> files = list_files(class_dirs[c], true);
    if (files.empty()) throw Error(class_dirs[c].string() + ": class folder '" + name + "' is empty; put images in it or remove it");
    int kept = 0;
    for (const fs::path& file : files) {
      cv::Mat rgb;
      try {
        rgb = load_image(file.string(), kMaxLoadSide, img_size).rgb01;  // short side kept for the crop
      } catch (const Error& e) {
        note_skip(report, e.what());
        continue;
      }
      const cv::Mat square = resize_and_centre_crop(rgb, img_size);
      set.pixels.resize(set.pixels.size() + image_floats);
      append_planar(square, set.pixels.data() + set.pixels.size() - image_floats);
      set.labels.push_back(static_cast<int32_t>(c));
      ++kept;
    }
    if (kept == 0)
      throw Error(class_dirs[c].string() + ": class folder '" + name + "' has no readable image (" +
                  std::to_string(files.size()) + " file" + (files.size() == 1 ? "" : "s") + " skipped)");
  }
  return set;
}

void split_holdout(const ImageSet& all, double val_fraction, uint64_t seed, ImageSet* train, ImageSet* val) {
  if (!train || !val) throw Error("split_holdout: train and val must not be null");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw Error(all.source + ": held-out fraction must be in [0, 1), got " + std::to_string(val_fraction));
  const int classes = all.num_classes();
  std::vector<std::vector<int32_t>> by_class(static_cast<size_t>(std::max(classes, 0)));
  for (int i = 0; i < all.size(); ++i) {
    const int32_t label = all.labels[static_cast<size_t>(i)];
    if (label < 0 || label >= classes) throw Error(all.source + ": label " + std::to_string(label) + " out of range");
    by_class[static_cast<size_t>(label)].push_back(i);
  }
  // One generator for the whole split, classes in order: the same seed gives the same split.
  Rng rng(seed);
  std::vector<char> to_val(static_cast<size_t>(all.size()), 0);
  for (std::vector<int32_t>& members : by_class) {
    const int count = static_cast<int>(members.size());
    int n_val = static_cast<int>(std::lround(val_fraction * count));
    if (val_fraction > 0.0 && count >= 2) n_val = std::clamp(n_val, 1, count - 1);  // both sides see every class
    if (count < 2) n_val = 0;
    rng.shuffle(members);
    for (int k = 0; k < n_val; ++k) to_val[static_cast<size_t>(members[static_cast<size_t>(k)])] = 1;
  }
  ImageSet tr, va;
  for (ImageSet* part : {&tr, &va}) {
    part->height = all.height;
    part->width = all.width;
    part->class_names = all.class_names;
  }
  tr.source = all.source + " (train split)";
  va.source = all.source + " (held-out split)";
  const size_t image_floats = 3 * static_cast<size_t>(all.height) * static_cast<size_t>(all.width);
  for (int i = 0; i < all.size(); ++i) {
    ImageSet& part = to_val[static_cast<size_t>(i)] ? va : tr;
    part.labels.push_back(all.labels[static_cast<size_t>(i)]);
    part.pixels.insert(part.pixels.end(), all.image(i), all.image(i) + image_floats);
  }
  // Assigned last: `train` or `val` may be `all` itself.
  *train = std::move(tr);
  *val = std::move(va);
}

int PhotoCorpus::size() const { return static_cast<int>(photos.size()); }

std::string default_photo_dir() { return "/usr/share/doc/opencv-doc/examples/data"; }

PhotoCorpus load_photo_corpus(const std::string& dir, int max_side, FolderReport* report) {
  if (max_side < 1) throw Error(dir + ": photo size cap must be >= 1 px, got " + std::to_string(max_side));
  require_folder(dir, "expected photos in it");
  PhotoCorpus corpus;
  corpus.source = dir;
  for (const fs::path& file : list_files(dir, true)) {
    cv::Mat rgb;
    try {
      rgb = load_image(file.string(), max_side).rgb01;  // capped at max_side by the loader, by area
    } catch (const Error& e) {
      note_skip(report, e.what());
      continue;
    }
    std::vector<float> planar(3 * static_cast<size_t>(rgb.rows) * static_cast<size_t>(rgb.cols));
    append_planar(rgb, planar.data());
    corpus.photos.push_back(std::move(planar));
    corpus.heights.push_back(rgb.rows);
    corpus.widths.push_back(rgb.cols);
    corpus.names.push_back(file.lexically_relative(dir).string());  // "a.jpg", "sub/b.jpg"
  }
  if (corpus.photos.empty()) throw Error(dir + ": has no readable photo");
  return corpus;
}

void sample_photo_crop(const PhotoCorpus& corpus, Rng& rng, int out_size, float min_scale, bool flip, float* out) {
  if (corpus.size() == 0) throw Error(corpus.source + ": the photo corpus is empty");
  crop_photo(corpus, rng.below(corpus.size()), rng, out_size, min_scale, flip, out);
}

namespace {

// The square (y0, x0, side) of photo i, mirrored when asked, resized to out (3, out_size, out_size).
void crop_square(const PhotoCorpus& corpus, size_t i, int y0, int x0, int side, bool mirrored, int out_size, float* out) {
  const int h = corpus.heights[i], w = corpus.widths[i];
  const int interpolation = interpolation_for(side, out_size);
  const size_t out_plane = static_cast<size_t>(out_size) * static_cast<size_t>(out_size);
  for (int c = 0; c < 3; ++c) {
    // Views, no copies: the photo's channel plane, and `out`'s plane as the resize target.
    const cv::Mat plane(h, w, CV_32F, const_cast<float*>(corpus.photos[i].data()) + static_cast<size_t>(c) * h * w);
    cv::Mat target(out_size, out_size, CV_32F, out + static_cast<size_t>(c) * out_plane);
    const cv::Mat crop = plane(cv::Rect(x0, y0, side, side));
    if (side == out_size) {
      crop.copyTo(target);
    } else {
      cv::resize(crop, target, target.size(), 0, 0, interpolation);
      for (int y = 0; y < out_size; ++y)
        for (float* v = target.ptr<float>(y); v != target.ptr<float>(y) + out_size; ++v) *v = unit(*v);
    }
    if (mirrored)
      for (int y = 0; y < out_size; ++y) std::reverse(target.ptr<float>(y), target.ptr<float>(y) + out_size);
  }
}

void check_crop(const PhotoCorpus& corpus, int index, int out_size) {
  if (index < 0 || index >= corpus.size())
    throw Error(corpus.source + ": photo " + std::to_string(index) + " is not in the corpus");
  if (out_size < 1) throw Error("photo crop: output size must be >= 1, got " + std::to_string(out_size));
}

}  // namespace

void crop_photo(const PhotoCorpus& corpus, int index, Rng& rng, int out_size, float min_scale, bool flip, float* out) {
  check_crop(corpus, index, out_size);
  if (!(min_scale > 0.0f && min_scale <= 1.0f))
    throw Error("photo crop: minimum scale must be in (0, 1], got " + std::to_string(min_scale));
  const size_t i = static_cast<size_t>(index);
  const int h = corpus.heights[i], w = corpus.widths[i];
  const int short_side = std::min(h, w);
  const double scale = min_scale + (1.0 - min_scale) * rng.uniform();
  const int side = std::clamp(static_cast<int>(std::lround(scale * short_side)), 1, short_side);
  const int y0 = rng.below(h - side + 1);
  const int x0 = rng.below(w - side + 1);
  const bool mirrored = flip && rng.below(2) == 1;
  crop_square(corpus, i, y0, x0, side, mirrored, out_size, out);
}

void centre_crop_photo(const PhotoCorpus& corpus, int index, int out_size, float* out) {
  check_crop(corpus, index, out_size);
  const size_t i = static_cast<size_t>(index);
  const int h = corpus.heights[i], w = corpus.widths[i], side = std::min(h, w);
  crop_square(corpus, i, (h - side) / 2, (w - side) / 2, side, false, out_size, out);
}

void augment_crop_flip(const float* in, int height, int width, int pad, bool flip, Rng& rng, float* out) {
  if (height < 1 || width < 1 || pad < 0)
    throw Error("augment_crop_flip: bad size " + std::to_string(height) + "x" + std::to_string(width) + " pad " +
                std::to_string(pad));
  const int dy = rng.below(2 * pad + 1), dx = rng.below(2 * pad + 1);
  const bool mirrored = flip && rng.below(2) == 1;
  const size_t plane = static_cast<size_t>(height) * static_cast<size_t>(width);
  // The crop reads pixels the write would already have replaced when in == out: read a copy.
  std::vector<float> copy;
  if (in == out) {
    copy.assign(in, in + 3 * plane);
    in = copy.data();
  }
  // out[c][y][x] = padded[c][y + dy][x' + dx] with x' = W-1-x when mirrored, padded = in shifted by pad.
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < height; ++y) {
      const int sy = y + dy - pad;
      float* dst = out + static_cast<size_t>(c) * plane + static_cast<size_t>(y) * static_cast<size_t>(width);
      const bool row_inside = sy >= 0 && sy < height;
      const float* src = in + static_cast<size_t>(c) * plane + static_cast<size_t>(row_inside ? sy : 0) * static_cast<size_t>(width);
      for (int x = 0; x < width; ++x) {
        const int sx = (mirrored ? width - 1 - x : x) + dx - pad;
        dst[x] = row_inside && sx >= 0 && sx < width ? src[sx] : 0.0f;
      }
    }
}

}  // namespace vitlens
