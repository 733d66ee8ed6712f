// The growable managed shared-memory pool: a list of POSIX shm segments and an allocator over them.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shm/block_allocator.h"
#include "shm/layout.h"
#include "shm/segment.h"

namespace stubhost {

/// Sizes of a new pool. Defaults are documented in docs/design/pool.md.
struct PoolOptions {
  std::string prefix = "stubhost";
  uint64_t initial_bytes = 8ull << 20;   // segment 0
  uint64_t growth_bytes = 32ull << 20;   // least size of each added segment
  uint64_t max_bytes = 8ull << 30;       // all segments together
  double lock_timeout_s = 10.0;          // give up on a pool lock held this long by a live peer
};

/// Usage figures, read without the lock (each one is exact, together they may be a moment apart).
struct PoolStats {
  uint64_t capacity_bytes;
  uint64_t used_bytes;
  uint64_t free_bytes;
  uint64_t allocations;
  uint32_t segments;
};

/// A pool created by one process (the owner) and attached by others by name.
///
/// Thread safety: every method may be called from any thread of any attached process at once;
/// allocation is serialized by a robust process-shared mutex (see docs/design/pool.md for why a
/// lock rather than a lock-free scheme). Mappings are never moved or removed while the Pool
/// object lives, so pointers from view() stay valid until the last reference is dropped.
class Pool : public std::enable_shared_from_this<Pool>, private SegmentResolver {
  struct Passkey {};  // only create() and attach() can construct a Pool

 public:
  explicit Pool(Passkey) {}
  static std::shared_ptr<Pool> create(const PoolOptions& options);
  static std::shared_ptr<Pool> attach(const std::string& name, double lock_timeout_s = 10.0);
  ~Pool() override;

  /// Name of segment 0, which is what a peer passes to attach().
  const std::string& name() const noexcept { return name_; }
  bool owner() const noexcept { return owner_; }

  /// Allocates n bytes (64-byte aligned), growing the pool if needed. Throws PoolFullError.
  uint64_t allocate(uint64_t n);
  /// Frees an allocation. Throws InvalidHandleError for a forged, stale or double-freed handle.
  void free(uint64_t handle);
  /// Bytes asked for when `handle` was allocated (validated).
  uint64_t allocation_size(uint64_t handle);
  /// This process's address of [handle, handle + length), after checking that the whole range
  /// lies inside one segment's user area. Maps the segment on first use.
  uint8_t* resolve(uint64_t handle, uint64_t length);
  /// The handle of an address inside a mapped segment, or kNullHandle.
  uint64_t handle_of(const void* address) const noexcept;

  PoolStats stats() const noexcept;
  PoolHeaderShm& header() noexcept { return *header_; }
  /// Verifies every allocator invariant (for tests and leak probes).
  void check();

  /// Removes every segment name of this pool from /dev/shm (mappings stay valid). Safe to call
  /// from any process, more than once; a stub calls it when its parent died.
  void unlink_all() noexcept;

  /// Marks the pool closed for this process and, for the owner, unlinks its segments. Mappings
  /// stay until the last reference goes, so views handed out earlier never dangle.
  void close() noexcept;
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  /// Test hooks: hold the pool lock without releasing it, so a test can kill the holder.
  void debug_lock();
  void debug_unlock() noexcept;

 private:
  SegmentSpan segment(uint32_t index) override;
  /// Maps segment 0 (holding the header) into this object and takes its limits, once.
  void adopt_first_segment(ShmSegment seg);
  std::string segment_name(uint32_t index) const;
  void grow(uint64_t need);
  Deadline lock_deadline() const { return Deadline::after(lock_timeout_s_); }
  /// Takes the pool lock and repairs the allocator if a previous holder died mid-update.
  class Locked;

  struct Mapping {
    std::atomic<uint8_t*> base{nullptr};
    std::atomic<uint64_t> size{0};
  };

  std::string name_;
  bool owner_ = false;
  // Limits as this process learnt them (from its options, or once at attach): a peer that rewrites
  // the header later cannot raise them for us.
  uint64_t growth_bytes_ = 0;
  uint64_t max_bytes_ = 0;
  std::atomic<bool> closed_{false};
  double lock_timeout_s_ = 10.0;
  PoolHeaderShm* header_ = nullptr;
  std::array<Mapping, kMaxSegments> map_;
  std::mutex map_mutex_;               // serializes mapping a new segment in this process
  std::vector<ShmSegment> segments_;   // owns the mappings
};

}  // namespace stubhost
