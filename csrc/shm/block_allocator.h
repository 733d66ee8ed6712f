// Boundary-tag allocator with segregated free lists over the segments of a pool.
#pragma once

#include <cstdint>

#include "shm/layout.h"

namespace stubhost {

/// Where a segment is mapped in this process, and which part of it holds blocks.
struct SegmentSpan {
  uint8_t* base = nullptr;
  uint64_t size = 0;        // mapped bytes (from fstat, never from a peer)
  uint64_t data_start = 0;  // first block offset (after the pool header in segment 0)
};

/// Gives the allocator the local mapping of a segment (mapping it on first use).
class SegmentResolver {
 public:
  virtual ~SegmentResolver() = default;
  /// Throws InvalidHandleError if the segment does not exist.
  virtual SegmentSpan segment(uint32_t index) = 0;
};

/// Operates on a PoolHeaderShm's bins. Every method must be called with the pool lock held.
/// All metadata it follows comes from shared memory and is validated before use; a corrupted
/// structure raises CorruptionError instead of crashing this process.
class BlockAllocator {
 public:
  BlockAllocator(PoolHeaderShm& header, SegmentResolver& segments)
      : header_(header), segments_(segments) {}

  /// Returns the payload handle of a block of at least n bytes, or kNullHandle if nothing fits.
  uint64_t allocate(uint64_t n);
  /// Frees a payload handle returned by allocate(). Throws InvalidHandleError for anything else.
  void free(uint64_t payload);
  /// Bytes the caller asked for when it allocated this payload.
  uint64_t requested_size(uint64_t payload);
  /// Adds a fresh segment's whole data area as one free block.
  void add_segment(uint32_t index);
  /// Rebuilds the free lists and counters by walking every block of every segment. Used after a
  /// lock holder died mid-update: the walk by block sizes is always consistent because each
  /// update commits with one size store.
  void rebuild();
  /// Walks everything and verifies every invariant; throws CorruptionError on the first breach.
  void check();

  /// Bytes of the block that serves a request of n bytes (header included), 0 on overflow.
  static uint64_t block_size_for(uint64_t n);
  static uint32_t bin_of(uint64_t block_size);

 private:
  BlockHeaderShm* block(uint64_t block_handle, SegmentSpan* span_out = nullptr);
  void push_free(uint64_t bh, BlockHeaderShm* b);
  void unlink_free(uint64_t bh, BlockHeaderShm* b);
  void set_next_prev_size(uint64_t bh, BlockHeaderShm* b);
  uint64_t take_from_bin(uint32_t bin, uint64_t need, bool first_fit);

  PoolHeaderShm& header_;
  SegmentResolver& segments_;
};

}  // namespace stubhost
