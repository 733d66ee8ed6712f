// A bounded ring of 64-bit handles in the pool, shared by any number of producer and consumer
// processes, with blocking time-limited push and pop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "shm/pool.h"
#include "sync/futex.h"
#include "sync/robust_mutex.h"

namespace stubhost {

constexpr uint32_t kQueueMagic = 0x55514853;  // "SHQU"
constexpr uint32_t kMaxQueueCapacity = 1u << 20;

struct MessageQueueShm {
  uint32_t magic;
  uint32_t capacity;                   // number of slots
  uint32_t layout_version;
  uint32_t reserved0;
  alignas(64) RobustMutex mutex;       // guards head, tail and slots
  alignas(64) std::atomic<uint64_t> head;  // next slot to pop (monotonic count)
  alignas(64) std::atomic<uint64_t> tail;  // next slot to push (monotonic count)
  alignas(64) ShmEventCount not_empty; // notified after a push
  alignas(64) ShmEventCount not_full;  // notified after a pop
  alignas(64) uint64_t slots[1];       // `capacity` entries follow
};
static_assert(offsetof(MessageQueueShm, mutex) == 64, "queue layout");
static_assert(offsetof(MessageQueueShm, head) == 128, "queue layout");
static_assert(offsetof(MessageQueueShm, tail) == 192, "queue layout");
static_assert(offsetof(MessageQueueShm, not_empty) == 256, "queue layout");
static_assert(offsetof(MessageQueueShm, not_full) == 320, "queue layout");
static_assert(offsetof(MessageQueueShm, slots) == 384, "queue layout");

/// A process-local view of a queue living in a pool.
///
/// Thread safety: push and pop may be called concurrently from any thread of any process.
/// The critical section is a slot write and one counter store, so a process killed inside it
/// leaves a consistent queue (the robust mutex hands the lock to the next caller). Waiting holds
/// no lock: a peer that dies never blocks the survivor beyond its timeout.
class MessageQueue {
 public:
  /// Allocates and initializes a queue of `capacity` slots in `pool`.
  static MessageQueue create(const std::shared_ptr<Pool>& pool, uint32_t capacity);
  /// Validates and opens the queue at `handle` (which a peer handed over).
  static MessageQueue attach(const std::shared_ptr<Pool>& pool, uint64_t handle);
  /// Bytes a queue of `capacity` slots takes in the pool.
  static uint64_t bytes_for(uint32_t capacity);

  uint64_t handle() const noexcept { return handle_; }
  uint32_t capacity() const noexcept { return capacity_; }
  /// Items queued now (a snapshot).
  uint64_t size() const noexcept;

  /// Appends `value`, waiting for room until the deadline. Returns false on timeout.
  bool push(uint64_t value, const Deadline& deadline);
  /// Takes the oldest item, waiting until the deadline. Returns nullopt on timeout.
  std::optional<uint64_t> pop(const Deadline& deadline);

 private:
  MessageQueue(std::shared_ptr<Pool> pool, uint64_t handle, MessageQueueShm* q, uint32_t capacity)
      : pool_(std::move(pool)), handle_(handle), q_(q), capacity_(capacity) {}
  uint64_t checked_count(uint64_t head, uint64_t tail) const;
  Deadline lock_deadline() const;

  std::shared_ptr<Pool> pool_;
  uint64_t handle_;
  MessageQueueShm* q_;
  uint32_t capacity_;  // read once at attach; later changes in shared memory are ignored
};

}  // namespace stubhost
