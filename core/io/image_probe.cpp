// Image headers read by hand, before any decoder runs: size limits and damage checks from the
// bytes. Each reader follows its format's specification (PNG: ISO/IEC 15948 chunks; JPEG: ITU
// T.81 markers; BMP: BITMAPINFOHEADER; TIFF 6.0 / BigTIFF IFDs; WebP RIFF container; Netpbm;
// Sun raster; Radiance; JPEG 2000 part 1 boxes and SIZ; OpenEXR header attributes) and checks
// every offset against the buffer's size.
#include "core/io/image_probe.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace vitlens {

const char* const kImageFormatsRead =
    "PNG, JPEG, BMP, TIFF, WebP, JPEG 2000, PBM/PGM/PPM/PAM, PFM, Sun raster, Radiance HDR, OpenEXR";

namespace {

// A bounds-checked view of the file: every read past the end returns 0 and sets `short_read`.
struct Bytes {
  const unsigned char* p;
  size_t n;
  mutable bool short_read = false;
  bool has(size_t at, size_t len) const { return at <= n && len <= n - at; }
  uint64_t be(size_t at, int len) const {
    if (!has(at, static_cast<size_t>(len))) {
      short_read = true;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < len; ++i) v = (v << 8) | p[at + static_cast<size_t>(i)];
    return v;
  }
  uint64_t le(size_t at, int len) const {
    if (!has(at, static_cast<size_t>(len))) {
      short_read = true;
      return 0;
    }
    uint64_t v = 0;
    for (int i = len - 1; i >= 0; --i) v = (v << 8) | p[at + static_cast<size_t>(i)];
    return v;
  }
  bool starts(size_t at, const char* text, size_t len) const { return has(at, len) && std::memcmp(p + at, text, len) == 0; }
};

void probe_png(const Bytes& b, ImageProbe& out) {
  out.format = "PNG";
  if (!b.starts(12, "IHDR", 4)) {
    out.damage = "its first chunk is not IHDR";
    return;
  }
  out.width = static_cast<int64_t>(b.be(16, 4));
  out.height = static_cast<int64_t>(b.be(20, 4));
  // Colour type: 0 grey, 2 RGB, 3 palette (RGB, or RGBA with a tRNS chunk), 4 grey + alpha, 6 RGBA.
  const uint64_t depth = b.be(24, 1), colour = b.be(25, 1);
  out.channels = colour == 0 ? 1 : colour == 2 ? 3 : colour == 4 ? 2 : 4;
  out.bits = colour == 3 ? 8 : static_cast<int>(depth);
  // Chunks: length (4, big-endian), type (4), data, CRC (4); the last one is IEND.
  size_t at = 8;
  while (b.has(at, 8)) {
    const uint64_t len = b.be(at, 4);
    if (len > b.n || !b.has(at, 12 + len)) break;
    if (b.starts(at + 4, "IEND", 4)) return;
    at += 12 + len;
  }
  out.damage = "the file ends before its IEND chunk (truncated)";
}

void probe_jpeg(const Bytes& b, ImageProbe& out) {
  out.format = "JPEG";
  size_t at = 2;
  bool frame = false;
  while (at < b.n) {
    if (b.p[at] != 0xFF) {  // stray bytes between segments: libjpeg skips them too
      ++at;
      continue;
    }
    while (at + 1 < b.n && b.p[at + 1] == 0xFF) ++at;  // fill bytes
    if (at + 1 >= b.n) break;
    const unsigned char marker = b.p[at + 1];
    if (marker == 0xD9) {  // EOI
      if (!frame) out.damage = "it has no frame header (SOF) before its end";
      return;
    }
    if ((marker >= 0xD0 && marker <= 0xD7) || marker == 0x01 || marker == 0xD8 || marker == 0x00) {
      at += 2;  // markers without a length
      continue;
    }
    const uint64_t len = b.be(at + 2, 2);
    if (len < 2 || !b.has(at + 2, len)) break;
    // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC): precision, height, width.
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC && !frame) {
      frame = true;
      out.bits = static_cast<int>(b.be(at + 4, 1));
      out.channels = static_cast<int>(b.be(at + 9, 1));
      out.progressive = marker == 0xC2 || marker == 0xC6 || marker == 0xCA || marker == 0xCE;
      out.height = static_cast<int64_t>(b.be(at + 5, 2));
      out.width = static_cast<int64_t>(b.be(at + 7, 2));
      if (out.height == 0) out.height = -1;  // declared later by a DNL marker: unknown here
    }
    at += 2 + len;
    if (marker == 0xDA) {  // SOS: entropy-coded data up to the next marker that is not RSTn or 0xFF00
      while (at + 1 < b.n && !(b.p[at] == 0xFF && b.p[at + 1] != 0x00 && !(b.p[at + 1] >= 0xD0 && b.p[at + 1] <= 0xD7) &&
                               b.p[at + 1] != 0xFF))
        ++at;
    }
  }
  out.damage = "the file ends before its end-of-image marker (truncated)";
}

void probe_bmp(const Bytes& b, ImageProbe& out) {
  out.format = "BMP";
  const uint64_t dib = b.le(14, 4);
  uint64_t bpp = 0, compression = 0;
  if (dib == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sizes
    out.width = static_cast<int64_t>(b.le(18, 2));
    out.height = static_cast<int64_t>(b.le(20, 2));
    bpp = b.le(24, 2);
  } else {
    out.width = static_cast<int32_t>(b.le(18, 4));
    out.height = std::abs(static_cast<int64_t>(static_cast<int32_t>(b.le(22, 4))));  // negative: top-down
    bpp = b.le(28, 2);
    compression = b.le(30, 4);
  }
  if (b.short_read) {
    out.damage = "its header is cut short (truncated)";
    return;
  }
  out.channels = bpp == 32 ? 4 : 3;  // palettes and 16-bit pixels decode to 8-bit colour
  out.bits = 8;
  // Uncompressed rows are padded to 4 bytes; the pixel data starts at the offset in bytes 10..13.
  if ((compression == 0 || compression == 3 || compression == 6) && out.width > 0 && out.width < (1 << 24) &&
      out.height < (1 << 24) && bpp > 0 && bpp <= 64) {
    const uint64_t stride = (static_cast<uint64_t>(out.width) * bpp + 31) / 32 * 4;
    const uint64_t need = b.le(10, 4) + stride * static_cast<uint64_t>(out.height);
    if (need > b.n) out.damage = "its pixel data ends early (" + std::to_string(b.n) + " of " + std::to_string(need) + " bytes; truncated)";
  }
}

void probe_tiff(const Bytes& b, ImageProbe& out, bool big) {
  out.format = "TIFF";
  const bool little = b.p[0] == 'I';
  auto num = [&](size_t at, int len) { return little ? b.le(at, len) : b.be(at, len); };
  const uint64_t ifd = big ? num(8, 8) : num(4, 4);
  const int count_len = big ? 8 : 2, entry_len = big ? 20 : 12, value_len = big ? 8 : 4;
  const uint64_t entries = num(static_cast<size_t>(ifd), count_len);
  if (b.short_read || ifd > b.n || entries > 65535) {
    out.damage = "its first directory (IFD) lies outside the file (truncated)";
    return;
  }
  // Values of one entry as integers (SHORT, LONG, LONG8), in place or at their offset.
  auto values = [&](size_t entry, std::vector<uint64_t>& v) {
    const uint64_t type = num(entry + 2, 2);
    const uint64_t count = num(entry + 4, big ? 8 : 4);
    const int size = type == 3 ? 2 : type == 4 ? 4 : type == 16 ? 8 : 0;
    v.clear();
    if (size == 0 || count > (1u << 24)) return false;
    size_t at = entry + 4 + static_cast<size_t>(big ? 8 : 4);
    if (count * static_cast<uint64_t>(size) > static_cast<uint64_t>(value_len)) at = static_cast<size_t>(num(at, value_len));
    if (!b.has(at, count * static_cast<uint64_t>(size))) return false;
    for (uint64_t i = 0; i < count; ++i) v.push_back(num(at + i * static_cast<uint64_t>(size), size));
    return true;
  };
  std::vector<uint64_t> offsets, counts, v;
  bool offsets_ok = true;
  out.channels = 1;  // the defaults of SamplesPerPixel and BitsPerSample
  out.bits = 1;
  for (uint64_t i = 0; i < entries; ++i) {
    const size_t entry = static_cast<size_t>(ifd) + static_cast<size_t>(count_len) + static_cast<size_t>(i) * static_cast<size_t>(entry_len);
    const uint64_t tag = num(entry, 2);
    if (b.short_read) break;
    if (tag == 256 && values(entry, v) && !v.empty()) out.width = static_cast<int64_t>(v[0]);
    if (tag == 257 && values(entry, v) && !v.empty()) out.height = static_cast<int64_t>(v[0]);
    if (tag == 258 && values(entry, v) && !v.empty()) out.bits = static_cast<int>(std::min<uint64_t>(v[0], 64));
    if (tag == 277 && values(entry, v) && !v.empty()) out.channels = static_cast<int>(std::min<uint64_t>(v[0], 64));
    if (tag == 339 && values(entry, v) && !v.empty()) out.float_samples = v[0] == 3;  // SampleFormat: IEEE float
    if (tag == 273 || tag == 324) offsets_ok = values(entry, offsets) && offsets_ok;  // strip / tile offsets
    if (tag == 279 || tag == 325) offsets_ok = values(entry, counts) && offsets_ok;   // their byte counts
  }
  if (b.short_read) {
    out.damage = "its first directory (IFD) is cut short (truncated)";
    return;
  }
  if (!offsets_ok) {
    out.damage = "its strip or tile table lies outside the file (truncated)";
    return;
  }
  for (size_t i = 0; i < std::min(offsets.size(), counts.size()); ++i)
    if (offsets[i] > b.n || counts[i] > b.n - offsets[i]) {
      out.damage = "its pixel data ends early (truncated)";
      return;
    }
}

void probe_webp(const Bytes& b, ImageProbe& out) {
  out.format = "WebP";
  if (b.le(4, 4) + 8 > b.n) {
    out.damage = "the file is shorter than its RIFF header says (truncated)";
    return;
  }
  out.bits = 8;
  out.channels = 4;  // lossless and extended files may hold alpha
  if (b.starts(12, "VP8 ", 4)) {  // lossy: frame tag (3), start code 9d 01 2a, 14-bit sizes
    out.channels = 3;
    out.width = static_cast<int64_t>(b.le(26, 2) & 0x3fff);
    out.height = static_cast<int64_t>(b.le(28, 2) & 0x3fff);
  } else if (b.starts(12, "VP8L", 4)) {  // lossless: signature 0x2f, then 14 bits width-1, 14 bits height-1
    const uint64_t bits = b.le(21, 4);
    out.width = static_cast<int64_t>((bits & 0x3fff) + 1);
    out.height = static_cast<int64_t>(((bits >> 14) & 0x3fff) + 1);
  } else if (b.starts(12, "VP8X", 4)) {  // extended: 24-bit canvas width-1 and height-1
    out.width = static_cast<int64_t>(b.le(24, 3) + 1);
    out.height = static_cast<int64_t>(b.le(27, 3) + 1);
  }
  if (b.short_read) out.damage = "its header is cut short (truncated)";
}

// Netpbm (P1..P7) and PFM: whitespace-separated ASCII fields, '#' comments (Netpbm only).
struct TextHeader {
  const Bytes& b;
  size_t at;
  bool next(std::string& token, bool comments = true) {
    token.clear();
    while (at < b.n) {
      const unsigned char c = b.p[at];
      if (comments && c == '#') {
        while (at < b.n && b.p[at] != '\n' && b.p[at] != '\r') ++at;
      } else if (std::isspace(c)) {
        ++at;
      } else {
        break;
      }
    }
    while (at < b.n && !std::isspace(b.p[at]) && token.size() < 32) token.push_back(static_cast<char>(b.p[at++]));
    return !token.empty();
  }
};

int64_t to_int(const std::string& text) {
  if (text.empty() || text.size() > 18) return -1;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

void probe_pnm(const Bytes& b, ImageProbe& out) {
  const char kind = static_cast<char>(b.p[1]);
  TextHeader h{b, 2};
  std::string t;
  int64_t channels = 1, maxval = 1;
  if (kind == '7') {  // PAM: KEY value lines up to ENDHDR
    out.format = "PAM";
    while (h.next(t) && t != "ENDHDR") {
      std::string value;
      if (t == "TUPLTYPE") {  // the rest of the line
        while (h.at < b.n && b.p[h.at] != '\n') ++h.at;
        continue;
      }
      if (!h.next(value)) break;
      if (t == "WIDTH") out.width = to_int(value);
      else if (t == "HEIGHT") out.height = to_int(value);
      else if (t == "DEPTH") channels = to_int(value);
      else if (t == "MAXVAL") maxval = to_int(value);
    }
    if (t != "ENDHDR") {
      out.damage = "its header has no ENDHDR (truncated)";
      return;
    }
  } else {
    out.format = kind == '1' || kind == '4' ? "PBM" : kind == '2' || kind == '5' ? "PGM" : "PPM";
    channels = kind == '3' || kind == '6' ? 3 : 1;
    if (h.next(t)) out.width = to_int(t);
    if (h.next(t)) out.height = to_int(t);
    if (kind != '1' && kind != '4' && h.next(t)) maxval = to_int(t);
  }
  if (out.width < 0 || out.height < 0 || channels < 1 || maxval < 1) {
    out.damage = "its header is malformed or cut short";
    return;
  }
  out.channels = static_cast<int>(std::min<int64_t>(channels, 64));
  out.bits = maxval > 255 ? 16 : 8;
  if (kind == '4' || kind == '5' || kind == '6' || kind == '7') {  // binary pixels after one whitespace byte
    const uint64_t sample = maxval > 255 ? 2 : 1;
    const uint64_t w = static_cast<uint64_t>(out.width), hgt = static_cast<uint64_t>(out.height);
    const uint64_t need = kind == '4' ? (w + 7) / 8 * hgt : w * hgt * static_cast<uint64_t>(channels) * sample;
    const size_t start = h.at + 1;
    if (w < (1u << 24) && hgt < (1u << 24) && (start > b.n || need > b.n - start))
      out.damage = "its pixel data ends early (truncated)";
  }
}

void probe_pfm(const Bytes& b, ImageProbe& out) {
  out.format = "PFM";
  TextHeader h{b, 2};
  std::string t;
  if (h.next(t, false)) out.width = to_int(t);
  if (h.next(t, false)) out.height = to_int(t);
  if (!h.next(t, false) || out.width < 0 || out.height < 0) {
    out.damage = "its header is malformed or cut short";
    return;
  }
  const uint64_t channels = b.p[1] == 'F' ? 3 : 1;
  out.channels = static_cast<int>(channels);
  out.bits = 32;
  out.float_samples = true;
  const uint64_t w = static_cast<uint64_t>(out.width), hgt = static_cast<uint64_t>(out.height);
  const size_t start = h.at + 1;
  if (w < (1u << 24) && hgt < (1u << 24) && (start > b.n || w * hgt * channels * 4 > b.n - start))
    out.damage = "its pixel data ends early (truncated)";
}

void probe_hdr(const Bytes& b, ImageProbe& out) {
  out.format = "Radiance HDR";
  out.channels = 3;
  out.bits = 32;
  out.float_samples = true;
  // Header lines up to an empty line, then the resolution line: "-Y 480 +X 640" (or another order).
  size_t at = 0;
  bool blank = false;
  while (at < b.n && at < (1u << 20)) {
    size_t end = at;
    while (end < b.n && b.p[end] != '\n') ++end;
    if (blank) {
      const Bytes line{b.p + at, end - at};
      TextHeader h{line, 0};
      std::string axis1, n1, axis2, n2;
      h.next(axis1, false);
      h.next(n1, false);
      h.next(axis2, false);
      h.next(n2, false);
      const bool y_first = axis1.size() == 2 && axis1[1] == 'Y';
      out.height = to_int(y_first ? n1 : n2);
      out.width = to_int(y_first ? n2 : n1);
      if (out.width < 0 || out.height < 0) out.damage = "its resolution line is malformed";
      return;
    }
    blank = end == at || (end == at + 1 && b.p[at] == '\r');
    at = end + 1;
  }
  out.damage = "its header is cut short (truncated)";
}

void probe_jp2(const Bytes& b, ImageProbe& out, bool codestream) {
  out.format = "JPEG 2000";
  size_t siz = 0;  // offset of the SIZ marker segment
  if (codestream) {
    siz = 2;
  } else {
    // Boxes: length (4), type (4); jp2h is a superbox holding ihdr (height, width) first.
    size_t at = 0;
    while (b.has(at, 8)) {
      uint64_t len = b.be(at, 4);
      size_t header = 8;
      if (len == 1) {
        len = b.be(at + 8, 8);
        header = 16;
      }
      if (b.starts(at + 4, "jp2h", 4)) {
        at += header;
        continue;  // step into the superbox
      }
      if (b.starts(at + 4, "ihdr", 4)) {
        out.height = static_cast<int64_t>(b.be(at + 8, 4));
        out.width = static_cast<int64_t>(b.be(at + 12, 4));
        out.channels = static_cast<int>(b.be(at + 16, 2));
        out.bits = static_cast<int>(b.be(at + 18, 1) & 0x7f) + 1;  // 255: per component (bpcc); 8 assumed below
        if (out.bits > 38) out.bits = 16;
        return;
      }
      if (len == 0 || len < header) break;  // a box up to the end of the file, or malformed
      at += static_cast<size_t>(std::min<uint64_t>(len, b.n));
    }
    out.damage = "it has no image header box (ihdr)";
    return;
  }
  if (b.be(siz, 2) != 0xFF51) {
    out.damage = "its codestream does not start with SIZ";
    return;
  }
  // SIZ: marker, Lsiz, Rsiz, Xsiz, Ysiz, XOsiz, YOsiz (image area = size minus offset)
  const int64_t xs = static_cast<int64_t>(b.be(siz + 6, 4)), ys = static_cast<int64_t>(b.be(siz + 10, 4));
  const int64_t xo = static_cast<int64_t>(b.be(siz + 14, 4)), yo = static_cast<int64_t>(b.be(siz + 18, 4));
  out.width = xs - xo;
  out.height = ys - yo;
  out.channels = static_cast<int>(b.be(siz + 38, 2));  // Csiz, then Ssiz (depth - 1) per component
  out.bits = static_cast<int>(b.be(siz + 40, 1) & 0x7f) + 1;
  if (b.short_read) out.damage = "its header is cut short (truncated)";
}

void probe_exr(const Bytes& b, ImageProbe& out) {
  out.format = "OpenEXR";
  out.channels = 4;  // at most RGBA is decoded, as float
  out.bits = 32;
  out.float_samples = true;
  // Attributes after magic and version: name\0 type\0 size (4, LE) value; an empty name ends them.
  size_t at = 8;
  while (at < b.n) {
    const size_t name_end = static_cast<size_t>(std::find(b.p + at, b.p + b.n, 0) - b.p);
    if (name_end >= b.n || name_end == at) break;
    const std::string name(reinterpret_cast<const char*>(b.p + at), name_end - at);
    const size_t type_end = static_cast<size_t>(std::find(b.p + name_end + 1, b.p + b.n, 0) - b.p);
    if (type_end >= b.n) break;
    const uint64_t size = b.le(type_end + 1, 4);
    const size_t value = type_end + 5;
    if (!b.has(value, size)) break;
    if (name == "dataWindow" && size == 16) {  // box2i: xMin, yMin, xMax, yMax
      const auto x0 = static_cast<int32_t>(b.le(value, 4)), y0 = static_cast<int32_t>(b.le(value + 4, 4));
      const auto x1 = static_cast<int32_t>(b.le(value + 8, 4)), y1 = static_cast<int32_t>(b.le(value + 12, 4));
      out.width = static_cast<int64_t>(x1) - x0 + 1;
      out.height = static_cast<int64_t>(y1) - y0 + 1;
      return;
    }
    at = value + static_cast<size_t>(size);
  }
  out.damage = "its header has no dataWindow (truncated?)";
}

}  // namespace

ImageProbe probe_image(const unsigned char* data, size_t size) {
  ImageProbe out;
  const Bytes b{data, size};
  if (b.starts(0, "\x89PNG\r\n\x1a\n", 8)) probe_png(b, out);
  else if (b.starts(0, "\xff\xd8\xff", 3)) probe_jpeg(b, out);
  else if (b.starts(0, "BM", 2) && size >= 26) probe_bmp(b, out);
  else if (b.starts(0, "II*\0", 4) || b.starts(0, "MM\0*", 4)) probe_tiff(b, out, false);
  else if (b.starts(0, "II+\0", 4) || b.starts(0, "MM\0+", 4)) probe_tiff(b, out, true);
  else if (b.starts(0, "RIFF", 4) && b.starts(8, "WEBP", 4)) probe_webp(b, out);
  else if (size >= 3 && b.p[0] == 'P' && b.p[1] >= '1' && b.p[1] <= '7' && std::isspace(b.p[2])) probe_pnm(b, out);
  else if (size >= 3 && b.p[0] == 'P' && (b.p[1] == 'F' || b.p[1] == 'f') && std::isspace(b.p[2])) probe_pfm(b, out);
  else if (b.starts(0, "\x59\xa6\x6a\x95", 4)) {
    out.format = "Sun raster";
    out.width = static_cast<int64_t>(b.be(4, 4));
    out.height = static_cast<int64_t>(b.be(8, 4));
    out.channels = b.be(12, 4) == 32 ? 4 : 3;  // any depth decodes to 8-bit colour
    out.bits = 8;
    if (b.short_read) out.damage = "its header is cut short (truncated)";
  } else if (b.starts(0, "#?RADIANCE", 10) || b.starts(0, "#?RGBE", 6)) probe_hdr(b, out);
  else if (b.starts(0, "\0\0\0\x0cjP  \r\n\x87\n", 12)) probe_jp2(b, out, false);
  else if (b.starts(0, "\xff\x4f\xff\x51", 4)) probe_jp2(b, out, true);
  else if (b.starts(0, "\x76\x2f\x31\x01", 4)) probe_exr(b, out);
  return out;
}

}  // namespace vitlens
