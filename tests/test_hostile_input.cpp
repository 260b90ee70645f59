// Hostile and broken input: decompression bombs refused from the header, damaged images
// named as damaged, oversized files refused before reading, temporaries removed on SIGINT /
// SIGTERM and by the next run, one image's outputs all-or-nothing, long stems, streamed --raw.
#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <dirent.h>
#include <grp.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "process_support.hpp"
#include "test_support.hpp"
#include "core/base/error.hpp"
#include "core/render/export.hpp"
#include "core/render/export_layers.hpp"
#include "core/io/files.hpp"
#include "core/io/image.hpp"
#include "core/io/image_probe.hpp"
#include "models/safetensors.hpp"

using namespace vitlens;

namespace {

using test::Child;
using test::entries;
using test::hidden_entries;
using test::reap;
using test::slurp;
using test::spawn;
using test::spit;

// ---- PNG made by hand: the bomb ----
uint32_t crc32_of(const std::string& bytes) {  // the PNG / zlib CRC-32 (polynomial 0xEDB88320)
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string png_chunk(const std::string& type, const std::string& data) {
  return be32(static_cast<uint32_t>(data.size())) + type + data + be32(crc32_of(type + data));
}

// A valid PNG header declaring width x height, with an IDAT holding a real zlib stream (stored
// blocks) of the first rows of zeros, and IEND: a few kilobytes that decode to gigabytes.
std::string bomb_png(uint32_t width, uint32_t height, int depth, int color_type, int channels) {
  std::string ihdr = be32(width) + be32(height);
  ihdr += static_cast<char>(depth);
  ihdr += static_cast<char>(color_type);
  ihdr += std::string(3, '\0');  // deflate, adaptive filtering, no interlace
  const size_t row = 1 + static_cast<size_t>(width) * static_cast<size_t>(channels) * static_cast<size_t>(depth / 8);
  const std::string raw(std::min<size_t>(row * 2, 65535), '\0');  // two rows (filter byte + zeros)
  std::string z = "\x78\x01";                                        // zlib header, no dictionary
  z += '\0';                                                         // stored block, not final
  z += static_cast<char>(raw.size() & 0xff);
  z += static_cast<char>(raw.size() >> 8);
  z += static_cast<char>(~raw.size() & 0xff);
  z += static_cast<char>((~raw.size() >> 8) & 0xff);
  z += raw;
  return std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) + png_chunk("IDAT", z) + png_chunk("IEND", "");
}

using test::raise_own_peak_rss;
using test::run_vitlens;
using test::run_measured;

struct Setup {
  std::string dir = test::temp_dir("hostile");
  std::string model = dir + "/model.safetensors";
  std::string image = dir + "/photo.png";
  VitModel loaded;
  Setup() {
    const VitConfig c = test::small_config(16, true, 2);
    save_model(model, c, test::random_tensors(c, 23));
    loaded = load_model(model);
    cv::Mat img(18, 22, CV_8UC3);
    cv::randu(img, 0, 255);
    REQUIRE(cv::imwrite(image, img));
  }
};

// Every visible file of a folder: name -> bytes; JSON files without their run-specific fields.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const std::string& name : entries(dir)) {
    if (name[0] == '.') continue;  // temporaries and commit folders: counted by hidden_entries
    std::string bytes = slurp(dir + "/" + name);
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) {
      nlohmann::json j = nlohmann::json::parse(bytes);
      j.erase("timings_ms");
      j.erase("set");
      for (auto& f : j["files"]) f = f.get<std::string>().substr(f.get<std::string>().find_last_of('/') + 1);
      bytes = j.dump();
    }
    files[name] = bytes;
  }
  return files;
}

// A real camera photo (a baseline JPEG), read where Debian's opencv-doc package puts it: third-party
// photos are never copied into the repository. scripts/setup.sh installs the package.
const char* const kRealPhoto = "/usr/share/doc/opencv-doc/examples/data/fruits.jpg";
std::string real_photo() {
  std::ifstream probe(kRealPhoto, std::ios::binary);
  if (!probe) FAIL(kRealPhoto << " is missing: install the Debian package opencv-doc (scripts/setup.sh does)");
  return slurp(kRealPhoto);
}

}  // namespace

// =============================================================================================
TEST_CASE("image headers: the declared size of every format OpenCV writes, read before decoding", "[image][probe]") {
  cv::Mat img(37, 53, CV_8UC3);
  cv::randu(img, 0, 255);
  cv::Mat gray;
  cv::extractChannel(img, gray, 0);
  cv::Mat as_float;
  img.convertTo(as_float, CV_32F, 1.0 / 255);
  struct Case {
    const char* ext;
    cv::Mat pixels;
    std::string format;
    std::vector<int> params;
  };
  const std::vector<Case> cases = {
      {".png", img, "PNG", {}},
      {".jpg", img, "JPEG", {}},
      {".jpg", img, "JPEG", {cv::IMWRITE_JPEG_PROGRESSIVE, 1}},
      {".bmp", img, "BMP", {}},
      {".tiff", img, "TIFF", {}},
      {".tiff", as_float, "TIFF", {}},
      {".webp", img, "WebP", {cv::IMWRITE_WEBP_QUALITY, 80}},
      {".webp", img, "WebP", {cv::IMWRITE_WEBP_QUALITY, 101}},  // lossless
      {".ppm", img, "PPM", {}},
      {".pgm", gray, "PGM", {}},
      {".pbm", gray, "PBM", {}},
      {".pam", img, "PAM", {}},
      {".pfm", as_float, "PFM", {}},
      {".ras", img, "Sun raster", {}},
      {".hdr", as_float, "Radiance HDR", {}},
      {".jp2", img, "JPEG 2000", {}},
  };
  const std::string dir = test::temp_dir("probe");
  for (const Case& c : cases) {
    INFO(c.ext << " " << c.format);
    std::vector<unsigned char> bytes;
    REQUIRE(cv::imencode(c.ext, c.pixels, bytes, c.params));
    const ImageProbe p = probe_image(bytes.data(), bytes.size());
    CHECK(p.format == c.format);
    CHECK(p.width == 53);
    CHECK(p.height == 37);
    CHECK(p.damage.empty());
    // The whole file loads, at the size OpenCV decodes (the independent reference).
    const std::string path = dir + "/whole" + c.ext;
    spit(path, std::string(bytes.begin(), bytes.end()));
    const cv::Mat loaded = load_image_rgb(path);
    CHECK(loaded.cols == 53);
    CHECK(loaded.rows == 37);
  }
}

TEST_CASE("decompression bombs are refused from the header, before any decoding", "[image][bomb]") {
  const std::string dir = test::temp_dir("bomb");
  // 30000 x 30000 8-bit RGB: 900 megapixels, 2.7 GB decoded, from a file of a few kilobytes.
  const std::string rgb = bomb_png(30000, 30000, 8, 2, 3);
  CHECK(rgb.size() < 70000);
  const ImageProbe p = probe_image(reinterpret_cast<const unsigned char*>(rgb.data()), rgb.size());
  CHECK(p.width == 30000);
  CHECK(p.height == 30000);
  CHECK(p.damage.empty());  // a well-formed file: it is the size that is refused
  spit(dir + "/bomb.png", rgb);
  CHECK_THROWS_WITH(load_image_rgb(dir + "/bomb.png"),
                    Catch::Contains("bomb.png") && Catch::Contains("declares 30000x30000") &&
                        Catch::Contains("900 megapixels") && Catch::Contains("120 megapixels"));
  // 16-bit RGBA: 8 bytes a pixel, 7.2 GB decoded.
  spit(dir + "/bomb16.png", bomb_png(30000, 30000, 16, 6, 4));
  CHECK_THROWS_WITH(load_image_rgb(dir + "/bomb16.png"), Catch::Contains("declares 30000x30000"));
  // A JPEG whose frame header declares 60000 x 60000.
  cv::Mat small(8, 8, CV_8UC3, cv::Scalar(10, 20, 30));
  std::vector<unsigned char> jpg;
  REQUIRE(cv::imencode(".jpg", small, jpg));
  bool patched = false;
  for (size_t i = 2; i + 8 < jpg.size() && !patched; ++i)
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) {  // SOF0: length, precision, height, width
      jpg[i + 5] = jpg[i + 7] = 0xEA;
      jpg[i + 6] = jpg[i + 8] = 0x60;
      patched = true;
    }
  REQUIRE(patched);
  spit(dir + "/bomb.jpg", std::string(jpg.begin(), jpg.end()));
  CHECK_THROWS_WITH(load_image_rgb(dir + "/bomb.jpg"), Catch::Contains("declares 60000x60000"));

  // End to end: one line, and the process never grows by the decoded size (peak RSS of the
  // child; decoding the first bomb alone would take 2.7 GB), even when this process peaked higher.
  Setup s;
  raise_own_peak_rss(512);
  const Child c = run_vitlens({"export", dir + "/bomb.png", "--model", s.model, "--out", dir});
  CHECK(c.code == 1);
  CHECK(c.err == "vitlens: " + dir + "/bomb.png: PNG image declares 30000x30000 pixels (900 megapixels), more than "
                 "vitlens reads (120 megapixels); shrink it first\n");
  CHECK(c.max_rss_kb < 200 * 1024);
}

TEST_CASE("damaged images are reported as damaged, never exported as a partly grey picture", "[image][damaged]") {
  const std::string dir = test::temp_dir("damaged");
  const std::string photo = real_photo();
  REQUIRE(photo.size() > 10000);
  const cv::Mat whole = cv::imdecode(std::vector<unsigned char>(photo.begin(), photo.end()), cv::IMREAD_COLOR);
  REQUIRE(whole.cols == 512);
  std::vector<unsigned char> progressive, png;
  REQUIRE(cv::imencode(".jpg", whole, progressive, {cv::IMWRITE_JPEG_PROGRESSIVE, 1}));
  REQUIRE(cv::imencode(".png", whole, png));
  const std::vector<std::pair<std::string, std::string>> files = {
      {"baseline.jpg", photo},
      {"progressive.jpg", std::string(progressive.begin(), progressive.end())},
      {"photo.png", std::string(png.begin(), png.end())}};
  for (const auto& [name, bytes] : files) {
    // The whole file loads, and so does one with bytes after its end marker (cameras append some).
    spit(dir + "/" + name, bytes);
    const cv::Mat ok = load_image_rgb(dir + "/" + name);
    CHECK(ok.cols == 512);
    spit(dir + "/tail_" + name, bytes + "trailing bytes");
    CHECK(load_image_rgb(dir + "/tail_" + name).cols == 512);
    for (double keep : {0.999, 0.9, 0.5, 0.1}) {
      const size_t cut = static_cast<size_t>(static_cast<double>(bytes.size()) * keep);
      const std::string path = dir + "/cut" + std::to_string(cut) + "_" + name;
      spit(path, bytes.substr(0, cut));
      INFO(path);
      CHECK_THROWS_WITH(load_image_rgb(path), Catch::Contains(path) && Catch::Contains("damaged") &&
                                                  Catch::Contains("truncated"));
    }
  }
  // Why the check is needed: OpenCV alone decodes a cut JPEG "successfully" (grey below the cut).
  const std::string cut = photo.substr(0, photo.size() / 2);
  CHECK_FALSE(cv::imdecode(std::vector<unsigned char>(cut.begin(), cut.end()), cv::IMREAD_COLOR).empty());
  // End to end: the CLI exports nothing for it and says so in one line.
  Setup s;
  spit(s.dir + "/cut.jpg", cut);
  const Child c = run_vitlens({"export", s.dir + "/cut.jpg", "--model", s.model, "--out", s.dir, "--quiet"});
  CHECK(c.code == 1);
  CHECK(c.err == "vitlens: " + s.dir + "/cut.jpg: damaged JPEG file: the file ends before its end-of-image marker (truncated)\n");
  CHECK_FALSE(std::ifstream(s.dir + "/cut.json").good());
}

TEST_CASE("files larger than any image or model vitlens can use are refused before reading", "[image][limits]") {
  const std::string dir = test::temp_dir("huge");
  // Sparse files: the size without the disk space.
  auto sparse = [&](const std::string& name, off_t size, const std::string& start) {
    const std::string path = dir + "/" + name;
    spit(path, start);
    REQUIRE(::truncate(path.c_str(), size) == 0);
    return path;
  };
  const std::string image = sparse("big.png", off_t{3} << 30, std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK_THROWS_WITH(load_image_rgb(image), Catch::Contains("big.png") && Catch::Contains("3072 MiB") &&
                                               Catch::Contains("at most 2000 MiB") && Catch::Contains("nothing was read"));
  const std::string model = sparse("big.safetensors", off_t{9} << 30, std::string(8, '\0'));
  CHECK_THROWS_WITH(read_safetensors(model), Catch::Contains("big.safetensors") && Catch::Contains("9216 MiB") &&
                                                  Catch::Contains("at most 8192 MiB"));
  // The limit is the argument: a file one byte over it is refused, one at it is read whole.
  const std::string small = dir + "/small.bin";
  spit(small, "0123456789");
  CHECK_THROWS_WITH(read_whole_file(small, "a test file", 9), Catch::Contains("larger than any test file"));
  CHECK(read_whole_file(small, "a test file", 10) == "0123456789");
}

// ---- the hostile-image suite: every format OpenCV reads here, whole, cut and bit-flipped ----
namespace {

// Deflate bits (RFC 1951): values LSB first, Huffman codes MSB first.
struct DeflateBits {
  std::string out;
  uint32_t acc = 0;
  int count = 0;
  void put(uint32_t bits, int n) {
    acc |= bits << count;
    count += n;
    for (; count >= 8; count -= 8, acc >>= 8) out += static_cast<char>(acc & 0xff);
  }
  void code(uint32_t c, int n) {
    uint32_t reversed = 0;
    for (int i = 0; i < n; ++i) reversed |= ((c >> i) & 1u) << (n - 1 - i);
    put(reversed, n);
  }
};

// A valid PNG of width x height whose pixels are all zero, compressed for real (one fixed-Huffman
// deflate block: a zero, then copies of 258 bytes at distance 1): a few kilobytes to megabytes that
// decode to hundreds of megabytes, as an image editor's "save at maximum compression" does.
std::string zeros_png(uint32_t width, uint32_t height, int depth, int color_type, int channels) {
  std::string ihdr = be32(width) + be32(height);
  ihdr += static_cast<char>(depth);
  ihdr += static_cast<char>(color_type);
  ihdr += std::string(3, '\0');
  const uint64_t row = 1 + (uint64_t{width} * static_cast<uint64_t>(channels) * static_cast<uint64_t>(depth) + 7) / 8;
  const uint64_t raw = row * height;  // filter byte 0 and zero samples: every byte is zero
  DeflateBits d;
  d.put(1, 1);        // BFINAL
  d.put(1, 2);        // BTYPE 01: fixed Huffman codes
  d.code(0x30, 8);    // literal 0
  for (uint64_t i = 0; i < (raw - 1) / 258; ++i) {
    d.code(0xC5, 8);  // length 258 (code 285)
    d.code(0, 5);     // distance 1 (code 0)
  }
  for (uint64_t i = 0; i < (raw - 1) % 258; ++i) d.code(0x30, 8);
  d.code(0, 7);       // end of block
  if (d.count > 0) d.put(0, 8 - d.count);
  const uint32_t adler = static_cast<uint32_t>((raw % 65521) << 16 | 1);  // Adler-32 of zeros
  const std::string z = std::string("\x78\x01", 2) + d.out + be32(adler);
  return std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) + png_chunk("IDAT", z) + png_chunk("IEND", "");
}

std::string le_bytes(uint32_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A 1 KB RLE8 BMP declaring width x height with a colour palette: one run, then end of bitmap
// (the decoder fills the rest), 3 bytes a pixel decoded.
std::string rle8_bmp(uint32_t width, uint32_t height) {
  std::string palette;
  for (int i = 0; i < 256; ++i) palette += std::string{static_cast<char>(i), static_cast<char>(255 - i), '\x40', '\0'};
  const std::string pixels = std::string("\xff\x07\x00\x01", 4);  // 255 pixels of colour 7, end of bitmap
  const uint32_t offset = 14 + 40 + static_cast<uint32_t>(palette.size());
  const std::string file_header = "BM" + le_bytes(offset + static_cast<uint32_t>(pixels.size()), 4) + le_bytes(0, 4) +
                                  le_bytes(offset, 4);
  const std::string info = le_bytes(40, 4) + le_bytes(width, 4) + le_bytes(height, 4) + le_bytes(1, 2) + le_bytes(8, 2) +
                           le_bytes(1, 4) /* BI_RLE8 */ + le_bytes(static_cast<uint32_t>(pixels.size()), 4) +
                           le_bytes(2835, 4) + le_bytes(2835, 4) + le_bytes(256, 4) + le_bytes(0, 4);
  return file_header + info + palette + pixels;
}

struct FormatCase {
  std::string name;  // file name: the extension picks OpenCV's encoder
  cv::Mat pixels;
  std::vector<int> params;
};

// Small valid images of every format OpenCV writes, in 8 bits and, where the format has them,
// 16 bits, float and 1 bit a sample.
std::vector<FormatCase> format_cases() {
  cv::Mat rgb(37, 53, CV_8UC3);  // OpenJPEG needs this much for its default resolution levels
  cv::randu(rgb, 0, 255);
  cv::GaussianBlur(rgb, rgb, cv::Size(5, 5), 0);  // photo-like, so the codecs' paths are the usual ones
  cv::Mat gray, rgb16, gray16, rgba, rgba16, rgbf, bilevel;
  cv::extractChannel(rgb, gray, 1);
  rgb.convertTo(rgb16, CV_16U, 257);
  gray.convertTo(gray16, CV_16U, 257);
  cv::cvtColor(rgb, rgba, cv::COLOR_BGR2BGRA);
  rgba.convertTo(rgba16, CV_16U, 257);
  rgb.convertTo(rgbf, CV_32F, 1.0 / 255);
  cv::threshold(gray, bilevel, 128, 255, cv::THRESH_BINARY);
  return {{"rgb.png", rgb, {}},
          {"rgba16.png", rgba16, {}},
          {"bilevel.png", bilevel, {cv::IMWRITE_PNG_BILEVEL, 1}},
          {"gray16.png", gray16, {}},
          {"rgb.jpg", rgb, {}},
          {"progressive.jpg", rgb, {cv::IMWRITE_JPEG_PROGRESSIVE, 1}},
          {"gray.jpg", gray, {}},
          {"rgb.bmp", rgb, {}},
          {"gray.bmp", gray, {}},
          {"rgb.tiff", rgb, {}},
          {"rgb16.tiff", rgb16, {}},
          {"float.tiff", rgbf, {}},
          {"lossy.webp", rgb, {cv::IMWRITE_WEBP_QUALITY, 80}},
          {"lossless.webp", rgba, {cv::IMWRITE_WEBP_QUALITY, 101}},
          {"rgb.jp2", rgb, {}},
          {"rgb16.jp2", rgb16, {}},
          {"rgb.ppm", rgb, {}},
          {"rgb16.ppm", rgb16, {}},
          {"gray16.pgm", gray16, {}},
          {"bilevel.pbm", bilevel, {}},
          {"rgb.pam", rgb, {}},
          {"rgb.pfm", rgbf, {}},
          {"rgb.ras", rgb, {}},
          {"rgb.hdr", rgbf, {}},
          {"rgb.exr", rgbf, {}}};
}

// The loader on bytes: an image of the declared size, or a vitlens::Error of one line naming the
// file and no library's own text. Anything else (another exception, a crash) fails the test.
void loads_or_one_line(const std::string& bytes, const std::string& what) {
  try {
    const LoadedImage image = decode_image(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), what);
    CHECK(image.rgb01.type() == CV_32FC3);
    CHECK(image.rgb01.cols >= 1);
    CHECK(image.rgb01.rows >= 1);
  } catch (const Error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.rfind(what + ": ", 0) == 0);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(message.find("OpenCV(") == std::string::npos);
    CHECK(message.find("libpng") == std::string::npos);
  }
}

}  // namespace

TEST_CASE("hostile images: every format, whole, cut and bit-flipped, gives an image or one line", "[image][hostile]") {
  const std::string dir = test::temp_dir("hostile-images");
  std::mt19937 rng(20261206);
  int formats = 0;
  for (const FormatCase& f : format_cases()) {
    INFO(f.name);
    std::vector<unsigned char> encoded;
    bool written = false;
    try {
      written = cv::imencode(f.name.substr(f.name.find('.')), f.pixels, encoded, f.params);
    } catch (const cv::Exception&) {  // an encoder this OpenCV was built without (OpenEXR)
    }
    const std::string path = dir + "/" + f.name;
    if (written) spit(path, std::string(encoded.begin(), encoded.end()));
    if (!written || !cv::haveImageReader(path)) {
      WARN(f.name << ": this OpenCV has no reader for it; skipped");
      continue;
    }
    ++formats;
    const std::string bytes(encoded.begin(), encoded.end());
    // Whole: the size the file declares, pixels in [0, 1].
    const LoadedImage whole = load_image(path);
    CHECK(whole.source_w == 53);
    CHECK(whole.source_h == 37);
    CHECK(whole.rgb01.size() == cv::Size(53, 37));
    // Cut at the start, in the header, in the pixels, one byte short.
    for (size_t cut : {size_t{1}, size_t{8}, size_t{20}, bytes.size() / 4, bytes.size() / 2, bytes.size() * 9 / 10,
                       bytes.size() - 1})
      loads_or_one_line(bytes.substr(0, std::min(cut, bytes.size() - 1)), dir + "/cut" + std::to_string(cut) + "_" + f.name);
    // One bit flipped at seeded positions, half of them in the first 64 bytes (the header).
    for (int k = 0; k < 24; ++k) {
      std::string flipped = bytes;
      const size_t span = k % 2 ? std::min<size_t>(64, bytes.size()) : bytes.size();
      const size_t at = std::uniform_int_distribution<size_t>(0, span - 1)(rng);
      flipped[at] = static_cast<char>(flipped[at] ^ (1 << std::uniform_int_distribution<int>(0, 7)(rng)));
      loads_or_one_line(flipped, dir + "/flip" + std::to_string(at) + "_" + f.name);
    }
  }
  CHECK(formats >= 20);  // every format but OpenEXR, which Debian's OpenCV reads only when enabled
  // OpenCV 4.6 cannot read back its own 4-channel PAM: one line, not its exception.
  cv::Mat rgba(8, 8, CV_8UC4, cv::Scalar(1, 2, 3, 4));
  std::vector<unsigned char> pam;
  REQUIRE(cv::imencode(".pam", rgba, pam));
  loads_or_one_line(std::string(pam.begin(), pam.end()), dir + "/rgba.pam");
}

TEST_CASE("hostile images through the real binary: exit 0, or exit 1 with one line", "[image][hostile][cli]") {
  Setup s;
  std::mt19937 rng(7);
  int ran = 0;
  for (const FormatCase& f : format_cases()) {
    if (f.name != "rgb.png" && f.name != "progressive.jpg" && f.name != "rgb16.tiff" && f.name != "lossless.webp" &&
        f.name != "rgb.bmp")
      continue;
    std::vector<unsigned char> encoded;
    REQUIRE(cv::imencode(f.name.substr(f.name.find('.')), f.pixels, encoded, f.params));
    std::string bytes(encoded.begin(), encoded.end());
    for (int k = 0; k < 2; ++k) {
      std::string damaged = k == 0 ? bytes.substr(0, bytes.size() * 2 / 3) : bytes;
      if (k == 1)
        for (int i = 0; i < 4; ++i) damaged[std::uniform_int_distribution<size_t>(0, damaged.size() - 1)(rng)] ^= 0x10;
      const std::string path = s.dir + "/bad" + std::to_string(k) + "_" + f.name;
      spit(path, damaged);
      const Child c = run_vitlens({"export", path, "--model", s.model, "--out", s.dir, "--quiet"});
      INFO(path << ": " << c.err);
      CHECK(c.signal == 0);
      CHECK((c.code == 0 || c.code == 1));
      if (c.code == 1) {
        CHECK(c.err.rfind("vitlens: " + path + ": ", 0) == 0);
        CHECK(std::count(c.err.begin(), c.err.end(), '\n') == 1);
      }
      ++ran;
    }
  }
  CHECK(ran == 10);
}

TEST_CASE("small files that decode to hundreds of megabytes are decoded within a bounded memory", "[image][bomb]") {
  const std::string dir = test::temp_dir("bomb-inside");
  // Each within the 120-megapixel cap: before the decode was planned, these cost 2.0, 4.2 and
  // 1.7 GB (full-size float copies). Now the decode is downscaled in its own depth (the 1-bit
  // PNG: 120 MB of 8-bit grey; the 16-bit RGBA one, whose own depth needs 576 MB, at 8 bits:
  // 216 MB; the BMP: 300 MB), and no float copy is larger than 2048 a side.
  struct Bomb {
    std::string name, bytes;
    int width, height;
    long max_mb;
  };
  const std::vector<Bomb> bombs = {
      {"bilevel.png", zeros_png(10950, 10950, 1, 0, 1), 10950, 10950, 220},
      {"rgba16.png", zeros_png(9000, 8000, 16, 6, 4), 9000, 8000, 330},
      {"rle8.bmp", rle8_bmp(10000, 10000), 10000, 10000, 400},
  };
  Setup s;
  // What an export of a small image takes: the bounds below are on the growth above it.
  const long base_kb = run_vitlens({"export", s.image, "--model", s.model, "--out", dir, "--quiet"}).max_rss_kb;
  for (const Bomb& b : bombs) {
    INFO(b.name << ": " << b.bytes.size() << " bytes");
    CHECK(b.bytes.size() < 4 << 20);
    spit(dir + "/" + b.name, b.bytes);
    const LoadedImage image = load_image(dir + "/" + b.name);
    CHECK(image.source_w == b.width);
    CHECK(image.source_h == b.height);
    CHECK(std::max(image.rgb01.cols, image.rgb01.rows) == kMaxLoadSide);
    const Child c = run_vitlens({"export", dir + "/" + b.name, "--model", s.model, "--out", dir, "--quiet"});
    INFO(c.err << "peak " << c.max_rss_kb / 1024 << " MB, " << (c.max_rss_kb - base_kb) / 1024 << " MB above a small image's");
    CHECK(c.code == 0);
    CHECK(c.max_rss_kb - base_kb < b.max_mb * 1024);
  }
  // A large JPEG is decoded reduced by libjpeg itself: 8400 x 8400 grey at a quarter, 2100 x 2100
  // (4 MB), then by area to 2048; decoded whole it would be 70 MB before any copy.
  cv::Mat photo(8400, 8400, CV_8UC1, cv::Scalar(90));
  std::vector<unsigned char> jpg;
  REQUIRE(cv::imencode(".jpg", photo, jpg));
  photo.release();
  spit(dir + "/large.jpg", std::string(jpg.begin(), jpg.end()));
  const Child c = run_vitlens({"export", dir + "/large.jpg", "--model", s.model, "--out", dir, "--quiet"});
  INFO(c.err << "peak " << c.max_rss_kb / 1024 << " MB, " << (c.max_rss_kb - base_kb) / 1024 << " MB above a small image's");
  CHECK(c.code == 0);
  CHECK(c.max_rss_kb - base_kb < (80 + test::kSanitizerSlackMb) * 1024);  // the float result alone is 50 MB
}

TEST_CASE("an image whose decode needs more memory than vitlens uses for one is refused first, naming it", "[image][bomb]") {
  // A small JPEG 2000 file whose header declares 10000 x 10000 RGB: OpenJPEG would hold 12 bytes a
  // sample (its image and tiles as int32), 2.7 GB; refused from the header, before decoding.
  cv::Mat small(64, 64, CV_8UC3, cv::Scalar(1, 2, 3));
  std::vector<unsigned char> jp2;
  if (!cv::imencode(".jp2", small, jp2)) {
    WARN("this OpenCV writes no JPEG 2000; skipped");
    return;
  }
  std::string bytes(jp2.begin(), jp2.end());
  const size_t ihdr = bytes.find("ihdr"), siz = bytes.find("\xff\x51");
  REQUIRE(ihdr != std::string::npos);
  REQUIRE(siz != std::string::npos);
  bytes.replace(ihdr + 4, 8, be32(10000) + be32(10000));    // ihdr: height, width
  bytes.replace(siz + 6, 8, be32(10000) + be32(10000));     // SIZ: Xsiz, Ysiz (offsets 0)
  const std::string dir = test::temp_dir("bomb-memory");
  spit(dir + "/big.jp2", bytes);
  CHECK_THROWS_WITH(load_image(dir + "/big.jp2"),
                    Catch::Contains("big.jp2: the 10000x10000 JPEG 2000 image needs") &&
                        Catch::Contains("to decode, more than vitlens uses for one image (512 MiB)"));
  Setup s;
  const Child c = run_vitlens({"export", dir + "/big.jp2", "--model", s.model, "--out", dir});
  CHECK(c.code == 1);
  CHECK(std::count(c.err.begin(), c.err.end(), '\n') == 1);
  CHECK(c.max_rss_kb < 200 * 1024);
}

TEST_CASE("a long stem works: temporary names are short whatever the output names", "[export][files]") {
  Setup s;
  const std::string stem(240, 's');
  const std::string image = s.dir + "/" + stem + ".png";
  REQUIRE(::rename(s.image.c_str(), image.c_str()) == 0);
  const std::string out = test::temp_dir("longstem");
  const Child c = run_vitlens({"export", image, "--model", s.model, "--out", out, "--raw", "--size", "0", "--quiet"});
  INFO(c.err);
  CHECK(c.code == 0);
  for (const char* suffix : {"_head0.png", "_head3.png", "_mean.png", "_montage.png", "_attn.npy", ".json"})
    CHECK(std::ifstream(out + "/" + stem + suffix).good());
  CHECK(hidden_entries(out) == 0);
  // write_file_atomic as well (the viewer's settings and notes).
  write_file_atomic(out + "/" + std::string(250, 'n') + ".json", "{}");
  CHECK(slurp(out + "/" + std::string(250, 'n') + ".json") == "{}");
}

TEST_CASE("raw export is streamed: the same bytes as the whole array, without a second copy in memory", "[export][raw]") {
  Setup s;
  ExportSettings settings;
  settings.out_dir = test::temp_dir("rawstream");
  settings.raw = true;
  settings.max_side = 0;
  const ImageAnalysis a = analyse_image(s.loaded, s.image, settings);
  write_export(s.loaded, a, settings);
  // The reference: the .npy built whole in memory, as before streaming.
  const auto& f = a.forward;
  const size_t n = static_cast<size_t>(f.tokens);
  std::string expected = npy_bytes_f32({f.layers.size(), 4, n, n}, nullptr);
  for (const LayerState& layer : f.layers)
    for (const MatRM& probs : layer.probs)
      expected.append(reinterpret_cast<const char*>(probs.data()), static_cast<size_t>(probs.size()) * sizeof(float));
  CHECK(slurp(settings.out_dir + "/photo_attn.npy") == expected);

  // Peak memory of the CLI with and without --raw on an image of 1445 tokens: the (2, 4, N, N)
  // weights are 66.8 MB; writing them whole took a second copy (the issue: 2x), streaming none.
  cv::Mat big(152, 152, CV_8UC3);
  cv::randu(big, 0, 255);
  REQUIRE(cv::imwrite(s.dir + "/big.png", big));
  const double npy_mb = 2.0 * 4 * 1445.0 * 1445.0 * 4 / (1 << 20);
  raise_own_peak_rss(1024);  // each child's own peak, not this process's (run_vitlens)
  const Child plain = run_vitlens({"export", s.dir + "/big.png", "--model", s.model, "--out", s.dir, "--size", "0", "-q"});
  const Child raw = run_vitlens({"export", s.dir + "/big.png", "--model", s.model, "--out", s.dir, "--size", "0", "-q", "--raw"});
  REQUIRE(plain.code == 0);
  REQUIRE(raw.code == 0);
  // The peaks are the children's own: below this process's 1 GB (ASan's build included), and with
  // --raw above the maps the forward keeps for it (without --raw it keeps none: 75 MiB in all).
  CHECK(plain.max_rss_kb < 800 * 1024);
  CHECK(raw.max_rss_kb < 800 * 1024);
  CHECK(raw.max_rss_kb / 1024.0 > npy_mb);
  const double extra_mb = static_cast<double>(raw.max_rss_kb - plain.max_rss_kb) / 1024.0;
  WARN("peak RSS without --raw " << plain.max_rss_kb / 1024 << " MiB, with --raw " << raw.max_rss_kb / 1024
                                 << " MiB; the weights are " << npy_mb << " MiB");
  CHECK(extra_mb < 1.5 * npy_mb);
}

TEST_CASE("SIGTERM and SIGINT during an export leave no temporaries, stale ones are removed next run", "[export][signals]") {
  Setup s;
  // A big export: a patch-16 model on a 2048 x 2048 image; its PNGs take a while to encode.
  VitConfig c = test::small_config(224, true, 1);
  c.patch_size = 16;
  const std::string model = s.dir + "/p16.safetensors";
  save_model(model, c, test::random_tensors(c, 3));
  cv::Mat big(2048, 2048, CV_8UC3);
  cv::randu(big, 0, 255);
  const std::string image = s.dir + "/big.png";
  REQUIRE(cv::imwrite(image, big));
  for (int sig : {SIGTERM, SIGINT}) {
    INFO("signal " << sig);
    const std::string out = test::temp_dir("signal");
    const pid_t pid = spawn({VITLENS_BINARY, "export", image, "--model", model, "--out", out, "--size", "0", "-q"},
                            s.dir + "/signal-err-" + std::to_string(sig));
    // Wait until the export writes (its private folder appears), then interrupt it.
    bool writing = false;
    for (int i = 0; i < 60000 && !writing; ++i) {
      writing = hidden_entries(out) > 0;
      if (!writing) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(writing);
    ::kill(pid, sig);
    const Child child = reap(pid, s.dir + "/signal-err-" + std::to_string(sig));
    CHECK(child.signal == sig);  // terminated by the signal, as without the handler
    INFO([&] {
      std::string names;
      for (const std::string& e : entries(out)) names += e + " ";
      return names;
    }());
    CHECK(entries(out).empty());  // no temporary, and no part of the set
  }

  // Stale temporaries of our naming are removed by the next export into the folder: a dead
  // process's, and an old one of a live process; a recent one of a live process and every name
  // that is not ours stay.
  const std::string out = test::temp_dir("stale");
  const pid_t dead = test::gone_pid();
  const std::string dead_dir = out + "/.vitlens-tmp-" + std::to_string(dead) + "-Ab12Cd";
  REQUIRE(::mkdir(dead_dir.c_str(), 0755) == 0);
  spit(dead_dir + "/photo_head0.png", "partial");
  spit(out + "/.vitlens-tmp-" + std::to_string(dead) + "-Zz9999", "a single-file temporary");
  const std::string old = out + "/.vitlens-tmp-" + std::to_string(::getppid()) + "-old123";
  spit(old, "old");
  const timespec two_hours_ago[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  REQUIRE(::utimensat(AT_FDCWD, old.c_str(), two_hours_ago, 0) == 0);
  const std::vector<std::string> kept = {".vitlens-tmp-" + std::to_string(::getppid()) + "-new123",  // live, recent
                                         ".vitlens-tmp-notapid-abcdef", ".vitlens-tmp-12-abc", "photo.png.tmp",
                                         ".vitlens-tmpfoo"};
  for (const std::string& name : kept) spit(out + "/" + name, "not ours to remove");
  const Child run = run_vitlens({"export", s.image, "--model", s.model, "--out", out, "-q"});
  CHECK(run.code == 0);
  std::vector<std::string> hidden;
  for (const std::string& e : entries(out))
    if (e[0] == '.' || e == "photo.png.tmp") hidden.push_back(e);
  std::vector<std::string> expect = kept;
  std::sort(expect.begin(), expect.end());
  CHECK(hidden == expect);
}

namespace {

using Snapshot = std::map<std::string, std::string>;
using ExportInto = std::function<void(const std::string& dir)>;

bool commit_pending(const std::string& dir) {
  for (const std::string& e : entries(dir))
    if (e.rfind(".vitlens-set-", 0) == 0) return true;
  return false;
}

// Fails each file operation of export_b in turn, in a fresh folder that export_a filled: the
// folder then holds exactly set_a or set_b, or (cut short after the commit point) a set the next
// tidy completes to set_b. Returns {failures, interrupted commits}; stops when export_b completes.
std::pair<int, int> fail_each_operation(const ExportInto& export_a, const ExportInto& export_b, const Snapshot& set_a,
                                        const Snapshot& set_b) {
  int failures = 0, interrupted_commits = 0;
  bool completed = false;
  for (long n = 1; n < 100 && !completed; ++n) {
    INFO("failing file operation " << n);
    const std::string dir = test::temp_dir("inject");
    export_a(dir);
    testing::fail_file_operation(n);
    try {
      export_b(dir);
      completed = true;
    } catch (const Error& e) {
      ++failures;
      CHECK_THAT(e.what(), Catch::Contains("No space left on device"));
    }
    testing::fail_file_operation(0);
    if (!commit_pending(dir)) {
      // Nothing half done: exactly the old set, or exactly the new one.
      const auto now = snapshot(dir);
      CHECK((now == set_a || now == set_b));
      CHECK(hidden_entries(dir) == 0);
    } else {
      // Cut short after the commit point (the set was complete): the next run finishes it.
      ++interrupted_commits;
      CHECK(tidy_output_dir(dir) == 1);
      CHECK(snapshot(dir) == set_b);
      CHECK(hidden_entries(dir) == 0);
    }
  }
  CHECK(completed);
  return {failures, interrupted_commits};
}

}  // namespace

TEST_CASE("a temporary in use is never removed by another tidy, whatever its PID or age", "[export][files][trust]") {
  Setup s;
  const std::string out = test::temp_dir("held");
  // An export in another PID namespace sharing the folder: named by a PID that means nothing here
  // (a child of ours, gone), its folder held as vitlens holds the temporaries it works on.
  const pid_t gone = test::gone_pid();
  const std::string foreign = out + "/.vitlens-tmp-" + std::to_string(gone) + "-Hd12Ab";
  REQUIRE(::mkdir(foreign.c_str(), 0755) == 0);
  spit(foreign + "/photo_head0.png", "being written");
  const int held = ::open(foreign.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);
  // This process's own export, open for two hours (its private folder's time set back).
  OutputSet mine(out);
  mine.add("notes.txt", "kept");
  std::string private_name;
  for (const std::string& e : entries(out))
    if (e.rfind(".vitlens-tmp-" + std::to_string(::getpid()) + "-", 0) == 0) private_name = e;
  REQUIRE_FALSE(private_name.empty());
  const timespec two_hours_ago[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  REQUIRE(::utimensat(AT_FDCWD, (out + "/" + private_name).c_str(), two_hours_ago, 0) == 0);

  // Another process's export into the folder tidies it first, and so does this process.
  const Child run = run_vitlens({"export", s.image, "--model", s.model, "--out", out, "-q"});
  CHECK(run.code == 0);
  CHECK(tidy_output_dir(out) == 0);
  CHECK(slurp(foreign + "/photo_head0.png") == "being written");
  CHECK(std::filesystem::is_directory(out + "/" + private_name));
  const std::vector<std::string> written = mine.commit("notes.json", nlohmann::json::object());
  CHECK(written.size() == 2);
  CHECK(slurp(out + "/notes.txt") == "kept");

  // Let go of (as the other export ending without its commit, killed): the next tidy removes it,
  // its PID being gone.
  ::close(held);
  CHECK(tidy_output_dir(out) == 1);
  CHECK_FALSE(std::filesystem::exists(foreign));

  // A single file written whole (a model, the viewer's settings) holds its temporary too: a child
  // stopped while writing one, its temporary set two hours back, keeps it; killed, it loses it.
  const std::string folder = test::temp_dir("held-file");
  const pid_t writer = ::fork();
  if (writer == 0) {
    testing::fail_file_operation(1, SIGSTOP);  // stops after writing, before closing and renaming
    write_file_atomic(folder + "/model.json", "{}");
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(writer, &status, WUNTRACED) == writer);
  REQUIRE(WIFSTOPPED(status));
  std::vector<std::string> temporaries = entries(folder);
  REQUIRE(temporaries.size() == 1);
  const std::string temporary = folder + "/" + temporaries[0];
  CHECK(temporaries[0].rfind(".vitlens-tmp-" + std::to_string(writer) + "-", 0) == 0);
  REQUIRE(::utimensat(AT_FDCWD, temporary.c_str(), two_hours_ago, 0) == 0);
  CHECK(tidy_output_dir(folder) == 0);
  CHECK(std::filesystem::exists(temporary));
  ::kill(writer, SIGKILL);
  ::waitpid(writer, nullptr, 0);
  CHECK(tidy_output_dir(folder) == 1);
  CHECK(entries(folder).empty());
}

TEST_CASE("one image's outputs appear together or not at all, whichever file operation fails", "[export][atomic]") {
  Setup s;
  const ImageAnalysis raw_analysis = [&] {
    ExportSettings a;
    a.raw = true;
    a.max_side = 0;
    return analyse_image(s.loaded, s.image, a);
  }();
  // Set A (the previous export): viridis with --raw. Set B (the new one): inferno without --raw,
  // so B also has to remove A's .npy, which B does not have.
  auto export_a = [&](const std::string& dir) {
    ExportSettings a;
    a.out_dir = dir;
    a.raw = true;
    a.max_side = 0;
    write_export(s.loaded, raw_analysis, a);
  };
  auto export_b = [&](const std::string& dir) {
    ExportSettings b;
    b.out_dir = dir;
    b.max_side = 0;
    b.style.colormap = "inferno";
    write_export(s.loaded, raw_analysis, b);
  };
  const std::string ref_a = test::temp_dir("set-a"), ref_b = test::temp_dir("set-b");
  export_a(ref_a);
  export_b(ref_b);
  const auto set_a = snapshot(ref_a), set_b = snapshot(ref_b);
  REQUIRE(set_a.size() == 8);  // 4 heads, mean, montage, npy, json
  REQUIRE(set_b.size() == 7);
  REQUIRE(set_a.at("photo_head0.png") != set_b.at("photo_head0.png"));
  const auto [failures, interrupted_commits] = fail_each_operation(export_a, export_b, set_a, set_b);
  CHECK(failures >= 12);           // every file written and every rename was made to fail once
  CHECK(interrupted_commits >= 6);  // of which the renames after the commit point
}

TEST_CASE("a rollout, every layer, and a forced export over files vitlens did not write are all or nothing too", "[export][atomic][trust]") {
  Setup s;
  // The rollout's picture and record: one set (it was two files written one after the other).
  auto rollout_with = [&](const char* colormap) {
    return [&, colormap](const std::string& dir) {
      ExportSettings e;
      e.out_dir = dir;
      e.max_side = 0;
      e.style.colormap = colormap;
      export_rollout(s.loaded, s.image, e, RolloutOptions{});
    };
  };
  const std::string ref_a = test::temp_dir("roll-a"), ref_b = test::temp_dir("roll-b");
  rollout_with("viridis")(ref_a);
  rollout_with("inferno")(ref_b);
  const auto roll_a = snapshot(ref_a), roll_b = snapshot(ref_b);
  REQUIRE(roll_b.size() == 2);
  REQUIRE(roll_a.at("photo_rollout.png") != roll_b.at("photo_rollout.png"));
  const auto [roll_failures, roll_interrupted] = fail_each_operation(rollout_with("viridis"), rollout_with("inferno"), roll_a, roll_b);
  CHECK(roll_failures >= 6);  // 2 files and the record's 2 internal ones written, 3 renames
  CHECK(roll_interrupted >= 2);

  // Every layer's files and records, the layers montage and the weights: one set as well.
  auto layers_with = [&](const char* colormap) {
    return [&, colormap](const std::string& dir) {
      ExportSettings e;
      e.out_dir = dir;
      e.max_side = 0;
      e.raw = true;
      e.style.colormap = colormap;
      export_layers(s.loaded, s.image, e, 0, 1);
    };
  };
  const std::string layers_a = test::temp_dir("layers-a"), layers_b = test::temp_dir("layers-b");
  layers_with("viridis")(layers_a);
  layers_with("inferno")(layers_b);
  const auto all_a = snapshot(layers_a), all_b = snapshot(layers_b);
  REQUIRE(all_b.size() == 2 * 7 + 3);  // per layer 4 heads, mean, montage, record; montage, npy, record
  const auto [layer_failures, layer_interrupted] =
      fail_each_operation(layers_with("viridis"), layers_with("inferno"), all_a, all_b);
  CHECK(layer_failures >= 2 * 17 + 3);  // every file and rename of both layers and of the rest
  CHECK(layer_interrupted >= 16);

  // --force over a user's record and picture of the outputs' names: the user's files stay whole
  // until the set replaces them, and the commit left by a failure is completed with --force's
  // leave (the commit folder records it).
  const ImageAnalysis analysis = analyse_image(s.loaded, s.image, [] {
    ExportSettings e;
    e.max_side = 0;
    return e;
  }());
  auto users_files = [](const std::string& dir) {
    spit(dir + "/photo.json", R"({"labels": ["cat"]})");
    spit(dir + "/photo_mean.png", "a picture of the user's");
  };
  auto forced = [&](const std::string& dir) {
    ExportSettings e;
    e.out_dir = dir;
    e.max_side = 0;
    e.force = true;
    write_export(s.loaded, analysis, e);
  };
  const std::string user_ref = test::temp_dir("user"), forced_ref = test::temp_dir("forced");
  users_files(user_ref);
  forced(forced_ref);
  const auto [force_failures, force_interrupted] = fail_each_operation(users_files, forced, snapshot(user_ref), snapshot(forced_ref));
  CHECK(force_failures >= 13);  // one more file than without --force: the commit folder's mark
  CHECK(force_interrupted >= 6);
  // Without --force the same export is refused before anything is written.
  const std::string refused = test::temp_dir("refused");
  users_files(refused);
  ExportSettings plain;
  plain.out_dir = refused;
  plain.max_side = 0;
  CHECK_THROWS_AS(write_export(s.loaded, analysis, plain), OutputConflict);
  CHECK(snapshot(refused) == snapshot(user_ref));
  CHECK(hidden_entries(refused) == 0);
}

TEST_CASE("two concurrent exports into one folder leave one complete, consistent set", "[export][atomic]") {
  Setup s;
  const std::string ref_viridis = test::temp_dir("ref-v"), ref_inferno = test::temp_dir("ref-i");
  const std::vector<std::string> common = {"export", s.image, "--model", s.model, "--size", "0", "-q"};
  auto args = [&](const std::string& out, const std::string& colormap, bool raw) {
    std::vector<std::string> a = {VITLENS_BINARY};
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), {"--out", out, "--colormap", colormap});
    if (raw) a.push_back("--raw");
    return a;
  };
  const std::string err = s.dir + "/concurrent-err";
  REQUIRE(reap(spawn(args(ref_viridis, "viridis", true), err), err).code == 0);
  REQUIRE(reap(spawn(args(ref_inferno, "inferno", false), err), err).code == 0);
  const auto viridis = snapshot(ref_viridis), inferno = snapshot(ref_inferno);
  const std::string out = test::temp_dir("concurrent");
  for (int round = 0; round < 6; ++round) {
    const pid_t a = spawn(args(out, "viridis", true), err + "a");
    const pid_t b = spawn(args(out, "inferno", false), err + "b");
    CHECK(reap(a, err + "a").code == 0);
    CHECK(reap(b, err + "b").code == 0);
    const auto now = snapshot(out);
    INFO("round " << round);
    CHECK((now == viridis || now == inferno));
    CHECK(hidden_entries(out) == 0);
  }
}

namespace {

// The first failing file operation of an export (export_with(dir, "inferno") over "viridis")
// that leaves a commit folder: the first rename after the commit point.
// Exports the setup's image, analysed once at its native size, into a folder in a colour map
// (a set that differs from another export's in every picture).
std::function<void(const std::string&, const char*)> exporter_of(const Setup& s) {
  ExportSettings base;
  base.max_side = 0;
  auto analysis = std::make_shared<const ImageAnalysis>(analyse_image(s.loaded, s.image, base));
  return [&s, base, analysis](const std::string& dir, const char* colormap) {
    ExportSettings e = base;
    e.out_dir = dir;
    e.style.colormap = colormap;
    write_export(s.loaded, *analysis, e);
  };
}

long first_operation_after_commit_point(const std::function<void(const std::string&, const char*)>& export_with) {
  for (long n = 1; n < 60; ++n) {
    const std::string dir = test::temp_dir("find");
    export_with(dir, "viridis");
    testing::fail_file_operation(n);
    CHECK_THROWS(export_with(dir, "inferno"));
    testing::fail_file_operation(0);
    if (commit_pending(dir)) return n;
  }
  FAIL("no failing operation left a commit folder");
  return 0;
}

}  // namespace

TEST_CASE("an interrupted commit is completed by the next run, or dropped when a newer set replaced it", "[export][atomic]") {
  Setup s;
  const auto export_with = exporter_of(s);
  const auto pending = commit_pending;
  std::map<std::string, std::map<std::string, std::string>> sets;
  for (const char* colormap : {"viridis", "inferno", "magma"}) {
    const std::string ref = test::temp_dir("ref");
    export_with(ref, colormap);
    sets[colormap] = snapshot(ref);
  }
  // Two operations after the commit point, two of the new files are already in place.
  const long first = first_operation_after_commit_point(export_with);
  auto interrupted = [&](const std::string& dir) {
    export_with(dir, "viridis");
    testing::fail_file_operation(first + 2);
    CHECK_THROWS_WITH(export_with(dir, "inferno"), Catch::Contains("the next export into this folder completes it"));
    testing::fail_file_operation(0);
    REQUIRE(pending(dir));
    const auto mixed = snapshot(dir);
    CHECK(mixed != sets["viridis"]);  // two of inferno's PNGs are in place beside viridis' JSON
    CHECK(mixed != sets["inferno"]);
  };
  // Nothing happened since: the next run completes the interrupted set.
  const std::string alone = test::temp_dir("alone");
  interrupted(alone);
  CHECK(tidy_output_dir(alone) == 1);
  CHECK(snapshot(alone) == sets["inferno"]);
  CHECK(hidden_entries(alone) == 0);
  // A newer set (magma) was committed in between: completing inferno would mix the two, so the
  // interrupted set is dropped and magma stays whole.
  const std::string raced = test::temp_dir("raced");
  interrupted(raced);
  export_with(raced, "magma");  // this process tidied the folder already: it commits over it
  INFO([&] {
    std::string names;
    for (const std::string& e : entries(raced)) names += e + " ";
    return names;
  }());
  CHECK(snapshot(raced) == sets["magma"]);
  CHECK(tidy_output_dir(raced) == 1);
  CHECK(snapshot(raced) == sets["magma"]);
  CHECK(hidden_entries(raced) == 0);
}

TEST_CASE("a file size limit (as a full disk) kills an export mid-write: the old set stays whole", "[export][atomic]") {
  Setup s;
  const std::string out = test::temp_dir("fsize");
  const std::string err = s.dir + "/fsize-err";
  const std::vector<std::string> plain = {VITLENS_BINARY, "export", s.image, "--model", s.model, "--out", out, "-q",
                                          "--size", "0"};
  REQUIRE(reap(spawn(plain, err), err).code == 0);
  const auto before = snapshot(out);
  REQUIRE(before.size() == 7);
  // The same export with --raw and new colours, under RLIMIT_FSIZE of 16 KiB: the PNGs fit, the
  // 30 KB .npy does not, and SIGXFSZ kills the process in the middle of writing it.
  std::vector<std::string> limited = {"/bin/sh", "-c", "ulimit -f 32 && exec \"$@\"", "sh"};
  limited.insert(limited.end(), plain.begin(), plain.end());
  limited.insert(limited.end(), {"--raw", "--colormap", "magma"});
  const Child killed = reap(spawn(limited, err), err);
  CHECK(killed.signal == SIGXFSZ);
  CHECK(snapshot(out) == before);  // nothing of the new set in place
  CHECK(hidden_entries(out) == 1);  // its private folder, left by the kill
  // The next run removes it (its process is gone) and writes its own set.
  REQUIRE(reap(spawn(plain, err), err).code == 0);
  CHECK(snapshot(out) == before);
  CHECK(hidden_entries(out) == 0);
}

// [SECTION] Shared folders: nothing another user or a stray entry left blocks an export

namespace {

// Collects the warnings of vitlens' file functions for one scope (stderr again on the way out).
struct CollectWarnings {
  std::vector<std::string> lines;
  CollectWarnings() {
    set_file_warning_handler([this](const std::string& text) { lines.push_back(text); });
  }
  ~CollectWarnings() { set_file_warning_handler(nullptr); }
  CollectWarnings(const CollectWarnings&) = delete;
  CollectWarnings& operator=(const CollectWarnings&) = delete;
};

// Entries of a commit folder's name that are not an interrupted set of this user: a file, an
// empty folder and a folder of something else.
std::vector<std::string> make_strays(const std::string& dir) {
  spit(dir + "/.vitlens-set-abc", "");
  REQUIRE(::mkdir((dir + "/.vitlens-set-empty").c_str(), 0755) == 0);
  REQUIRE(::mkdir((dir + "/.vitlens-set-junk").c_str(), 0755) == 0);
  spit(dir + "/.vitlens-set-junk/garbage", "\x01\x02 not an export");
  return {".vitlens-set-abc", ".vitlens-set-empty", ".vitlens-set-junk"};
}

// Runs vitlens as the user `uid`: a forked child of this (root) process drops its groups and ids
// with setgroups / setresgid / setresuid, then runs the binary. Nothing of the system changes.
Child run_vitlens_as(uid_t uid, const std::vector<std::string>& args, const std::string& err_path) {
  std::vector<std::string> all = {VITLENS_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (const std::string& a : all) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  REQUIRE(err_fd >= 0);
  REQUIRE(null_fd >= 0);
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls from here to exec
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    const gid_t gid = static_cast<gid_t>(uid);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 || ::setresuid(uid, uid, uid) != 0) ::_exit(125);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  ::close(err_fd);
  ::close(null_fd);
  REQUIRE(pid > 0);
  return reap(pid, err_path);
}

int count_lines(const std::string& text, const std::string& containing) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.find(containing) != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("entries of a commit folder's name that are not this user's set are skipped with a warning", "[export][shared]") {
  Setup s;
  const std::string dir = test::temp_dir("strays");
  const std::vector<std::string> strays = make_strays(dir);
  {
    CollectWarnings warnings;
    CHECK(tidy_output_dir(dir) == 0);
    REQUIRE(warnings.lines.size() == strays.size());
    std::string all;
    for (const std::string& line : warnings.lines) {
      CHECK(line.find('\n') == std::string::npos);
      all += line + "\n";
    }
    INFO(all);
    for (const std::string& stray : strays) CHECK(count_lines(all, "/" + stray + ":") == 1);
  }
  // Nothing of them was removed (not ours), and every export there still works, each run with one
  // warning line per entry.
  for (const std::string& stray : strays) CHECK(::access((dir + "/" + stray).c_str(), F_OK) == 0);
  CHECK(slurp(dir + "/.vitlens-set-junk/garbage") == "\x01\x02 not an export");
  for (int run = 0; run < 2; ++run) {
    const Child c = run_vitlens({"export", s.image, "--model", s.model, "--out", dir, "-q"});
    INFO(c.err);
    CHECK(c.code == 0);
    CHECK(count_lines(c.err, "vitlens: warning: ") == 3);
    CHECK(count_lines(c.err, "") == 3);  // and nothing else
  }
  CHECK(::access((dir + "/photo.json").c_str(), F_OK) == 0);
}

TEST_CASE("another user's interrupted export in a shared folder never blocks this user's", "[export][shared]") {
  if (::geteuid() != 0) {
    WARN("skipped: running a second user's export needs root (a forked child drops to uid 65534)");
    return;
  }
  Setup s;
  REQUIRE(::chmod(s.dir.c_str(), 0755) == 0);  // the other user reads the model and the images
  cv::Mat other(16, 16, CV_8UC3, cv::Scalar(10, 200, 30));
  const std::string other_image = s.dir + "/other.png";
  REQUIRE(cv::imwrite(other_image, other));
  const std::string shared = test::temp_dir("shared");
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);  // world-writable and sticky, as /tmp

  // This user's (root's) export, cut short after its commit point as a kill -9 there would: its
  // commit folder (mode 0700, root's) stays, and so do stray entries of a commit folder's name.
  const auto export_with = exporter_of(s);
  const long first = first_operation_after_commit_point(export_with);
  export_with(shared, "viridis");
  testing::fail_file_operation(first + 2);
  CHECK_THROWS(export_with(shared, "inferno"));
  testing::fail_file_operation(0);
  REQUIRE(commit_pending(shared));
  make_strays(shared);

  // Another user (nobody) exports there: the interrupted set and the strays are skipped, one
  // warning line each, and the export is written.
  const uid_t nobody = 65534;
  const Child c = run_vitlens_as(nobody, {"export", other_image, "--model", s.model, "--out", shared, "-q"}, s.dir + "/as-nobody");
  INFO(c.err);
  CHECK(c.code == 0);
  CHECK(count_lines(c.err, "vitlens: warning: ") == 4);
  CHECK(count_lines(c.err, "another user's (uid 0)") == 3);  // the set and the two folders
  struct stat st {};
  REQUIRE(::stat((shared + "/other.json").c_str(), &st) == 0);
  CHECK(st.st_uid == nobody);
  // Its export of the same name as root's files stops at the first of them, in one line.
  const Child same = run_vitlens_as(nobody, {"export", s.image, "--model", s.model, "--out", shared, "-q"}, s.dir + "/as-nobody");
  CHECK(same.code == 1);
  CHECK(count_lines(same.err, "belongs to another user (uid 0)") == 1);
  CHECK(count_lines(same.err, "") - count_lines(same.err, "vitlens: warning: ") == 1);

  // The owner's next run completes its own set.
  {
    CollectWarnings warnings;
    CHECK(tidy_output_dir(shared) == 1);
    CHECK(warnings.lines.size() == 3);  // the strays only
  }
  CHECK(nlohmann::json::parse(slurp(shared + "/photo.json"))["colormap"] == "inferno");
}

// =============================================================================================
// Hostile training data: `vitlens train` on folders with links, damaged images and bombs. Each run
// (about 1 s on an idle machine) is killed after 120 s and, without a sanitizer (whose allocator
// reserves terabytes), limited to 2 GiB of address space: a walk that loops again fails here
// rather than hanging the machine.
namespace {

Child run_train_bounded(const std::vector<std::string>& args) {
  std::vector<std::string> command = {"/usr/bin/timeout", "-s", "KILL", "120"};
#ifndef VITLENS_TEST_SANITIZER_ALLOCATOR
  command.insert(command.end(), {"/usr/bin/prlimit", "--as=2147483648"});
#endif
  command.push_back(VITLENS_BINARY);
  command.insert(command.end(), args.begin(), args.end());
  return run_measured(command);
}

void small_png(const std::string& path, int value) {
  REQUIRE(cv::imwrite(path, cv::Mat(8, 8, CV_8UC3, cv::Scalar(value, 255 - value, value / 2))));
}

void symlink_or_fail(const std::string& target, const std::string& link) { REQUIRE(::symlink(target.c_str(), link.c_str()) == 0); }

}  // namespace

TEST_CASE("train on folders with link loops, a link to / and damaged images: ends, each image once, one line each", "[train][hostile][links]") {
  const std::string d = test::temp_dir("hostile-data");
  for (const char* c : {"/a", "/b"}) REQUIRE(::mkdir((d + c).c_str(), 0755) == 0);
  for (int i = 0; i < 3; ++i) {
    small_png(d + "/a/" + std::to_string(i) + ".png", 40 * i);
    small_png(d + "/b/" + std::to_string(i) + ".png", 200 - 40 * i);
  }
  symlink_or_fail(".", d + "/a/l1");  // two self-links: hung with memory growing without limit
  symlink_or_fail(".", d + "/a/l2");
  symlink_or_fail("/", d + "/b/root");  // walked the whole disk
  symlink_or_fail("..", d + "/b/up");  // a loop through the parent
  spit(d + "/a/truncated.png", slurp(d + "/a/0.png").substr(0, 40));
  std::string flipped = real_photo();
  for (size_t at = 600; at < flipped.size(); at += 97) flipped[at] = static_cast<char>(flipped[at] ^ 0x5a);
  spit(d + "/b/flipped.jpg", flipped);
  spit(d + "/b/bomb.png", bomb_png(60000, 60000, 8, 2, 3));  // 3.6 gigapixels claimed
  raise_own_peak_rss(256);  // each child's own peak is measured, not this process's

  const std::string common = "--img-size 8 --patch 4 --depth 1 --embed-dim 8 --heads 2 --batch 2 --epochs 1 --val-split 0";
  auto args = [&](const std::string& data, const std::string& out) {
    std::vector<std::string> a = {"train", "--data", data, "--out", d + "/" + out};
    std::istringstream words(common);
    for (std::string w; words >> w;) a.push_back(w);
    return a;
  };
  SECTION("an ImageFolder") {
    const Child c = run_train_bounded(args(d, "run"));
    INFO(c.err);
    CHECK(c.code == 0);
    CHECK_THAT(c.err, Catch::Contains("on 6 images of " + d));
    CHECK_THAT(c.err, Catch::Contains("vitlens: not following 2 links to a folder outside the data folder (" + d +
                                      "/b/root: a link to /, outside " + d + "/b)"));
    // Whatever the damage, each bad image is named in the one line of skipped files.
    CHECK_THAT(c.err, Catch::Contains("vitlens: skipped 3 unreadable image(s) in " + d));
    for (const char* bad : {"/a/truncated.png", "/b/flipped.jpg", "/b/bomb.png"}) CHECK_THAT(c.err, Catch::Contains(d + bad));
    CHECK(c.max_rss_kb < 200 * 1024);
  }
  SECTION("photos:DIR") {
    const Child c = run_train_bounded(args("photos:" + d, "mae"));
    INFO(c.err);
    CHECK(c.code == 0);
    // a/, b/ and nothing through a link; d itself again through b/up is the folder read already.
    CHECK_THAT(c.err, Catch::Contains("on 6 photos of " + d));
    CHECK_THAT(c.err, Catch::Contains("vitlens: not following 1 link to a folder outside the data folder (" + d +
                                      "/b/root: a link to /, outside " + d + ")"));
    CHECK(c.max_rss_kb < 200 * 1024);
  }
  std::filesystem::remove_all(d);  // removes the links, never what they point to
}
