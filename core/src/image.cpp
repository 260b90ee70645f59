// Image loading and preprocessing: decode, RGB float, resize policy, padding, patchify.
#include "vitlens/image.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <mutex>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "vitlens/error.hpp"
#include "vitlens/image_probe.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace vitlens {

namespace {

// libpng and libjpeg print their own complaints ("libpng error: ...") straight to stderr while
// OpenCV decodes. vitlens reports a bad image in one line of its own, so their chatter is
// routed to /dev/null for the duration of a decode. File descriptor 2 belongs to the whole
// process, so decodes on several threads take turns (one lock), or the second would save and
// later restore the first one's /dev/null.
std::mutex& stderr_redirect_lock() {
  static std::mutex lock;
  return lock;
}

class QuietStderr {
 public:
  QuietStderr() : hold_(stderr_redirect_lock()) {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (saved_ >= 0 && null_fd >= 0) ::dup2(null_fd, STDERR_FILENO);
    if (null_fd >= 0) ::close(null_fd);
  }
  ~QuietStderr() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      ::dup2(saved_, STDERR_FILENO);
      ::close(saved_);
    }
  }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

 private:
  std::lock_guard<std::mutex> hold_;
  int saved_ = -1;
};

// What Debian 12's OpenCV decodes, named when a file is refused (GIF, SVG, HEIC ... are not).

std::string undecodable(const std::string& what, const unsigned char* bytes, size_t size) {
  // Formats users often try get named: OpenCV 4.6 has no GIF reader at all.
  if (bytes && size >= 6 && std::equal(bytes, bytes + 4, "GIF8"))
    return what + ": GIF images cannot be read; vitlens reads " + std::string(kImageFormatsRead) + " (convert it, e.g. to PNG)";
  return what + ": not an image vitlens reads (" + std::string(kImageFormatsRead) + ")";
}

// Any decoded cv::Mat (1..4 channels, 8/16-bit or float) -> CV_32FC3 RGB in [0, 1].
cv::Mat to_rgb01(const cv::Mat& decoded, const std::string& what) {
  if (decoded.empty()) throw Error(undecodable(what, nullptr, 0));
  if (decoded.dims != 2 || decoded.rows < 1 || decoded.cols < 1) throw Error(what + ": image has no pixels");
  // A small compressed file can hold a huge image; its float copy takes 12 bytes a pixel.
  const double pixels = static_cast<double>(decoded.rows) * decoded.cols;
  if (pixels > kMaxImagePixels)
    throw Error(what + ": image is " + std::to_string(decoded.cols) + "x" + std::to_string(decoded.rows) + " (" +
                std::to_string(static_cast<long long>(pixels / 1e6)) + " megapixels), more than vitlens reads (" +
                std::to_string(static_cast<long long>(kMaxImagePixels / 1e6)) + " megapixels); shrink it first");
  double scale = 1.0;
  switch (decoded.depth()) {
    case CV_8U: scale = 1.0 / 255.0; break;
    case CV_8S: scale = 1.0 / 127.0; break;
    case CV_16U: scale = 1.0 / 65535.0; break;
    case CV_16S: scale = 1.0 / 32767.0; break;
    case CV_32S: scale = 1.0 / 2147483647.0; break;
    default: scale = 1.0; break;  // float images are taken as [0, 1] and clamped below
  }
  cv::Mat as_float;
  decoded.convertTo(as_float, CV_32F, scale);
  cv::Mat rgb;
  switch (as_float.channels()) {
    case 1: cv::cvtColor(as_float, rgb, cv::COLOR_GRAY2RGB); break;
    case 2: {  // gray + alpha: keep the gray
      cv::Mat gray;
      cv::extractChannel(as_float, gray, 0);
      cv::cvtColor(gray, rgb, cv::COLOR_GRAY2RGB);
      break;
    }
    case 3: cv::cvtColor(as_float, rgb, cv::COLOR_BGR2RGB); break;
    case 4: cv::cvtColor(as_float, rgb, cv::COLOR_BGRA2RGB); break;  // alpha dropped, as PIL convert("RGB")
    default: throw Error(what + ": images with " + std::to_string(as_float.channels()) + " channels are not supported");
  }
  cv::patchNaNs(rgb, 0.0);
  cv::min(rgb, 1.0, rgb);
  cv::max(rgb, 0.0, rgb);
  return rgb;
}

std::string megapixels(double pixels) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", pixels / 1e6);
  return buf;
}

// Whole MiB, or bytes below one.
std::string mebibytes(uint64_t bytes) {
  return bytes < (1u << 20) ? std::to_string(bytes) + " bytes" : std::to_string(bytes >> 20) + " MiB";
}

}  // namespace

cv::Mat decode_image_rgb(const unsigned char* bytes, size_t size, const std::string& what) {
  if (size == 0) throw Error(what + ": file is empty");
  if (size > kMaxImageFileBytes)
    throw Error(what + ": " + mebibytes(size) + " is more than vitlens reads as an image (" +
                mebibytes(kMaxImageFileBytes) + ")");
  // The header first: the declared size is refused before the decoder allocates anything, and a
  // damaged file is named as such instead of decoding into a partly grey picture.
  const ImageProbe probe = probe_image(bytes, size);
  if (probe.format.empty())
    throw Error(undecodable(what, bytes, size));
  if (probe.width == 0 || probe.height == 0)
    throw Error(what + ": " + probe.format + " image declares no pixels (" + std::to_string(probe.width) + "x" +
                std::to_string(probe.height) + ")");
  const double pixels = static_cast<double>(probe.width) * static_cast<double>(probe.height);
  if (probe.width > 0 && probe.height > 0 && pixels > kMaxImagePixels)
    throw Error(what + ": " + probe.format + " image declares " + std::to_string(probe.width) + "x" +
                std::to_string(probe.height) + " pixels (" + megapixels(pixels) +
                " megapixels), more than vitlens reads (" + megapixels(kMaxImagePixels) + " megapixels); shrink it first");
  if (!probe.damage.empty()) throw Error(what + ": damaged " + probe.format + " file: " + probe.damage);
  if (probe.width < 0 || probe.height < 0)
    throw Error(what + ": " + probe.format + " header does not give the image size; vitlens reads only images whose "
                "size it can check before decoding");
  cv::Mat decoded;
  try {
    QuietStderr quiet;
    // A header over the caller's bytes: OpenCV reads them in place, no copy.
    const cv::Mat buffer(1, static_cast<int>(size), CV_8U, const_cast<unsigned char*>(bytes));
    decoded = cv::imdecode(buffer, cv::IMREAD_UNCHANGED | cv::IMREAD_ANYDEPTH);
  } catch (const cv::Exception&) {
    throw Error(what + ": damaged or unsupported " + probe.format + " file (OpenCV cannot decode it)");
  }
  if (decoded.empty()) throw Error(what + ": damaged or unsupported " + probe.format + " file (OpenCV cannot decode it)");
  return to_rgb01(decoded, what);
}

std::string read_whole_file(const std::string& path, const std::string& kind, uint64_t max_bytes) {
  {  // before opening: opening a pipe would wait for a writer
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open " + kind + " (no such file)");
    if (S_ISDIR(st.st_mode)) throw Error(path + ": is a folder, not " + kind);
    if (!S_ISREG(st.st_mode)) throw Error(path + ": is not a regular file (a device or pipe?), not " + kind);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open " + kind + " (" + std::strerror(errno) + ")");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(path + ": cannot read " + kind + " (" + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) throw Error(path + ": is a folder, not " + kind);
  if (!S_ISREG(st.st_mode)) throw Error(path + ": is not a regular file (a device or pipe?), not " + kind);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    throw Error(path + ": " + mebibytes(size) + " is larger than any " + kind.substr(kind.find(' ') + 1) +
                " vitlens can use (at most " + mebibytes(max_bytes) + "); nothing was read");
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    throw Error(path + ": not enough memory to read " + kind + " of " + mebibytes(size));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, &bytes[done], bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": read error (" + std::string(std::strerror(errno)) + ")");
    }
    if (n == 0) throw Error(path + ": the file shrank while it was read (" + std::to_string(done) + " of " +
                            std::to_string(bytes.size()) + " bytes)");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

cv::Mat load_image_rgb(const std::string& path) {
  const std::string bytes = read_whole_file(path, "an image file", kMaxImageFileBytes);
  return decode_image_rgb(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), path);
}

int default_max_side(const VitConfig& config) { return std::max(config.img_h, config.img_w); }

MatRM patchify(const cv::Mat& rgb01, const VitConfig& config) {
  const int p = config.patch_size;
  const int gh = rgb01.rows / p, gw = rgb01.cols / p;
  MatRM patches(gh * gw, 3 * p * p);  // (gh*gw, 3*P*P)
  for (int pr = 0; pr < gh; ++pr)
    for (int pc = 0; pc < gw; ++pc) {
      float* dst = patches.row(pr * gw + pc).data();
      // channel-major (c, y, x), the order of Conv2d weight (D, 3, P, P)
      for (int c = 0; c < 3; ++c)
        for (int y = 0; y < p; ++y) {
          const cv::Vec3f* src = rgb01.ptr<cv::Vec3f>(pr * p + y) + pc * p;
          for (int x = 0; x < p; ++x)
            *dst++ = (src[x][c] - config.mean[static_cast<size_t>(c)]) / config.std[static_cast<size_t>(c)];
        }
    }
  return patches;
}

PreparedImage prepare_image(const cv::Mat& rgb01, const VitConfig& config, int max_side, const std::string& what) {
  if (rgb01.type() != CV_32FC3) throw Error(what + ": internal: expected a CV_32FC3 image");
  const int p = config.patch_size;
  PreparedImage out;
  out.source_w = rgb01.cols;
  out.source_h = rgb01.rows;
  if (rgb01.cols < p || rgb01.rows < p)
    throw Error(what + ": image is " + std::to_string(rgb01.cols) + "x" + std::to_string(rgb01.rows) +
                ", smaller than one " + std::to_string(p) + "x" + std::to_string(p) + " patch");
  if (max_side < 0) throw Error(what + ": working size must be >= 0");

  cv::Mat content = rgb01;
  const bool model_size = rgb01.rows == config.img_h && rgb01.cols == config.img_w;
  const int long_side = std::max(rgb01.cols, rgb01.rows);
  if (!model_size && max_side > 0 && long_side > max_side) {
    const double f = static_cast<double>(max_side) / long_side;
    const int w = std::max(1, static_cast<int>(std::lround(rgb01.cols * f)));
    const int h = std::max(1, static_cast<int>(std::lround(rgb01.rows * f)));
    if (w < p || h < p)
      throw Error(what + ": image " + std::to_string(rgb01.cols) + "x" + std::to_string(rgb01.rows) +
                  " becomes " + std::to_string(w) + "x" + std::to_string(h) + " at working size " +
                  std::to_string(max_side) + ", thinner than one patch; use a larger working size (vitlens export: --size, or --size 0 for the native size)");
    cv::resize(rgb01, content, cv::Size(w, h), 0, 0, cv::INTER_AREA);
    out.resized = true;
  }
  out.content_w = content.cols;
  out.content_h = content.rows;
  const int gh = (content.rows + p - 1) / p, gw = (content.cols + p - 1) / p;
  out.padded_w = gw * p;
  out.padded_h = gh * p;
  if (out.padded_w == content.cols && out.padded_h == content.rows) {
    out.rgb = content.clone();
  } else {
    cv::copyMakeBorder(content, out.rgb, 0, out.padded_h - content.rows, 0, out.padded_w - content.cols,
                       cv::BORDER_CONSTANT, cv::Scalar(0, 0, 0));
  }
  out.grid.grid_h = gh;
  out.grid.grid_w = gw;
  out.grid.patches = patchify(out.rgb, config);
  // A patch holding any padded pixel is a padding patch: its embedding mixes in made-up pixels.
  out.grid.patch_is_padding.assign(static_cast<size_t>(gh * gw), 0);
  for (int r = 0; r < gh; ++r)
    for (int c = 0; c < gw; ++c)
      if ((r + 1) * p > content.rows || (c + 1) * p > content.cols)
        out.grid.patch_is_padding[static_cast<size_t>(r * gw + c)] = 1;
  return out;
}

}  // namespace vitlens
