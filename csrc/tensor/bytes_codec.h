// Triton's BYTES tensor layout: per element, a 4-byte little-endian length then the bytes, C order.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "common/errors.h"

namespace stubhost {

/// Writes one element at dst; returns the bytes written (4 + len).
inline uint64_t encode_bytes_element(uint8_t* dst, const char* data, uint32_t len) noexcept {
  const uint8_t prefix[4] = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                             static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
  std::memcpy(dst, prefix, 4);
  if (len) std::memcpy(dst + 4, data, len);
  return 4 + uint64_t{len};
}

/// Every element takes at least its 4-byte prefix, so a count above size / 4 is impossible; check
/// it before sizing anything by `count` (a forged shape could claim 2^61 elements).
inline void check_bytes_count(uint64_t size, uint64_t count) {
  if (count > size / 4) {
    throw FormatError("BYTES tensor of " + std::to_string(size) + " bytes cannot hold " + std::to_string(count) +
                      " elements");
  }
}

/// Calls f(const char* data, uint32_t len) for each of `count` elements of buf[0, size).
/// Throws FormatError if an element runs past the end or bytes are left over.
template <class F>
void decode_bytes(const uint8_t* buf, uint64_t size, uint64_t count, F&& f) {
  check_bytes_count(size, count);
  uint64_t off = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (size - off < 4) {
      throw FormatError("BYTES tensor is truncated: element " + std::to_string(i) + " of " +
                        std::to_string(count) + " has no length prefix");
    }
    const uint32_t len = uint32_t{buf[off]} | uint32_t{buf[off + 1]} << 8 | uint32_t{buf[off + 2]} << 16 |
                         uint32_t{buf[off + 3]} << 24;
    off += 4;
    if (len > size - off) {
      throw FormatError("BYTES tensor is truncated: element " + std::to_string(i) + " claims " +
                        std::to_string(len) + " bytes but only " + std::to_string(size - off) + " remain");
    }
    f(reinterpret_cast<const char*>(buf + off), len);
    off += len;
  }
  if (off != size) {
    throw FormatError("BYTES tensor has " + std::to_string(size - off) + " trailing bytes after " +
                      std::to_string(count) + " elements");
  }
}

/// Counts the elements in a BYTES buffer (validating it).
uint64_t count_bytes_elements(const uint8_t* buf, uint64_t size);

}  // namespace stubhost
