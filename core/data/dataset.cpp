// Training data: Fashion-MNIST IDX files, ImageFolder trees, the photo corpus, the seeded
// generator and the augmentations. Legend: n = images, C = classes, H x W = image size, S = side.
#include "core/data/dataset.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <tuple>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <opencv2/imgproc.hpp>
#include <zlib.h>

#include "core/base/error.hpp"
#include "core/io/files.hpp"  // read_whole_file
#include "core/io/image.hpp"

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

// ---------------------------------------------------------------------------------------------
// DataWalker: the one walk of a data folder (see dataset.hpp for the rules and why).
// ---------------------------------------------------------------------------------------------

namespace {

using FileId = std::pair<dev_t, ino_t>;

bool hidden_name(const char* name) { return name[0] == '.'; }

// The canonical path (every link resolved), or "" when it cannot be resolved.
std::string real_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (!resolved) return "";
  std::string out = resolved;
  std::free(resolved);
  return out;
}

bool inside(const std::string& real, const std::string& root_real) {
  if (real.empty() || root_real.empty()) return false;
  if (root_real == "/") return true;
  return real.compare(0, root_real.size(), root_real) == 0 &&
         (real.size() == root_real.size() || real[root_real.size()] == '/');
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

DataWalker::DataWalker(std::string data_root, long max_entries)
    : data_root_(std::move(data_root)), max_entries_(max_entries) {}

FolderWalk DataWalker::walk(const std::string& folder, bool recursive) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    const int err = errno;
    throw Error(folder + (err == ENOENT ? ": no such folder" : ": cannot open the folder (" + errno_text(err) + ")"));
  }
  if (!S_ISDIR(st.st_mode)) throw Error(folder + ": not a folder");
  const std::string root_real = real_path(folder);
  std::set<FileId> seen_folders{{st.st_dev, st.st_ino}};
  std::set<FileId> seen_files;
  std::vector<std::tuple<fs::path, dev_t, ino_t>> found;  // every regular file reached, with its identity
  FolderWalk out;
  // Depth first, names in byte order: the folder a link and its target both reach is read under
  // the same path every time. An explicit stack, so a deep tree cannot exhaust the call stack.
  std::vector<std::string> pending{folder};
  while (!pending.empty()) {
    const std::string dir = std::move(pending.back());
    pending.pop_back();
    DIR* d = ::opendir(dir.c_str());
    if (!d) {
      const std::string line = dir + ": cannot read the folder (" + errno_text(errno) + ")";
      if (dir == folder) throw Error(line);
      out.skipped.push_back(line);
      continue;
    }
    struct Closer {
      DIR* d;
      ~Closer() { ::closedir(d); }
    } closer{d};
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      // Every entry counts, hidden ones too: reading them is what takes the time.
      if (++entries_ > max_entries_)
        throw Error(data_root_ + ": holds more than " + std::to_string(max_entries_) +
                    " files and folders, the most vitlens reads from one data folder (stopped in " + dir + ")");
      if (!hidden_name(e->d_name)) names.emplace_back(e->d_name);
      errno = 0;
    }
    if (errno != 0) {
      const std::string line = dir + ": cannot read the folder (" + errno_text(errno) + ")";
      if (dir == folder) throw Error(line);
      out.skipped.push_back(line);
      continue;
    }
    std::sort(names.begin(), names.end());
    std::vector<std::string> subfolders;
    for (const std::string& name : names) {
      const std::string path = !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
      struct stat link {};
      if (::fstatat(::dirfd(d), name.c_str(), &link, AT_SYMLINK_NOFOLLOW) != 0) {
        out.skipped.push_back(path + ": cannot read (" + errno_text(errno) + ")");
        continue;
      }
      struct stat target = link;
      const bool is_link = S_ISLNK(link.st_mode);
      if (is_link && ::fstatat(::dirfd(d), name.c_str(), &target, 0) != 0) {
        const int err = errno;
        out.skipped.push_back(path + (err == ELOOP   ? ": a link in a loop of links"
                                      : err == ENOENT ? ": a broken link (its target does not exist)"
                                                      : ": a link that cannot be followed (" + errno_text(err) + ")"));
        continue;
      }
      if (S_ISDIR(target.st_mode)) {
        if (is_link) {
          const std::string real = real_path(path);
          if (!inside(real, root_real)) {
            out.links_outside.push_back(path + ": a link to " + (real.empty() ? "a folder" : real) + ", outside " + folder);
            continue;
          }
        }
        if (!recursive) {
          out.folders.push_back(path);
          continue;
        }
        // Read already (an ancestor: a loop; or reached through another link): nothing new there.
        if (!seen_folders.insert({target.st_dev, target.st_ino}).second) continue;
        subfolders.push_back(path);
      } else if (S_ISREG(target.st_mode)) {
        found.emplace_back(path, target.st_dev, target.st_ino);
      } else {
        out.skipped.push_back(path + ": not a regular file (a device, pipe or socket), not an image");
      }
    }
    for (auto it = subfolders.rbegin(); it != subfolders.rend(); ++it) pending.push_back(std::move(*it));
  }
  // fs::path order (component by component), as the files were always listed: a run resumed
  // from a checkpoint sees its images in the same order.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  for (const auto& [path, dev, ino] : found)
    if (seen_files.insert({dev, ino}).second) out.files.push_back(path.string());
  return out;
}

std::string links_outside_warning(const FolderReport& report) {
  if (report.links_outside == 0) return "";
  return "not following " + std::to_string(report.links_outside) + " link" + (report.links_outside == 1 ? "" : "s") +
         " to a folder outside the data folder (" + report.first_link_outside + ")";
}

// ---------------------------------------------------------------------------------------------
// ImageFolder and the photo corpus
// ---------------------------------------------------------------------------------------------

namespace {

void note_skip(FolderReport* report, const std::string& message) {
  if (!report) return;
  ++report->skipped;
  if (report->examples.size() < 5) report->examples.push_back(message);
}

// What a walk left out goes into the report: the same lines the user sees for unreadable images.
void note_walk(FolderReport* report, const FolderWalk& walk) {
  for (const std::string& line : walk.skipped) note_skip(report, line);
  if (!report) return;
  if (report->links_outside == 0 && !walk.links_outside.empty()) report->first_link_outside = walk.links_outside[0];
  report->links_outside += static_cast<int>(walk.links_outside.size());
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

void require_folder(const std::string& dir, const std::string& what) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;  // EACCES or a loop of links is not "no such folder"
    if (err == ENOENT) throw Error(dir + ": no such folder (" + what + ")");
    throw Error(dir + ": cannot open the folder (" + errno_text(err) + ")");
  }
  if (!S_ISDIR(st.st_mode)) throw Error(dir + ": not a folder (" + what + ")");
}

}  // namespace

ImageSet load_image_folder(const std::string& dir, int img_size, FolderReport* report) {
  if (img_size < 1 || img_size > 4096)
    throw Error(dir + ": image size must be 1 to 4096 px, got " + std::to_string(img_size));
  require_folder(dir, "expected one subfolder of images per class");
  DataWalker walker(dir);
  const FolderWalk top = walker.walk(dir, false);
  note_walk(report, top);
  // Byte order of the names (the walk's order), as Python's sorted() in torchvision's find_classes.
  std::vector<fs::path> class_dirs(top.folders.begin(), top.folders.end());
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
    const FolderWalk walk = walker.walk(class_dirs[c].string(), true);
    note_walk(report, walk);
    const std::vector<std::string>& files = walk.files;
    if (files.empty()) throw Error(class_dirs[c].string() + ": class folder '" + name + "' is empty; put images in it or remove it");
    int kept = 0;
    for (const std::string& file : files) {
      cv::Mat rgb;
      try {
        rgb = load_image(file, kMaxLoadSide, img_size).rgb01;  // short side kept for the crop
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
  DataWalker walker(dir);
  const FolderWalk walk = walker.walk(dir, true);
  note_walk(report, walk);
  for (const std::string& file : walk.files) {
    cv::Mat rgb;
    try {
      rgb = load_image(file, max_side).rgb01;  // capped at max_side by the loader, by area
    } catch (const Error& e) {
      note_skip(report, e.what());
      continue;
    }
    std::vector<float> planar(3 * static_cast<size_t>(rgb.rows) * static_cast<size_t>(rgb.cols));
    append_planar(rgb, planar.data());
    corpus.photos.push_back(std::move(planar));
    corpus.heights.push_back(rgb.rows);
    corpus.widths.push_back(rgb.cols);
    corpus.names.push_back(fs::path(file).lexically_relative(dir).string());  // "a.jpg", "sub/b.jpg"
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
