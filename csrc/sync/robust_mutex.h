// A process-shared robust mutex: a holder that dies does not deadlock the others.
#pragma once

#include <pthread.h>

#include <chrono>

#include "sync/futex.h"

namespace stubhost {

/// Lives in shared memory; init() once by the creator. lock/unlock from any thread of any process.
/// When the previous owner died holding it, lock() succeeds and reports `recovered`, so the caller
/// can repair the state the mutex protects before relying on it.
class RobustMutex {
 public:
  enum class LockResult { kAcquired, kRecovered, kTimedOut };

  void init();
  LockResult lock(const Deadline& deadline);
  void unlock() noexcept;

 private:
  pthread_mutex_t mutex_;
};
static_assert(sizeof(RobustMutex) == sizeof(pthread_mutex_t), "RobustMutex is a bare pthread mutex");

/// Scoped ownership of a RobustMutex. Throws LockTimeoutError if the deadline passes.
class RobustLock {
 public:
  RobustLock(RobustMutex& mutex, const Deadline& deadline, const char* what);
  ~RobustLock() { mutex_.unlock(); }
  RobustLock(const RobustLock&) = delete;
  RobustLock& operator=(const RobustLock&) = delete;
  /// True if the previous owner died while holding the lock.
  bool recovered() const noexcept { return recovered_; }

 private:
  RobustMutex& mutex_;
  bool recovered_ = false;
};

}  // namespace stubhost
