#include "sync/shared_objects.h"

#include <new>

#include "common/errors.h"

namespace stubhost {
namespace {
constexpr uint32_t kSemaphoreMagic = 0x4d455353;  // "SSEM"
constexpr uint32_t kMutexMagic = 0x54554d53;      // "SMUT"
}  // namespace

SharedSemaphore SharedSemaphore::create(const std::shared_ptr<Pool>& pool, uint32_t initial) {
  const uint64_t h = pool->allocate(sizeof(SharedSemaphoreShm));
  auto* s = new (pool->resolve(h, sizeof(SharedSemaphoreShm))) SharedSemaphoreShm;
  s->reserved = 0;
  s->sem.init(initial);
  __atomic_store_n(&s->magic, kSemaphoreMagic, __ATOMIC_RELEASE);
  return SharedSemaphore(pool, h, s);
}

SharedSemaphore SharedSemaphore::attach(const std::shared_ptr<Pool>& pool, uint64_t handle) {
  auto* s = reinterpret_cast<SharedSemaphoreShm*>(pool->resolve(handle, sizeof(SharedSemaphoreShm)));
  if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != kSemaphoreMagic) {
    throw InvalidHandleError("handle does not name a semaphore");
  }
  return SharedSemaphore(pool, handle, s);
}

SharedMutex SharedMutex::create(const std::shared_ptr<Pool>& pool) {
  const uint64_t h = pool->allocate(sizeof(SharedMutexShm));
  auto* m = new (pool->resolve(h, sizeof(SharedMutexShm))) SharedMutexShm;
  m->reserved = 0;
  m->mutex.init();
  __atomic_store_n(&m->magic, kMutexMagic, __ATOMIC_RELEASE);
  return SharedMutex(pool, h, m);
}

SharedMutex SharedMutex::attach(const std::shared_ptr<Pool>& pool, uint64_t handle) {
  auto* m = reinterpret_cast<SharedMutexShm*>(pool->resolve(handle, sizeof(SharedMutexShm)));
  if (__atomic_load_n(&m->magic, __ATOMIC_ACQUIRE) != kMutexMagic) {
    throw InvalidHandleError("handle does not name a mutex");
  }
  return SharedMutex(pool, handle, m);
}

}  // namespace stubhost
