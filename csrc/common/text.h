// Text helpers for names that come from another process or a client.
#pragma once

#include <string>

namespace stubhost {

/// True if s is well-formed UTF-8 (no overlongs, no surrogates, at most U+10FFFF).
bool valid_utf8(const std::string& s) noexcept;

/// A name fit for an error message: quoted, cut to at most `limit` bytes on a character boundary
/// ("..." marks a cut), with invalid UTF-8 shown as \xNN escapes. Always valid UTF-8.
std::string quoted_name(const std::string& s, size_t limit = 64);

}  // namespace stubhost
