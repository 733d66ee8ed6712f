#include "common/text.h"

#include <cstdint>
#include <cstdio>

namespace stubhost {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 if it is malformed.
size_t utf8_sequence_length(const std::string& s, size_t i) noexcept {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kLeast[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

bool valid_utf8(const std::string& s) noexcept {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string quoted_name(const std::string& s, size_t limit) {
  std::string out = "'";
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    const size_t width = n == 0 ? 4 : n;
    if (out.size() - 1 + width > limit) {
      out += "...";
      break;
    }
    if (n == 0) {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\x%02x", static_cast<unsigned>(static_cast<uint8_t>(s[i])));
      out += esc;
      i += 1;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out + "'";
}

}  // namespace stubhost
