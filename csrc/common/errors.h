// Error model of the core: every failure is a C++ exception derived from CoreError.
// The bindings translate each class to one Python exception; nothing else in csrc/ knows Python.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace stubhost {

/// Base of every error the core raises.
class CoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An operating-system call failed (shm_open, mmap, ftruncate, ...). Carries errno.
class SystemError : public CoreError {
 public:
  SystemError(const std::string& what, int err);
  int error_code() const noexcept { return err_; }

 private:
  int err_;
};

/// /dev/shm cannot hold what was asked (says how big it is and how much was asked).
class ShmSpaceError : public CoreError {
 public:
  using CoreError::CoreError;
};

/// The pool reached its configured maximum; frees make room again.
class PoolFullError : public CoreError {
 public:
  using CoreError::CoreError;
};

/// A handle or a length read from shared memory does not name memory of this pool.
class InvalidHandleError : public CoreError {
 public:
  using CoreError::CoreError;
};

/// A shared-memory structure fails validation (bad magic, impossible size, broken list).
class CorruptionError : public CoreError {
 public:
  using CoreError::CoreError;
};

/// Caller-supplied data is malformed (a BYTES buffer, a tensor description).
class FormatError : public CoreError {
 public:
  using CoreError::CoreError;
};

/// The two sides speak different layout versions.
class LayoutVersionError : public CoreError {
 public:
  using CoreError::CoreError;
};

/// A lock could not be taken within its time limit (the holder is alive but stuck).
class LockTimeoutError : public CoreError {
 public:
  using CoreError::CoreError;
};

/// Formats "what: strerror(err)".
std::string errno_message(const std::string& what, int err);

/// Checked arithmetic used wherever a size comes from shared memory.
inline bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}
inline bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

/// Rounds n up to a multiple of align (a power of two); fails on overflow.
inline bool round_up(uint64_t n, uint64_t align, uint64_t* out) {
  uint64_t t;
  if (add_overflows(n, align - 1, &t)) return false;
  *out = t & ~(align - 1);
  return true;
}

}  // namespace stubhost
