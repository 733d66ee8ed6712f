// One POSIX shared-memory object mapped into this process (RAII).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stubhost {

/// A mapped POSIX shm object. Creating makes it with O_CREAT|O_EXCL and mode 0600 and reserves
/// its pages (so a full /dev/shm is an error now, not a SIGBUS later). Destruction unmaps; only
/// unlink() removes the name. Not thread-safe; callers own it exclusively.
class ShmSegment {
 public:
  /// Creates and maps a new object of `size` bytes. Throws ShmSpaceError when /dev/shm is too small.
  static ShmSegment create(const std::string& name, uint64_t size);
  /// Opens and maps an existing object; its size is what fstat reports, never what a peer claims.
  static ShmSegment open(const std::string& name);
  /// Removes a name; returns false if it did not exist.
  static bool unlink(const std::string& name);
  /// Removes a name; returns 0 or the errno (ENOENT included) instead of throwing.
  static int unlink_quiet(const std::string& name) noexcept;

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  uint8_t* data() const noexcept { return data_; }
  uint64_t size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }

 private:
  ShmSegment(std::string name, uint8_t* data, uint64_t size);
  void release() noexcept;

  std::string name_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

/// A fresh unguessable object name: "/<prefix>_<pid>_<16 random hex digits>".
std::string random_shm_name(const std::string& prefix);

/// "N bytes free of M in /dev/shm", for error messages.
std::string shm_space_report();

}  // namespace stubhost
