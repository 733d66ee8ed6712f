#include "tensor/bytes_codec.h"

namespace stubhost {

uint64_t count_bytes_elements(const uint8_t* buf, uint64_t size) {
  uint64_t off = 0, n = 0;
  while (off < size) {
    if (size - off < 4) throw FormatError("BYTES buffer ends inside a length prefix");
    const uint32_t len = uint32_t{buf[off]} | uint32_t{buf[off + 1]} << 8 | uint32_t{buf[off + 2]} << 16 |
                         uint32_t{buf[off + 3]} << 24;
    off += 4;
    if (len > size - off) throw FormatError("BYTES buffer element runs past the end");
    off += len;
    ++n;
  }
  return n;
}

}  // namespace stubhost
