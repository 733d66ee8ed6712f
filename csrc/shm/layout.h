// Shared-memory layouts of the pool: handles, the pool header and block headers.
// No absolute pointers live in shared memory: only handles (segment, offset).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "sync/robust_mutex.h"

namespace stubhost {

/// Version of every shared-memory layout in csrc/. Bump on any change; peers refuse a mismatch.
constexpr uint32_t kLayoutVersion = 1;

// ---- handles ------------------------------------------------------------------------------------
/// A handle names a byte of the pool: segment index in the top 16 bits, offset in the low 48.
/// Handle 0 (segment 0, offset 0: the pool header) never names user memory and means "none".
constexpr unsigned kHandleOffsetBits = 48;
constexpr uint64_t kHandleOffsetMask = (uint64_t{1} << kHandleOffsetBits) - 1;
constexpr uint32_t kMaxSegments = 256;
constexpr uint64_t kNullHandle = 0;

constexpr uint64_t make_handle(uint32_t segment, uint64_t offset) {
  return (uint64_t{segment} << kHandleOffsetBits) | (offset & kHandleOffsetMask);
}
constexpr uint32_t handle_segment(uint64_t h) { return static_cast<uint32_t>(h >> kHandleOffsetBits); }
constexpr uint64_t handle_offset(uint64_t h) { return h & kHandleOffsetMask; }

// ---- blocks -------------------------------------------------------------------------------------
/// Every block (allocated or free) starts on a 64-byte boundary with this header; the caller's
/// memory starts right after it, so payloads are 64-byte aligned (enough for any dtype and SIMD).
constexpr uint64_t kAlignment = 64;
constexpr uint32_t kBlockMagic = 0x4b4c4253;  // "SBLK"
constexpr uint32_t kBlockInUse = 1u;

struct BlockHeaderShm {
  uint32_t magic;      // kBlockMagic; cleared when the block is merged away
  uint32_t flags;      // kBlockInUse
  uint64_t size;       // whole block in bytes, header included; multiple of 64
  uint64_t prev_size;  // size of the block just before this one in the segment, 0 if first
  uint64_t next_free;  // free-list links (block handles), meaningful only while free
  uint64_t prev_free;
  uint64_t requested;  // bytes the caller asked for, while in use
  uint64_t reserved[2];
};
static_assert(sizeof(BlockHeaderShm) == kAlignment, "block header is one cache line");
static_assert(offsetof(BlockHeaderShm, size) == 8, "block header layout");
static_assert(offsetof(BlockHeaderShm, requested) == 40, "block header layout");

constexpr uint64_t kMinBlock = 2 * kAlignment;

// ---- pool header --------------------------------------------------------------------------------
constexpr uint32_t kPoolMagic = 0x4c504853;  // "SHPL"
constexpr uint32_t kNumBins = 256;
constexpr size_t kMaxPoolNameLength = 95;

/// Lives at offset 0 of segment 0. Everything a process needs to attach and allocate.
struct PoolHeaderShm {
  uint32_t magic;
  uint32_t layout_version;
  uint64_t header_bytes;                  // bytes of segment 0 taken by this header
  char name[kMaxPoolNameLength + 1];      // segment 0's name; segment i is "<name>_<i>"
  uint64_t initial_bytes;
  uint64_t growth_bytes;
  uint64_t max_bytes;
  uint64_t reserved0;
  alignas(64) RobustMutex lock;           // guards everything below
  alignas(64) std::atomic<uint32_t> segment_count;
  std::atomic<uint32_t> needs_rebuild;    // set while a rebuild runs; a lock holder that sees it rebuilds
  std::atomic<uint64_t> capacity_bytes;   // bytes of all segments usable for blocks
  std::atomic<uint64_t> used_bytes;       // bytes in in-use blocks, headers included
  std::atomic<uint64_t> allocations;      // number of in-use blocks
  uint64_t bin_bitmap[kNumBins / 64];     // bit b set <=> bins[b] may be non-empty
  uint64_t bins[kNumBins];                // free-list heads (block handles)
  std::atomic<uint64_t> segment_bytes[kMaxSegments];  // size of each segment, 0 if absent
};
static_assert(offsetof(PoolHeaderShm, name) == 16, "pool header layout");
static_assert(offsetof(PoolHeaderShm, lock) == 192, "pool header layout");
static_assert(offsetof(PoolHeaderShm, segment_count) == 256, "pool header layout");
static_assert(offsetof(PoolHeaderShm, bin_bitmap) == 288, "pool header layout");
static_assert(offsetof(PoolHeaderShm, bins) == 320, "pool header layout");
static_assert(offsetof(PoolHeaderShm, segment_bytes) == 320 + 8 * kNumBins, "pool header layout");
static_assert(sizeof(PoolHeaderShm) == 320 + 8 * kNumBins + 8 * kMaxSegments, "pool header layout");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<uint32_t>) == 4,
              "atomics in shared memory must be plain words");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

}  // namespace stubhost
