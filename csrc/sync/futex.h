// Futex-based waiting primitives that live in shared memory and work across processes.
//
// All of them hold no lock while a process waits, so a peer that dies while waiting or while
// signalling can never leave the other side blocked beyond its own timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

namespace stubhost {

using Clock = std::chrono::steady_clock;

/// A point in time after which a wait gives up; std::nullopt means "wait for ever".
class Deadline {
 public:
  /// `seconds` < 0 or nullopt waits for ever; 0 polls once.
  static Deadline after(std::optional<double> seconds);
  static Deadline never() { return Deadline(); }

  bool infinite() const noexcept { return !at_.has_value(); }
  bool expired() const noexcept { return at_ && Clock::now() >= *at_; }
  /// Time left, clamped at zero; for an infinite deadline, `cap`.
  std::chrono::nanoseconds remaining(std::chrono::nanoseconds cap) const noexcept;
  /// The earlier of this deadline and now + `slice`.
  Deadline capped(std::chrono::nanoseconds slice) const noexcept;

 private:
  std::optional<Clock::time_point> at_;
};

/// FUTEX_WAIT on a shared word: sleeps while *word == expected, at most `timeout`.
/// Returns false on timeout; spurious wake-ups return true (callers re-check their condition).
bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
/// Wakes up to `count` processes sleeping on `word`.
void futex_wake(std::atomic<uint32_t>* word, int count);

/// CPU hint for a spin-wait loop.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Process-wide ceiling on how long a waiter spins before it sleeps, in nanoseconds (0 disables
/// spinning). A short spin pays when the peer answers within microseconds on another core: it
/// saves the futex sleep and wake-up (5-12 us across cores on our VMs). Settable at run time.
std::chrono::nanoseconds spin_budget() noexcept;
void set_spin_budget(std::chrono::nanoseconds budget) noexcept;

/// The spin actually used adapts between 1 us and the ceiling: it shrinks by a quarter after a
/// spin that ended in sleep (the peer is slow, or shares our CPU and cannot run while we spin) and
/// grows by half after a spin that succeeded. A wait that slept but was answered within the
/// ceiling raises it to 1.25x that wait (a spin that long would have caught it), so a spin that
/// shrank to the floor while the peer was briefly slow can find its way back. It is kept per
/// thread (a thread that waits for rare events must not stop a thread waiting for a fast peer
/// from spinning); set_spin_budget starts every thread over at the new ceiling.
std::chrono::nanoseconds adaptive_spin() noexcept;
void record_spin(bool succeeded) noexcept;
void record_slept_wait(std::chrono::nanoseconds waited) noexcept;

/// Gives the CPU to another runnable thread (a peer on the same core can then answer us).
void yield_cpu() noexcept;

/// Spins until ready() is true or the adaptive budget (or the deadline) runs out.
template <class Ready>
bool spin_until(Ready&& ready, const Deadline& deadline) {
  if (deadline.expired()) return ready();  // a poll: no spin, and nothing learned about spinning
  const auto budget = adaptive_spin();
  if (budget.count() <= 0) return ready();
  const auto stop = Clock::now() + budget;
  for (uint32_t i = 1;; ++i) {
    if (ready()) {
      record_spin(true);
      return true;
    }
    cpu_relax();
    if ((i & 63u) == 0) {
      if (Clock::now() >= stop || deadline.expired()) {
        const bool ok = ready();
        record_spin(ok);
        return ok;
      }
      if ((i & 1023u) == 0) yield_cpu();
    }
  }
}

/// An event count in shared memory: waiters announce themselves, re-check their condition, then
/// sleep on a sequence word that every notify bumps. No notification can be lost between the
/// check and the sleep. Any process may notify or wait concurrently.
struct ShmEventCount {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> waiters;

  void init() noexcept;
  /// Wakes up to `count` waiters (all if count < 0). Call after making the condition true.
  void notify(int count) noexcept;
  /// Waits until ready() holds or the deadline passes; spins first. Returns ready().
  template <class Ready>
  bool wait_until(Ready&& ready, const Deadline& deadline);
};
static_assert(sizeof(ShmEventCount) == 8, "ShmEventCount layout");

template <class Ready>
bool ShmEventCount::wait_until(Ready&& ready, const Deadline& deadline) {
  const auto start = Clock::now();
  if (spin_until(ready, deadline)) return true;
  for (;;) {
    // SYNC POINT READ: pairs with notify(); waiters++ before reading seq, and the notifier bumps
    // seq before reading waiters, so one of the two always sees the other (seq_cst on both).
    waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t key = seq.load(std::memory_order_seq_cst);
    if (ready()) {
      waiters.fetch_sub(1, std::memory_order_relaxed);
      return true;
    }
    if (deadline.expired()) {
      waiters.fetch_sub(1, std::memory_order_relaxed);
      return ready();
    }
    // Sleep in bounded slices: a notifier that died between publishing and waking costs at most
    // one slice of latency, never a lost wake-up for ever.
    futex_wait(&seq, key, deadline.remaining(std::chrono::milliseconds(100)));
    waiters.fetch_sub(1, std::memory_order_relaxed);
    if (ready()) {
      record_slept_wait(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start));
      return true;
    }
  }
}

/// A counting semaphore in shared memory. post() from any process, wait() from any process.
struct ShmSemaphore {
  std::atomic<uint32_t> count;
  uint32_t reserved;
  ShmEventCount event;

  void init(uint32_t initial) noexcept;
  void post() noexcept;
  /// Takes one unit if available now.
  bool try_wait() noexcept;
  /// Takes one unit, waiting until the deadline. Returns false on timeout.
  bool wait(const Deadline& deadline);
};
static_assert(sizeof(ShmSemaphore) == 16, "ShmSemaphore layout");

}  // namespace stubhost
