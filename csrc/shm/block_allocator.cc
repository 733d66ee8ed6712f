#include "shm/block_allocator.h"

#include <string>

#include "common/errors.h"

namespace stubhost {
namespace {

// A first-fit scan of one list stops after this many entries; a (corrupted) cyclic list can
// therefore never hang the allocator.
constexpr int kMaxFirstFitScan = 64;

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

uint64_t BlockAllocator::block_size_for(uint64_t n) {
  uint64_t total;
  if (add_overflows(n, sizeof(BlockHeaderShm), &total)) return 0;
  uint64_t rounded;
  if (!round_up(total, kAlignment, &rounded)) return 0;
  return rounded < kMinBlock ? kMinBlock : rounded;
}

uint32_t BlockAllocator::bin_of(uint64_t block_size) {
  const uint64_t units = block_size / kAlignment;  // >= 2
  if (units < 64) return static_cast<uint32_t>(units);
  const unsigned msb = 63u - static_cast<unsigned>(__builtin_clzll(units));  // >= 6
  const uint64_t sub = (units >> (msb - 2)) & 3u;
  const uint64_t bin = 64u + (msb - 6u) * 4u + sub;
  return bin < kNumBins ? static_cast<uint32_t>(bin) : kNumBins - 1;
}

BlockHeaderShm* BlockAllocator::block(uint64_t bh, SegmentSpan* span_out) {
  const uint32_t seg = handle_segment(bh);
  const uint64_t off = handle_offset(bh);
  const SegmentSpan span = segments_.segment(seg);
  uint64_t end;
  if (off % kAlignment != 0 || off < span.data_start || add_overflows(off, kMinBlock, &end) ||
      end > span.size) {
    throw CorruptionError("pool block handle " + hex(bh) + " is outside its segment");
  }
  auto* b = reinterpret_cast<BlockHeaderShm*>(span.base + off);
  uint64_t block_end;
  if (b->magic != kBlockMagic || b->size < kMinBlock || b->size % kAlignment != 0 ||
      add_overflows(off, b->size, &block_end) || block_end > span.size) {
    throw CorruptionError("pool block at " + hex(bh) + " has a damaged header");
  }
  if (span_out) *span_out = span;
  return b;
}

void BlockAllocator::push_free(uint64_t bh, BlockHeaderShm* b) {
  const uint32_t bin = bin_of(b->size);
  const uint64_t head = header_.bins[bin];
  b->flags = 0;
  b->requested = 0;
  b->prev_free = kNullHandle;
  b->next_free = head;
  if (head != kNullHandle) block(head)->prev_free = bh;
  header_.bins[bin] = bh;
  header_.bin_bitmap[bin / 64] |= uint64_t{1} << (bin % 64);
}

void BlockAllocator::unlink_free(uint64_t bh, BlockHeaderShm* b) {
  const uint32_t bin = bin_of(b->size);
  if (b->prev_free != kNullHandle) {
    BlockHeaderShm* p = block(b->prev_free);
    if (p->next_free != bh) throw CorruptionError("pool free list is broken at " + hex(bh));
    p->next_free = b->next_free;
  } else {
    if (header_.bins[bin] != bh) throw CorruptionError("pool free list head is broken at " + hex(bh));
    header_.bins[bin] = b->next_free;
    if (b->next_free == kNullHandle) header_.bin_bitmap[bin / 64] &= ~(uint64_t{1} << (bin % 64));
  }
  if (b->next_free != kNullHandle) {
    BlockHeaderShm* n = block(b->next_free);
    if (n->prev_free != bh) throw CorruptionError("pool free list is broken at " + hex(bh));
    n->prev_free = b->prev_free;
  }
  b->next_free = b->prev_free = kNullHandle;
}

void BlockAllocator::set_next_prev_size(uint64_t bh, BlockHeaderShm* b) {
  const uint64_t next = bh + b->size;
  const SegmentSpan span = segments_.segment(handle_segment(bh));
  if (handle_offset(next) + kMinBlock <= span.size) block(next)->prev_size = b->size;
}

uint64_t BlockAllocator::take_from_bin(uint32_t bin, uint64_t need, bool first_fit) {
  uint64_t bh = header_.bins[bin];
  for (int i = 0; bh != kNullHandle && i < kMaxFirstFitScan; ++i) {
    BlockHeaderShm* b = block(bh);
    if (b->flags & kBlockInUse) throw CorruptionError("pool free list holds an in-use block");
    if (b->size >= need) return bh;
    if (!first_fit) break;
    bh = b->next_free;
  }
  return kNullHandle;
}

uint64_t BlockAllocator::allocate(uint64_t n) {
  const uint64_t need = block_size_for(n);
  if (need == 0) return kNullHandle;
  uint32_t bin = bin_of(need);
  // Exact-size bins (< 64) hold only blocks of that size; the log-spaced bins above hold a range,
  // so the request's own bin needs a first-fit scan and every later bin fits whole.
  uint64_t bh = take_from_bin(bin, need, /*first_fit=*/true);
  for (uint32_t b = bin + 1; bh == kNullHandle && b < kNumBins;) {
    const uint64_t word = header_.bin_bitmap[b / 64] & (~uint64_t{0} << (b % 64));
    if (word == 0) {
      b = (b / 64 + 1) * 64;
      continue;
    }
    b = (b / 64) * 64 + static_cast<uint32_t>(__builtin_ctzll(word));
    bh = take_from_bin(b, need, /*first_fit=*/false);
    if (header_.bins[b] == kNullHandle) header_.bin_bitmap[b / 64] &= ~(uint64_t{1} << (b % 64));
    ++b;
  }
  if (bh == kNullHandle) return kNullHandle;

  BlockHeaderShm* b = block(bh);
  unlink_free(bh, b);
  const uint64_t rest = b->size - need;
  if (rest >= kMinBlock) {
    // Write the tail's header first; the size store on `b` below commits the split.
    const uint64_t th = bh + need;
    const SegmentSpan span = segments_.segment(handle_segment(bh));
    auto* t = reinterpret_cast<BlockHeaderShm*>(span.base + handle_offset(th));
    t->magic = kBlockMagic;
    t->flags = 0;
    t->size = rest;
    t->prev_size = need;
    t->next_free = t->prev_free = kNullHandle;
    b->size = need;
    set_next_prev_size(th, t);
    push_free(th, t);
  }
  b->flags = kBlockInUse;
  b->requested = n;
  header_.used_bytes.fetch_add(b->size, std::memory_order_relaxed);
  header_.allocations.fetch_add(1, std::memory_order_relaxed);
  return bh + sizeof(BlockHeaderShm);
}

void BlockAllocator::free(uint64_t payload) {
  const uint64_t off = handle_offset(payload);
  if (off < sizeof(BlockHeaderShm) || off % kAlignment != 0) {
    throw InvalidHandleError("handle " + hex(payload) + " is not an allocation of this pool");
  }
  uint64_t bh = payload - sizeof(BlockHeaderShm);
  BlockHeaderShm* b;
  SegmentSpan span;
  try {
    b = block(bh, &span);
  } catch (const CorruptionError&) {
    throw InvalidHandleError("handle " + hex(payload) + " is not an allocation of this pool");
  }
  if (!(b->flags & kBlockInUse)) {
    throw InvalidHandleError("handle " + hex(payload) + " is not allocated (freed twice?)");
  }
  header_.used_bytes.fetch_sub(b->size, std::memory_order_relaxed);
  header_.allocations.fetch_sub(1, std::memory_order_relaxed);
  b->flags = 0;

  // Merge with the following block; the size store commits, then the absorbed header is voided.
  const uint64_t nh = bh + b->size;
  if (handle_offset(nh) + kMinBlock <= span.size) {
    BlockHeaderShm* n = block(nh);
    if (!(n->flags & kBlockInUse)) {
      unlink_free(nh, n);
      b->size += n->size;
      n->magic = 0;
    }
  }
  // Merge into the preceding block.
  if (b->prev_size != 0) {
    if (b->prev_size > handle_offset(bh) - span.data_start) {
      throw CorruptionError("pool block at " + hex(bh) + " has a damaged back link");
    }
    const uint64_t ph = bh - b->prev_size;
    BlockHeaderShm* p = block(ph);
    if (!(p->flags & kBlockInUse)) {
      unlink_free(ph, p);
      p->size += b->size;
      b->magic = 0;
      bh = ph;
      b = p;
    }
  }
  set_next_prev_size(bh, b);
  push_free(bh, b);
}

uint64_t BlockAllocator::requested_size(uint64_t payload) {
  const uint64_t off = handle_offset(payload);
  if (off < sizeof(BlockHeaderShm) || off % kAlignment != 0) {
    throw InvalidHandleError("handle " + hex(payload) + " is not an allocation of this pool");
  }
  BlockHeaderShm* b;
  try {
    b = block(payload - sizeof(BlockHeaderShm));
  } catch (const CorruptionError&) {
    throw InvalidHandleError("handle " + hex(payload) + " is not an allocation of this pool");
  }
  if (!(b->flags & kBlockInUse) || b->requested > b->size - sizeof(BlockHeaderShm)) {
    throw InvalidHandleError("handle " + hex(payload) + " is not allocated");
  }
  return b->requested;
}

void BlockAllocator::add_segment(uint32_t index) {
  const SegmentSpan span = segments_.segment(index);
  const uint64_t size = (span.size - span.data_start) & ~(kAlignment - 1);
  if (size < kMinBlock) return;
  const uint64_t bh = make_handle(index, span.data_start);
  auto* b = reinterpret_cast<BlockHeaderShm*>(span.base + span.data_start);
  b->magic = kBlockMagic;
  b->flags = 0;
  b->size = size;
  b->prev_size = 0;
  push_free(bh, b);
  header_.capacity_bytes.fetch_add(size, std::memory_order_relaxed);
}

void BlockAllocator::rebuild() {
  // If this rebuild dies or throws half-way, the flag makes the next lock holder start over.
  header_.needs_rebuild.store(1, std::memory_order_relaxed);
  for (auto& w : header_.bin_bitmap) w = 0;
  for (auto& h : header_.bins) h = kNullHandle;
  uint64_t capacity = 0, used = 0, count = 0;
  const uint32_t segments = header_.segment_count.load(std::memory_order_acquire);
  for (uint32_t s = 0; s < segments && s < kMaxSegments; ++s) {
    const SegmentSpan span = segments_.segment(s);
    const uint64_t end = span.data_start + ((span.size - span.data_start) & ~(kAlignment - 1));
    capacity += end - span.data_start;
    uint64_t off = span.data_start, prev_size = 0;
    uint64_t free_run = kNullHandle;  // start of the free block being extended by merges
    while (off + kMinBlock <= end) {
      const uint64_t bh = make_handle(s, off);
      BlockHeaderShm* b = block(bh);
      const uint64_t size = b->size;
      if (b->flags & kBlockInUse) {
        b->prev_size = prev_size;
        used += size;
        ++count;
        free_run = kNullHandle;
        prev_size = size;
      } else if (free_run != kNullHandle) {
        // Two adjacent free blocks: a merge was cut short. Finish it.
        BlockHeaderShm* r = block(free_run);
        r->size += size;
        b->magic = 0;
        prev_size = r->size;
      } else {
        b->prev_size = prev_size;
        free_run = bh;
        prev_size = size;
      }
      off += size;
    }
    // Link the free runs now that their sizes are final.
    for (off = span.data_start; off + kMinBlock <= end;) {
      const uint64_t bh = make_handle(s, off);
      BlockHeaderShm* b = block(bh);
      if (!(b->flags & kBlockInUse)) push_free(bh, b);
      off += b->size;
    }
  }
  header_.capacity_bytes.store(capacity, std::memory_order_relaxed);
  header_.used_bytes.store(used, std::memory_order_relaxed);
  header_.allocations.store(count, std::memory_order_relaxed);
  header_.needs_rebuild.store(0, std::memory_order_relaxed);
}

void BlockAllocator::check() {
  uint64_t used = 0, count = 0, free_blocks = 0, capacity = 0;
  const uint32_t segments = header_.segment_count.load(std::memory_order_acquire);
  for (uint32_t s = 0; s < segments && s < kMaxSegments; ++s) {
    const SegmentSpan span = segments_.segment(s);
    const uint64_t end = span.data_start + ((span.size - span.data_start) & ~(kAlignment - 1));
    capacity += end - span.data_start;
    uint64_t off = span.data_start, prev_size = 0;
    bool prev_free = false;
    while (off + kMinBlock <= end) {
      BlockHeaderShm* b = block(make_handle(s, off));
      if (b->prev_size != prev_size) throw CorruptionError("pool block back link mismatch");
      const bool is_free = !(b->flags & kBlockInUse);
      if (is_free && prev_free) throw CorruptionError("pool has two adjacent free blocks");
      if (is_free) {
        ++free_blocks;
      } else {
        used += b->size;
        ++count;
      }
      prev_free = is_free;
      prev_size = b->size;
      off += b->size;
    }
    if (off != end) throw CorruptionError("pool blocks do not tile their segment");
  }
  uint64_t listed = 0;
  for (uint32_t bin = 0; bin < kNumBins; ++bin) {
    const bool marked = (header_.bin_bitmap[bin / 64] >> (bin % 64)) & 1u;
    if (header_.bins[bin] != kNullHandle && !marked) {
      throw CorruptionError("pool bin " + std::to_string(bin) + " holds blocks but its bitmap bit is clear");
    }
    uint64_t prev = kNullHandle;
    for (uint64_t bh = header_.bins[bin]; bh != kNullHandle;) {
      BlockHeaderShm* b = block(bh);
      if ((b->flags & kBlockInUse) || bin_of(b->size) != bin || b->prev_free != prev) {
        throw CorruptionError("pool free list " + std::to_string(bin) + " is inconsistent");
      }
      if (++listed > free_blocks) throw CorruptionError("pool free lists hold more than the free blocks");
      prev = bh;
      bh = b->next_free;
    }
  }
  if (listed != free_blocks) throw CorruptionError("pool free lists miss some free blocks");
  if (capacity != header_.capacity_bytes.load()) throw CorruptionError("pool capacity counter is wrong");
  if (used != header_.used_bytes.load() || count != header_.allocations.load()) {
    throw CorruptionError("pool usage counters disagree with its blocks");
  }
}

}  // namespace stubhost
