#include "common/errors.h"

#include <cstring>

namespace stubhost {

std::string errno_message(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

SystemError::SystemError(const std::string& what, int err)
    : CoreError(errno_message(what, err)), err_(err) {}

}  // namespace stubhost
