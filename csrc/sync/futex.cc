#include "sync/futex.h"

#include <cstdlib>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "common/errors.h"

namespace stubhost {
namespace {
constexpr int64_t kMinAdaptiveSpinNs = 1000;
constexpr int64_t kDefaultSpinNs = 100000;

/// The ceiling a process starts with: STUBHOST_SPIN_US from the environment (inherited by stubs,
/// so one setting tunes both sides), else 100 us, long enough to cover a Python-level execute.
int64_t initial_spin_ns() noexcept {
  const char* text = std::getenv("STUBHOST_SPIN_US");
  if (text == nullptr || *text == '\0') return kDefaultSpinNs;
  char* end = nullptr;
  const double us = std::strtod(text, &end);
  if (end == text || !(us >= 0) || us > 1e6) return kDefaultSpinNs;
  return static_cast<int64_t>(us * 1000);
}

std::atomic<int64_t> g_spin_budget_ns{initial_spin_ns()};
std::atomic<uint64_t> g_budget_generation{0};  // bumped by set_spin_budget: every thread starts over

/// The adaptive spin of the calling thread. Each thread learns from its own waits: a thread that
/// waits for rare events (a watchdog, a poll with a long timeout, a call that takes milliseconds)
/// must not teach a thread that waits for a fast peer to stop spinning.
struct ThreadSpin {
  int64_t ns = -1;  // -1: not started
  uint64_t generation = 0;
};
thread_local ThreadSpin t_spin;

int64_t& thread_spin() noexcept {
  const uint64_t generation = g_budget_generation.load(std::memory_order_relaxed);
  if (t_spin.ns < 0 || t_spin.generation != generation) {
    t_spin.ns = g_spin_budget_ns.load(std::memory_order_relaxed);
    t_spin.generation = generation;
  }
  return t_spin.ns;
}
}  // namespace

std::chrono::nanoseconds spin_budget() noexcept {
  return std::chrono::nanoseconds(g_spin_budget_ns.load(std::memory_order_relaxed));
}

void set_spin_budget(std::chrono::nanoseconds budget) noexcept {
  const int64_t ns = budget.count() < 0 ? 0 : budget.count();
  g_spin_budget_ns.store(ns, std::memory_order_relaxed);
  g_budget_generation.fetch_add(1, std::memory_order_relaxed);
}

std::chrono::nanoseconds adaptive_spin() noexcept {
  const int64_t ceiling = g_spin_budget_ns.load(std::memory_order_relaxed);
  if (ceiling <= 0) return std::chrono::nanoseconds(0);
  const int64_t current = thread_spin();
  return std::chrono::nanoseconds(current < ceiling ? current : ceiling);
}

void record_spin(bool succeeded) noexcept {
  const int64_t ceiling = g_spin_budget_ns.load(std::memory_order_relaxed);
  const int64_t floor = ceiling < kMinAdaptiveSpinNs ? ceiling : kMinAdaptiveSpinNs;
  int64_t& spin = thread_spin();
  int64_t next = succeeded ? spin + spin / 2 + 1 : spin - spin / 4;  // shrink gently: one slow answer is no trend
  if (next > ceiling) next = ceiling;
  if (next < floor) next = floor;
  spin = next;
}

void record_slept_wait(std::chrono::nanoseconds waited) noexcept {
  // With one CPU the peer only runs while we sleep, so a short wait proves nothing about spinning.
  static const bool several_cpus = sysconf(_SC_NPROCESSORS_ONLN) > 1;
  const int64_t ceiling = g_spin_budget_ns.load(std::memory_order_relaxed);
  const int64_t w = waited.count();
  if (!several_cpus || w <= 0 || w >= ceiling) return;
  int64_t want = w + w / 4;
  if (want > ceiling) want = ceiling;
  int64_t& spin = thread_spin();
  if (want > spin) spin = want;
}

void yield_cpu() noexcept { sched_yield(); }

Deadline Deadline::after(std::optional<double> seconds) {
  Deadline d;
  if (seconds && *seconds >= 0) {
    // Clamp absurd values so the arithmetic below cannot overflow.
    const double s = *seconds > 1e9 ? 1e9 : *seconds;
    d.at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  return d;
}

std::chrono::nanoseconds Deadline::remaining(std::chrono::nanoseconds cap) const noexcept {
  if (!at_) return cap;
  const auto left = *at_ - Clock::now();
  if (left.count() <= 0) return std::chrono::nanoseconds(0);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left);
  return ns < cap ? ns : cap;
}

Deadline Deadline::capped(std::chrono::nanoseconds slice) const noexcept {
  Deadline d;
  const auto limit = Clock::now() + slice;
  d.at_ = (at_ && *at_ < limit) ? *at_ : limit;
  return d;
}

bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word must be 32 bits");
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  const long rc = ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts,
                            nullptr, 0);
  if (rc == 0) return true;
  switch (errno) {
    case EAGAIN:  // the word already changed
    case EINTR:
      return true;
    case ETIMEDOUT:
      return false;
    default:
      throw SystemError("futex wait", errno);
  }
}

void futex_wake(std::atomic<uint32_t>* word, int count) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

void ShmEventCount::init() noexcept {
  seq.store(0, std::memory_order_relaxed);
  waiters.store(0, std::memory_order_relaxed);
}

void ShmEventCount::notify(int count) noexcept {
  // SYNC POINT WRITE: pairs with wait_until(); see the comment there.
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) != 0) futex_wake(&seq, count < 0 ? INT32_MAX : count);
}

void ShmSemaphore::init(uint32_t initial) noexcept {
  count.store(initial, std::memory_order_relaxed);
  reserved = 0;
  event.init();
}

void ShmSemaphore::post() noexcept {
  count.fetch_add(1, std::memory_order_release);
  event.notify(1);
}

bool ShmSemaphore::try_wait() noexcept {
  uint32_t c = count.load(std::memory_order_relaxed);
  while (c != 0) {
    if (count.compare_exchange_weak(c, c - 1, std::memory_order_acquire, std::memory_order_relaxed))
      return true;
  }
  return false;
}

bool ShmSemaphore::wait(const Deadline& deadline) {
  for (;;) {
    if (try_wait()) return true;
    const bool available = event.wait_until(
        [this] { return count.load(std::memory_order_relaxed) != 0; }, deadline);
    if (!available) return try_wait();
  }
}

}  // namespace stubhost
