// UTF-8 checks (utf8.hpp).
#include "core/base/utf8.hpp"

#include <cstdint>
#include <cstdio>

namespace vitlens {

size_t utf8_char_length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t n = 0;
  uint32_t min = 0, code = 0;
  if ((b0 & 0xE0) == 0xC0) n = 2, min = 0x80, code = b0 & 0x1F;
  else if ((b0 & 0xF0) == 0xE0) n = 3, min = 0x800, code = b0 & 0x0F;
  else if ((b0 & 0xF8) == 0xF0) n = 4, min = 0x10000, code = b0 & 0x07;
  else return 0;  // a continuation byte, or 0xF8 and above
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return n;
}

bool is_valid_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_char_length(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_escaped(const std::string& text, bool escape_backslash) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = escape_backslash && text[i] == '\\' ? 0 : utf8_char_length(text, i);
    if (n > 0) {
      out.append(text, i, n);
      i += n;
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned>(static_cast<uint8_t>(text[i])));
      out += hex;
      ++i;
    }
  }
  return out;
}

}  // namespace vitlens
