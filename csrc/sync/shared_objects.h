// Stand-alone synchronisation objects allocated in a pool and found by handle, so that unrelated
// processes can share them (the Python API and the tests use these; the queue embeds its own).
#pragma once

#include <cstdint>
#include <memory>

#include "shm/pool.h"
#include "sync/futex.h"
#include "sync/robust_mutex.h"

namespace stubhost {

struct SharedSemaphoreShm {
  uint32_t magic;
  uint32_t reserved;
  ShmSemaphore sem;
};

/// A counting semaphore in a pool. post/wait from any thread of any process.
class SharedSemaphore {
 public:
  static SharedSemaphore create(const std::shared_ptr<Pool>& pool, uint32_t initial);
  static SharedSemaphore attach(const std::shared_ptr<Pool>& pool, uint64_t handle);
  uint64_t handle() const noexcept { return handle_; }
  void post() noexcept { s_->sem.post(); }
  bool wait(const Deadline& deadline) { return s_->sem.wait(deadline); }
  uint32_t value() const noexcept { return s_->sem.count.load(std::memory_order_relaxed); }

 private:
  SharedSemaphore(std::shared_ptr<Pool> pool, uint64_t handle, SharedSemaphoreShm* s)
      : pool_(std::move(pool)), handle_(handle), s_(s) {}
  std::shared_ptr<Pool> pool_;
  uint64_t handle_;
  SharedSemaphoreShm* s_;
};

struct SharedMutexShm {
  uint32_t magic;
  uint32_t reserved;
  alignas(8) RobustMutex mutex;
};

/// A robust mutex in a pool. lock/unlock from any thread of any process.
class SharedMutex {
 public:
  static SharedMutex create(const std::shared_ptr<Pool>& pool);
  static SharedMutex attach(const std::shared_ptr<Pool>& pool, uint64_t handle);
  uint64_t handle() const noexcept { return handle_; }
  RobustMutex::LockResult lock(const Deadline& deadline) { return m_->mutex.lock(deadline); }
  void unlock() noexcept { m_->mutex.unlock(); }

 private:
  SharedMutex(std::shared_ptr<Pool> pool, uint64_t handle, SharedMutexShm* m)
      : pool_(std::move(pool)), handle_(handle), m_(m) {}
  std::shared_ptr<Pool> pool_;
  uint64_t handle_;
  SharedMutexShm* m_;
};

}  // namespace stubhost
