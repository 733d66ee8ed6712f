#include "shm/pool.h"

#include <cerrno>
#include <cstring>
#include <new>

#include "common/errors.h"

namespace stubhost {
namespace {

constexpr uint64_t kGrowthRounding = 2ull << 20;

std::string mib(uint64_t n) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(n) / double(1 << 20));
  return buf;
}

uint64_t header_bytes() {
  uint64_t n = 0;
  round_up(sizeof(PoolHeaderShm), kAlignment, &n);
  return n;
}

}  // namespace

std::string Pool::segment_name(uint32_t index) const {
  return index == 0 ? name_ : name_ + "_" + std::to_string(index);
}

void Pool::adopt_first_segment(ShmSegment seg) {
  header_ = reinterpret_cast<PoolHeaderShm*>(seg.data());
  growth_bytes_ = header_->growth_bytes;
  max_bytes_ = header_->max_bytes;
  map_[0].size.store(seg.size());
  map_[0].base.store(seg.data(), std::memory_order_release);
  segments_.push_back(std::move(seg));
}

std::shared_ptr<Pool> Pool::create(const PoolOptions& options) {
  if (options.prefix.empty() || options.prefix.size() > 40 ||
      options.prefix.find('/') != std::string::npos) {
    throw CoreError("pool name prefix must be 1-40 characters without '/'");
  }
  if (options.initial_bytes < header_bytes() + kMinBlock) {
    throw CoreError("pool initial size must be at least " + std::to_string(header_bytes() + kMinBlock) +
                    " bytes");
  }
  if (options.max_bytes < options.initial_bytes) {
    throw CoreError("pool maximum size is smaller than its initial size");
  }
  auto pool = std::make_shared<Pool>(Passkey{});
  pool->owner_ = true;
  pool->lock_timeout_s_ = options.lock_timeout_s;
  pool->name_ = random_shm_name(options.prefix);
  uint64_t initial;
  round_up(options.initial_bytes, kAlignment, &initial);
  ShmSegment seg = ShmSegment::create(pool->name_, initial);

  auto* h = new (seg.data()) PoolHeaderShm;  // placement on fresh zeroed pages, no allocation
  h->layout_version = kLayoutVersion;
  h->header_bytes = header_bytes();
  std::strncpy(h->name, pool->name_.c_str(), kMaxPoolNameLength);
  h->initial_bytes = initial;
  h->growth_bytes = options.growth_bytes == 0 ? kGrowthRounding : options.growth_bytes;
  h->max_bytes = options.max_bytes;
  h->lock.init();
  h->segment_bytes[0].store(seg.size());
  h->segment_count.store(1, std::memory_order_release);
  pool->adopt_first_segment(std::move(seg));
  BlockAllocator(*pool->header_, *pool).add_segment(0);
  // SYNC POINT WRITE: the magic is published last; attach() refuses a header without it.
  __atomic_store_n(&h->magic, kPoolMagic, __ATOMIC_RELEASE);
  return pool;
}

std::shared_ptr<Pool> Pool::attach(const std::string& name, double lock_timeout_s) {
  if (name.size() > kMaxPoolNameLength) throw CoreError("pool name too long: " + name);
  auto pool = std::make_shared<Pool>(Passkey{});
  pool->lock_timeout_s_ = lock_timeout_s;
  pool->name_ = name;
  ShmSegment seg = ShmSegment::open(name);
  if (seg.size() < header_bytes() + kMinBlock) {
    throw CorruptionError("shared-memory segment " + name + " is too small to be a stubhost pool");
  }
  auto* h = reinterpret_cast<PoolHeaderShm*>(seg.data());
  // SYNC POINT READ: pairs with the magic store at the end of create().
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kPoolMagic) {
    throw CorruptionError("shared-memory segment " + name + " is not a stubhost pool");
  }
  if (h->layout_version != kLayoutVersion) {
    throw LayoutVersionError("pool " + name + " has shared-memory layout version " +
                             std::to_string(h->layout_version) + " but this stubhost speaks version " +
                             std::to_string(kLayoutVersion) +
                             "; parent and stub must run the same stubhost build");
  }
  if (h->header_bytes != header_bytes() ||
      std::strncmp(h->name, name.c_str(), kMaxPoolNameLength + 1) != 0) {
    throw CorruptionError("pool header of " + name + " is damaged");
  }
  pool->adopt_first_segment(std::move(seg));
  return pool;
}

Pool::~Pool() { close(); }

void Pool::close() noexcept {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  if (owner_) unlink_all();
}

SegmentSpan Pool::segment(uint32_t index) {
  if (index >= kMaxSegments) {
    throw InvalidHandleError("handle names segment " + std::to_string(index) + ", beyond the limit of " +
                             std::to_string(kMaxSegments));
  }
  Mapping& m = map_[index];
  uint8_t* base = m.base.load(std::memory_order_acquire);
  if (base == nullptr) {
    std::lock_guard<std::mutex> guard(map_mutex_);
    base = m.base.load(std::memory_order_acquire);
    if (base == nullptr) {
      // Only segments the header lists are opened; a forged index cannot make us map anything else.
      if (index >= header_->segment_count.load(std::memory_order_acquire) ||
          header_->segment_bytes[index].load(std::memory_order_acquire) == 0) {
        throw InvalidHandleError("handle names segment " + std::to_string(index) +
                                 ", which this pool does not have");
      }
      ShmSegment seg;
      try {
        seg = ShmSegment::open(segment_name(index));
      } catch (const SystemError& e) {
        throw InvalidHandleError("segment " + std::to_string(index) + " of the pool cannot be mapped (" +
                                 e.what() + ")");
      }
      m.size.store(seg.size(), std::memory_order_relaxed);
      base = seg.data();
      segments_.push_back(std::move(seg));
      m.base.store(base, std::memory_order_release);
    }
  }
  return SegmentSpan{base, m.size.load(std::memory_order_relaxed), index == 0 ? header_bytes() : 0};
}

uint8_t* Pool::resolve(uint64_t handle, uint64_t length) {
  const SegmentSpan span = segment(handle_segment(handle));
  const uint64_t off = handle_offset(handle);
  uint64_t end;
  if (off < span.data_start || add_overflows(off, length, &end) || end > span.size) {
    throw InvalidHandleError("handle and length [" + std::to_string(off) + ", +" + std::to_string(length) +
                             ") fall outside segment " + std::to_string(handle_segment(handle)) + " (" +
                             std::to_string(span.size) + " bytes)");
  }
  return span.base + off;
}

uint64_t Pool::handle_of(const void* address) const noexcept {
  const auto* p = static_cast<const uint8_t*>(address);
  for (uint32_t i = 0; i < kMaxSegments; ++i) {
    const uint8_t* base = map_[i].base.load(std::memory_order_acquire);
    if (base == nullptr) continue;
    const uint64_t size = map_[i].size.load(std::memory_order_relaxed);
    if (p >= base && p < base + size) return make_handle(i, static_cast<uint64_t>(p - base));
  }
  return kNullHandle;
}

void Pool::grow(uint64_t need) {
  const uint32_t index = header_->segment_count.load(std::memory_order_acquire);
  const uint64_t capacity = header_->capacity_bytes.load() + header_bytes();
  uint64_t size;
  round_up(need > growth_bytes_ ? need : growth_bytes_, kGrowthRounding, &size);
  if (index >= kMaxSegments || capacity + size > max_bytes_) {
    // A last try with exactly what is needed, in case the rounding overshot the maximum.
    round_up(need, kAlignment, &size);
    if (index >= kMaxSegments || capacity + size > max_bytes_) {
      throw PoolFullError("shared-memory pool is full: cannot allocate " + mib(need) + "; " +
                          mib(header_->used_bytes.load()) + " in use, " + mib(capacity) +
                          " mapped, maximum " + mib(max_bytes_) +
                          " (raise the pool's max size, or free tensors)");
    }
  }
  ShmSegment seg;
  try {
    seg = ShmSegment::create(segment_name(index), size);
  } catch (const SystemError& e) {
    if (e.error_code() != EEXIST) throw;
    // A grower died between creating this segment and recording it. We hold the pool lock and the
    // header does not list it, so nobody uses it: replace it.
    ShmSegment::unlink(segment_name(index));
    seg = ShmSegment::create(segment_name(index), size);
  }
  Mapping& m = map_[index];
  {
    std::lock_guard<std::mutex> guard(map_mutex_);
    m.size.store(seg.size(), std::memory_order_relaxed);
    m.base.store(seg.data(), std::memory_order_release);
    segments_.push_back(std::move(seg));
  }
  header_->segment_bytes[index].store(size, std::memory_order_release);
  // The new segment's block goes in first (we map it already, so add_segment needs no count), and
  // the count is published last: a grower killed before that leaves an unrecorded segment, which
  // the next grower replaces (EEXIST above), never a listed segment without a valid first block.
  BlockAllocator(*header_, *this).add_segment(index);
  // SYNC POINT WRITE: peers map segment `index` only after reading this count (Pool::segment).
  header_->segment_count.store(index + 1, std::memory_order_release);
}

class Pool::Locked {
 public:
  explicit Locked(Pool& pool) : lock_(pool.header_->lock, pool.lock_deadline(), "shared-memory pool"), alloc_(*pool.header_, pool) {
    if (lock_.recovered() || pool.header_->needs_rebuild.load(std::memory_order_relaxed) != 0) alloc_.rebuild();
  }
  BlockAllocator& allocator() { return alloc_; }

 private:
  RobustLock lock_;
  BlockAllocator alloc_;
};

uint64_t Pool::allocate(uint64_t n) {
  const uint64_t need = BlockAllocator::block_size_for(n);
  if (need == 0 || need > max_bytes_) {
    throw PoolFullError("shared-memory pool cannot hold an allocation of " + std::to_string(n) +
                        " bytes (maximum " + mib(max_bytes_) + ")");
  }
  Locked locked(*this);
  BlockAllocator& alloc = locked.allocator();
  uint64_t h = alloc.allocate(n);
  if (h == kNullHandle) {
    grow(need);
    h = alloc.allocate(n);
    if (h == kNullHandle) throw CorruptionError("pool grew but still cannot allocate");
  }
  return h;
}

void Pool::free(uint64_t handle) {
  Locked(*this).allocator().free(handle);
}

uint64_t Pool::allocation_size(uint64_t handle) {
  return Locked(*this).allocator().requested_size(handle);
}

void Pool::check() {
  Locked(*this).allocator().check();
}

PoolStats Pool::stats() const noexcept {
  PoolStats s{};
  s.capacity_bytes = header_->capacity_bytes.load(std::memory_order_relaxed);
  s.used_bytes = header_->used_bytes.load(std::memory_order_relaxed);
  s.free_bytes = s.capacity_bytes > s.used_bytes ? s.capacity_bytes - s.used_bytes : 0;
  s.allocations = header_->allocations.load(std::memory_order_relaxed);
  s.segments = header_->segment_count.load(std::memory_order_relaxed);
  return s;
}

void Pool::unlink_all() noexcept {
  // Names are derived, not read from the (untrusted) header, so this also cleans up segments a
  // crashed peer created but never recorded. ENOENT ends nothing: a gap is possible. Other errors
  // (EACCES) cannot be acted on here and leave the name for the next cleanup.
  for (uint32_t i = 0; i < kMaxSegments; ++i) ShmSegment::unlink_quiet(segment_name(i));
}

void Pool::debug_lock() {
  if (header_->lock.lock(Deadline::never()) == RobustMutex::LockResult::kRecovered ||
      header_->needs_rebuild.load(std::memory_order_relaxed) != 0) {
    BlockAllocator(*header_, *this).rebuild();
  }
}

void Pool::debug_unlock() noexcept { header_->lock.unlock(); }

}  // namespace stubhost
