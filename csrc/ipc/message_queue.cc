#include "ipc/message_queue.h"

#include <new>
#include <string>

#include "common/errors.h"

namespace stubhost {

uint64_t MessageQueue::bytes_for(uint32_t capacity) {
  return offsetof(MessageQueueShm, slots) + uint64_t{capacity} * sizeof(uint64_t);
}

MessageQueue MessageQueue::create(const std::shared_ptr<Pool>& pool, uint32_t capacity) {
  if (capacity == 0 || capacity > kMaxQueueCapacity) {
    throw CoreError("message queue capacity must be 1.." + std::to_string(kMaxQueueCapacity));
  }
  const uint64_t h = pool->allocate(bytes_for(capacity));
  auto* q = new (pool->resolve(h, bytes_for(capacity))) MessageQueueShm;
  q->capacity = capacity;
  q->layout_version = kLayoutVersion;
  q->reserved0 = 0;
  q->mutex.init();
  q->head.store(0, std::memory_order_relaxed);
  q->tail.store(0, std::memory_order_relaxed);
  q->not_empty.init();
  q->not_full.init();
  // SYNC POINT WRITE: the magic goes last; attach() refuses a queue without it.
  __atomic_store_n(&q->magic, kQueueMagic, __ATOMIC_RELEASE);
  return MessageQueue(pool, h, q, capacity);
}

MessageQueue MessageQueue::attach(const std::shared_ptr<Pool>& pool, uint64_t handle) {
  auto* q = reinterpret_cast<MessageQueueShm*>(pool->resolve(handle, offsetof(MessageQueueShm, slots)));
  // SYNC POINT READ: pairs with the magic store in create().
  if (__atomic_load_n(&q->magic, __ATOMIC_ACQUIRE) != kQueueMagic) {
    throw InvalidHandleError("handle does not name a message queue");
  }
  if (q->layout_version != kLayoutVersion) {
    throw LayoutVersionError("message queue has layout version " + std::to_string(q->layout_version) +
                             ", this stubhost speaks " + std::to_string(kLayoutVersion));
  }
  const uint32_t capacity = q->capacity;
  if (capacity == 0 || capacity > kMaxQueueCapacity) {
    throw CorruptionError("message queue capacity " + std::to_string(capacity) + " is impossible");
  }
  pool->resolve(handle, bytes_for(capacity));  // the slots must lie inside the segment too
  return MessageQueue(pool, handle, q, capacity);
}

uint64_t MessageQueue::checked_count(uint64_t head, uint64_t tail) const {
  const uint64_t n = tail - head;
  if (n > capacity_) throw CorruptionError("message queue counters are damaged");
  return n;
}

Deadline MessageQueue::lock_deadline() const {
  // The lock is only held for a slot write; one held for seconds means a stuck peer.
  return Deadline::after(10.0);
}

uint64_t MessageQueue::size() const noexcept {
  const uint64_t head = q_->head.load(std::memory_order_acquire);
  const uint64_t tail = q_->tail.load(std::memory_order_acquire);
  const uint64_t n = tail - head;
  return n > capacity_ ? capacity_ : n;
}

bool MessageQueue::push(uint64_t value, const Deadline& deadline) {
  for (;;) {
    bool pushed = false;
    {
      RobustLock lock(q_->mutex, lock_deadline(), "message queue");
      const uint64_t head = q_->head.load(std::memory_order_relaxed);
      const uint64_t tail = q_->tail.load(std::memory_order_relaxed);
      if (checked_count(head, tail) < capacity_) {
        q_->slots[tail % capacity_] = value;
        // SYNC POINT WRITE: the tail store publishes the slot (pairs with pop's tail load).
        q_->tail.store(tail + 1, std::memory_order_release);
        pushed = true;
      }
    }
    if (pushed) {
      q_->not_empty.notify(1);
      return true;
    }
    const bool room = q_->not_full.wait_until(
        [this] {
          return q_->tail.load(std::memory_order_acquire) - q_->head.load(std::memory_order_acquire) <
                 capacity_;
        },
        deadline);
    if (!room) return false;
  }
}

std::optional<uint64_t> MessageQueue::pop(const Deadline& deadline) {
  for (;;) {
    uint64_t value = 0;
    bool got = false;
    {
      RobustLock lock(q_->mutex, lock_deadline(), "message queue");
      const uint64_t head = q_->head.load(std::memory_order_relaxed);
      // SYNC POINT READ: pairs with push's tail store.
      const uint64_t tail = q_->tail.load(std::memory_order_acquire);
      if (checked_count(head, tail) > 0) {
        value = q_->slots[head % capacity_];
        q_->head.store(head + 1, std::memory_order_release);
        got = true;
      }
    }
    if (got) {
      q_->not_full.notify(1);
      return value;
    }
    const bool ready = q_->not_empty.wait_until(
        [this] {
          return q_->tail.load(std::memory_order_acquire) != q_->head.load(std::memory_order_acquire);
        },
        deadline);
    if (!ready) return std::nullopt;
  }
}

}  // namespace stubhost
