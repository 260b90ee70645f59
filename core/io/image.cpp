// Image loading and preprocessing: decode, RGB float, resize policy, padding, patchify.
#include "core/io/image.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <mutex>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "core/base/error.hpp"
#include "core/io/files.hpp"  // read_whole_file, mebibytes
#include "core/io/image_probe.hpp"

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
  return what + ": not an image file vitlens can read; vitlens reads " + std::string(kImageFormatsRead);
}

std::string megapixels(double pixels) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", pixels / 1e6);
  return buf;
}

std::string size_text(int64_t w, int64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

// [SECTION] The decode, planned from the header

// The size an image of w x h is scaled to so that its long side is at most max_side (0: no
// limit); aspect kept, never up. prepare_image and the loader round the same way.
cv::Size fit_within(int w, int h, int max_side) {
  const int long_side = std::max(w, h);
  if (max_side <= 0 || long_side <= max_side) return {w, h};
  const double f = static_cast<double>(max_side) / long_side;
  return {std::max(1, static_cast<int>(std::lround(w * f))), std::max(1, static_cast<int>(std::lround(h * f)))};
}

// The size the loader gives an image of w x h declared: long side at most max_side, but the
// short side kept at least min_short_side (a centre crop of that side follows) unless the file's
// own is smaller; never up.
cv::Size load_size(int64_t w, int64_t h, int max_side, int min_short_side) {
  const double long_side = static_cast<double>(std::max(w, h)), short_side = static_cast<double>(std::min(w, h));
  double f = long_side > max_side ? max_side / long_side : 1.0;
  if (short_side * f < min_short_side) f = std::min(1.0, min_short_side / short_side);
  if (f >= 1.0) return {static_cast<int>(w), static_cast<int>(h)};
  if (min_short_side <= 0) return fit_within(static_cast<int>(w), static_cast<int>(h), max_side);  // as prepare_image rounds
  return {std::max(1, static_cast<int>(std::lround(static_cast<double>(w) * f))),
          std::max(1, static_cast<int>(std::lround(static_cast<double>(h) * f)))};
}


// One way to run OpenCV's decoder on a file: its imdecode flags, the factor by which the decoder
// itself shrinks the image (libjpeg's DCT scaling: IMREAD_REDUCED_*), and the memory it takes.
struct DecodePlan {
  int flags = cv::IMREAD_UNCHANGED;
  int reduce = 1;      // 1, 2, 4 or 8
  double bytes = 0.0;  // the decoded cv::Mat plus what the codec holds beside it, estimated from the header
};

// Bytes a decode takes, from what the header declares, for a result of `target` pixels. The
// decoded cv::Mat has `channels` samples of `sample_bytes` a pixel; after it come its area
// downscale to `target` and the float RGB result (12 bytes a pixel); beside it, libjpeg keeps every DCT coefficient of a progressive file
// (2 bytes a sample, whatever the reduction), OpenJPEG holds each sample as an int32 in its image
// and again in its tiles, and the float formats decode into a float buffer that is then copied.
double decode_bytes(const ImageProbe& probe, int channels, int sample_bytes, int reduce, cv::Size target) {
  const double pixels = static_cast<double>(probe.width) * static_cast<double>(probe.height);
  const double declared_samples = pixels * std::max(probe.channels, 1);
  const double target_pixels = static_cast<double>(target.width) * target.height;
  double bytes = pixels / (reduce * reduce) * channels * sample_bytes + target_pixels * (channels * sample_bytes + 12);
  if (probe.progressive) bytes += declared_samples * 2;
  if (probe.format == "JPEG 2000") bytes += declared_samples * 8;
  if (probe.float_samples) bytes += declared_samples * 4;
  return bytes;
}

// The cheapest faithful way to decode a file for an image of `target` pixels (load_size):
//  - the file's own depth and channels (IMREAD_UNCHANGED) when that fits kMaxDecodeBytes;
//  - else 8 bits a sample (IMREAD_COLOR, or IMREAD_GRAYSCALE for one channel): libpng, libtiff
//    and the Netpbm reader drop the low byte of 16-bit samples as they decode, and an image this
//    large is downscaled anyway, where 8 bits of a sample are more than the ViT sees;
//  - a JPEG larger than target by a factor of 2, 4 or 8 decoded at that fraction by libjpeg
//    itself (as PIL's draft mode does), still at least target, then downscaled by area.
// Throws vitlens::Error, naming the memory, when even the cheapest decode does not fit.
DecodePlan plan_decode(const ImageProbe& probe, cv::Size target, const std::string& what) {
  const int channels = std::clamp(probe.channels, 1, 4);
  const int sample_bytes = probe.bits > 16 ? 4 : probe.bits > 8 ? 2 : 1;
  DecodePlan plan;
  if (probe.format == "JPEG") {
    for (int k : {8, 4, 2})  // libjpeg's scaled size: the declared size divided by k, rounded up
      if ((probe.width + k - 1) / k >= target.width && (probe.height + k - 1) / k >= target.height) {
        plan.reduce = k;
        break;
      }
    static const int reduced_color[] = {0, 0, cv::IMREAD_REDUCED_COLOR_2, 0, cv::IMREAD_REDUCED_COLOR_4, 0, 0, 0,
                                        cv::IMREAD_REDUCED_COLOR_8};
    static const int reduced_gray[] = {0, 0, cv::IMREAD_REDUCED_GRAYSCALE_2, 0, cv::IMREAD_REDUCED_GRAYSCALE_4, 0, 0, 0,
                                       cv::IMREAD_REDUCED_GRAYSCALE_8};
    if (plan.reduce > 1) plan.flags = channels == 1 ? reduced_gray[plan.reduce] : reduced_color[plan.reduce];
  }
  plan.bytes = decode_bytes(probe, channels, sample_bytes, plan.reduce, target);
  if (plan.bytes <= static_cast<double>(kMaxDecodeBytes)) return plan;
  DecodePlan eight_bit = plan;  // a JPEG has 8-bit samples already
  if (probe.format != "JPEG") {
    eight_bit.flags = channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR;
    eight_bit.bytes = decode_bytes(probe, channels == 1 ? 1 : 3, 1, 1, target);
  }
  if (eight_bit.bytes <= static_cast<double>(kMaxDecodeBytes)) return eight_bit;
  throw Error(what + ": the " + size_text(probe.width, probe.height) + " " + probe.format + " image needs " +
              mebibytes(static_cast<uint64_t>(std::min(plan.bytes, eight_bit.bytes))) +
              " to decode, more than vitlens uses for one image (" + mebibytes(kMaxDecodeBytes) + "); shrink it first");
}

// [SECTION] Decoded pixels -> CV_32FC3 RGB in [0, 1]

// Any decoded cv::Mat (1..4 channels, 8/16-bit or float), already at its loaded size. The
// channels are arranged in the decoded depth (exact: copies and swaps), so the only float image
// made is the result.
cv::Mat to_rgb01(const cv::Mat& decoded, const std::string& what) {
  double scale = 1.0;
  switch (decoded.depth()) {
    case CV_8U: scale = 1.0 / 255.0; break;
    case CV_8S: scale = 1.0 / 127.0; break;
    case CV_16U: scale = 1.0 / 65535.0; break;
    case CV_16S: scale = 1.0 / 32767.0; break;
    case CV_32S: scale = 1.0 / 2147483647.0; break;
    default: scale = 1.0; break;  // float images are taken as [0, 1] and clamped below
  }
  // cvtColor takes 8U, 16U and 32F; other depths become float first.
  cv::Mat samples = decoded;
  const int depth = decoded.depth();
  if (depth != CV_8U && depth != CV_16U && depth != CV_32F) {
    decoded.convertTo(samples, CV_32F, scale);
    scale = 1.0;
  }
  cv::Mat rgb;
  switch (samples.channels()) {
    case 1: cv::cvtColor(samples, rgb, cv::COLOR_GRAY2RGB); break;
    case 2: {  // gray + alpha: keep the gray
      cv::Mat gray;
      cv::extractChannel(samples, gray, 0);
      cv::cvtColor(gray, rgb, cv::COLOR_GRAY2RGB);
      break;
    }
    case 3: cv::cvtColor(samples, rgb, cv::COLOR_BGR2RGB); break;
    case 4: cv::cvtColor(samples, rgb, cv::COLOR_BGRA2RGB); break;  // alpha dropped, as PIL convert("RGB")
    default: throw Error(what + ": images with " + std::to_string(samples.channels()) + " channels are not supported");
  }
  samples.release();
  cv::Mat rgb01;
  rgb.convertTo(rgb01, CV_32F, scale);
  rgb.release();
  cv::patchNaNs(rgb01, 0.0);
  cv::min(rgb01, 1.0, rgb01);
  cv::max(rgb01, 0.0, rgb01);
  return rgb01;
}

// Runs the plan: decode, downscale by area in the decoded depth (so no full-size float copy is
// ever made), then RGB float. A cv::Exception for lack of memory and std::bad_alloc become one
// line naming the memory; any other cv::Exception is a file OpenCV cannot decode.
cv::Mat decode_planned(const unsigned char* bytes, size_t size, const ImageProbe& probe, const DecodePlan& plan,
                       cv::Size target, const std::string& what) {
  const std::string cannot = what + ": damaged or unsupported " + probe.format + " file (OpenCV cannot decode it)";
  const std::string no_memory = what + ": not enough memory to decode the " + size_text(probe.width, probe.height) +
                                " " + probe.format + " image (about " +
                                mebibytes(static_cast<uint64_t>(plan.bytes)) + ")";
  try {
    cv::Mat decoded;
    {
      QuietStderr quiet;
      // A header over the caller's bytes: OpenCV reads them in place, no copy.
      const cv::Mat buffer(1, static_cast<int>(size), CV_8U, const_cast<unsigned char*>(bytes));
      decoded = cv::imdecode(buffer, plan.flags);
    }
    if (decoded.empty()) throw Error(cannot);
    if (decoded.dims != 2 || decoded.rows < 1 || decoded.cols < 1) throw Error(what + ": image has no pixels");
    // The decoder must give what the header declared (reduced): anything else is a damaged file
    // whose size was never checked.
    if (std::abs(decoded.cols - (probe.width + plan.reduce - 1) / plan.reduce) > 1 ||
        std::abs(decoded.rows - (probe.height + plan.reduce - 1) / plan.reduce) > 1)
      throw Error(what + ": damaged " + probe.format + " file: it decodes to " + size_text(decoded.cols, decoded.rows) +
                  " pixels but its header declares " + size_text(probe.width, probe.height));
    if (target != decoded.size()) {
      cv::Mat smaller;
      cv::resize(decoded, smaller, target, 0, 0, cv::INTER_AREA);
      decoded = smaller;
    }
    return to_rgb01(decoded, what);
  } catch (const cv::Exception& e) {
    throw Error(e.code == cv::Error::StsNoMem ? no_memory : cannot);
  } catch (const std::bad_alloc&) {
    throw Error(no_memory);
  }
}

// [SECTION] The working size

// Why an image at working size `target` (from `max_side`, 0 for the native size) is thinner than
// one p x p patch, with the advice that helps: the smallest working size at which it is not (the
// short side grows with the working size), the native size if that is one vitlens works at, or,
// when even kMaxLoadSide is too small, that the image itself must change.
std::string too_thin(const LoadedImage& image, cv::Size target, int max_side, int p) {
  const std::string patch = std::to_string(p) + "x" + std::to_string(p);
  const std::string at = max_side > 0 ? "at working size " + std::to_string(max_side)
                                      : "at its native size, which vitlens caps at " + std::to_string(kMaxLoadSide) + " a side";
  const std::string head = "image " + size_text(image.source_w, image.source_h) + " becomes " +
                           size_text(target.width, target.height) + " " + at + ", thinner than one " + patch + " patch";
  auto fits = [&](int side) {
    const cv::Size s = fit_within(image.source_w, image.source_h, side);
    return s.width >= p && s.height >= p;
  };
  if (!fits(kMaxLoadSide))
    return head + "; it is too thin for the model's patch at any working size (at most " + std::to_string(kMaxLoadSide) +
           "): crop it to a less elongated part first";
  int lo = 1, hi = kMaxLoadSide;  // the smallest side that fits: fits() is false below it, true from it
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (fits(mid)) hi = mid;
    else lo = mid + 1;
  }
  const bool native_fits = std::max(image.source_w, image.source_h) <= kMaxLoadSide;
  return head + "; use a working size of at least " + std::to_string(lo) + " (vitlens export: --size " +
         std::to_string(lo) + (native_fits ? ", or --size 0 for the native size)" : ")");
}

}  // namespace

LoadedImage decode_image(const unsigned char* bytes, size_t size, const std::string& what, int max_side,
                         int min_short_side) {
  if (size == 0) throw Error(what + ": file is empty");
  if (size > kMaxImageFileBytes)
    throw Error(what + ": " + mebibytes(size) + " is more than vitlens reads as an image (" +
                mebibytes(kMaxImageFileBytes) + ")");
  if (max_side <= 0 || max_side > kMaxLoadSide) max_side = kMaxLoadSide;
  // The header first: the declared size is refused before the decoder allocates anything, and a
  // damaged file is named as such instead of decoding into a partly grey picture.
  const ImageProbe probe = probe_image(bytes, size);
  if (probe.format.empty())
    throw Error(undecodable(what, bytes, size));
  if (probe.width == 0 || probe.height == 0)
    throw Error(what + ": " + probe.format + " image declares no pixels (" + size_text(probe.width, probe.height) + ")");
  const double pixels = static_cast<double>(probe.width) * static_cast<double>(probe.height);
  if (probe.width > 0 && probe.height > 0 && pixels > kMaxImagePixels)
    throw Error(what + ": " + probe.format + " image declares " + size_text(probe.width, probe.height) + " pixels (" +
                megapixels(pixels) + " megapixels), more than vitlens reads (" + megapixels(kMaxImagePixels) +
                " megapixels); shrink it first");
  if (!probe.damage.empty()) throw Error(what + ": damaged " + probe.format + " file: " + probe.damage);
  if (probe.width < 0 || probe.height < 0)
    throw Error(what + ": " + probe.format + " header does not give the image size; vitlens reads only images whose "
                "size it can check before decoding");
  const cv::Size target = load_size(probe.width, probe.height, max_side, min_short_side);
  const DecodePlan plan = plan_decode(probe, target, what);
  LoadedImage out;
  out.rgb01 = decode_planned(bytes, size, probe, plan, target, what);
  out.source_w = static_cast<int>(probe.width);
  out.source_h = static_cast<int>(probe.height);
  return out;
}

cv::Mat decode_image_rgb(const unsigned char* bytes, size_t size, const std::string& what) {
  return decode_image(bytes, size, what).rgb01;
}

LoadedImage load_image(const std::string& path, int max_side, int min_short_side) {
  const std::string bytes = read_whole_file(path, "an image file", kMaxImageFileBytes);
  return decode_image(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), path, max_side,
                      min_short_side);
}

cv::Mat load_image_rgb(const std::string& path) { return load_image(path).rgb01; }

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
  return prepare_image(LoadedImage{rgb01, rgb01.cols, rgb01.rows}, config, max_side, what);
}

PreparedImage prepare_image(const LoadedImage& image, const VitConfig& config, int max_side, const std::string& what) {
  const cv::Mat& rgb01 = image.rgb01;
  if (rgb01.type() != CV_32FC3) throw Error(what + ": internal: expected a CV_32FC3 image");
  const int p = config.patch_size;
  PreparedImage out;
  out.source_w = image.source_w;
  out.source_h = image.source_h;
  if (image.source_w < p || image.source_h < p)
    throw Error(what + ": image is " + size_text(image.source_w, image.source_h) + ", smaller than one " +
                std::to_string(p) + "x" + std::to_string(p) + " patch");
  if (max_side < 0) throw Error(what + ": working size must be >= 0");

  // The working size from the file's own size; the pixels come from the loaded copy, which is
  // at least that large (it was reduced to at most kMaxLoadSide, never below a working size).
  const bool model_size = image.source_h == config.img_h && image.source_w == config.img_w;
  const cv::Size target = model_size ? rgb01.size() : fit_within(image.source_w, image.source_h,
                                                                  max_side > 0 ? max_side : kMaxLoadSide);
  // Checked whether or not this call resizes: the loader may have reduced the image already.
  if (target.width < p || target.height < p) throw Error(what + ": " + too_thin(image, target, max_side, p));
  cv::Mat content = rgb01;
  if (target != rgb01.size()) cv::resize(rgb01, content, target, 0, 0, cv::INTER_AREA);
  out.resized = target.width != image.source_w || target.height != image.source_h;
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
