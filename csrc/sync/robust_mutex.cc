#include "sync/robust_mutex.h"

#include <cerrno>
#include <ctime>
#include <string>

#include "common/errors.h"

namespace stubhost {

void RobustMutex::init() {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(&mutex_, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) throw SystemError("pthread_mutex_init", rc);
}

RobustMutex::LockResult RobustMutex::lock(const Deadline& deadline) {
  int rc;
  if (deadline.infinite()) {
    rc = pthread_mutex_lock(&mutex_);
  } else {
    // pthread_mutex_clocklock takes an absolute CLOCK_MONOTONIC time, matching Deadline's clock.
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const auto left = deadline.remaining(std::chrono::hours(24)).count();
    struct timespec abs;
    abs.tv_sec = now.tv_sec + static_cast<time_t>(left / 1000000000);
    abs.tv_nsec = now.tv_nsec + static_cast<long>(left % 1000000000);
    if (abs.tv_nsec >= 1000000000) {
      abs.tv_sec += 1;
      abs.tv_nsec -= 1000000000;
    }
    rc = pthread_mutex_clocklock(&mutex_, CLOCK_MONOTONIC, &abs);
  }
  switch (rc) {
    case 0:
      return LockResult::kAcquired;
    case EOWNERDEAD:
      // The owner died inside its critical section. We own the mutex now; mark it usable again.
      // The caller is told, so it can check the data the dead owner may have left half-written.
      pthread_mutex_consistent(&mutex_);
      return LockResult::kRecovered;
    case ETIMEDOUT:
      return LockResult::kTimedOut;
    default:
      throw SystemError("pthread_mutex_lock", rc);
  }
}

void RobustMutex::unlock() noexcept { pthread_mutex_unlock(&mutex_); }

RobustLock::RobustLock(RobustMutex& mutex, const Deadline& deadline, const char* what)
    : mutex_(mutex) {
  switch (mutex_.lock(deadline)) {
    case RobustMutex::LockResult::kAcquired:
      break;
    case RobustMutex::LockResult::kRecovered:
      recovered_ = true;
      break;
    case RobustMutex::LockResult::kTimedOut:
      throw LockTimeoutError(std::string("timed out waiting for the ") + what +
                             " lock: another process holds it and does not release it");
  }
}

}  // namespace stubhost
