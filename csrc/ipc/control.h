// IPCControlShm: the control block a parent and its stub share (health, mode flags, queue handles).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "shm/pool.h"
#include "sync/robust_mutex.h"

namespace stubhost {

constexpr uint32_t kControlMagic = 0x4c434853;  // "SHCL"

struct IPCControlShm {
  uint32_t magic;
  uint32_t layout_version;
  uint64_t struct_bytes;                       // sizeof(IPCControlShm) as the creator saw it
  alignas(64) RobustMutex stub_health_mutex;   // guards stub_health
  alignas(64) RobustMutex parent_health_mutex; // guards parent_health
  alignas(64) std::atomic<uint32_t> stub_health;
  std::atomic<uint32_t> parent_health;
  std::atomic<uint32_t> uses_env;              // the stub runs in a custom execution environment
  std::atomic<uint32_t> decoupled;             // the model uses the decoupled transaction policy
  uint64_t stub_message_queue;                 // parent -> stub commands
  uint64_t parent_message_queue;               // stub -> parent replies
  uint64_t stub_to_parent_mq;                  // calls the stub makes into the parent (BLS, logs, ...)
  uint64_t parent_to_stub_mq;                  // the parent's answers to those calls
  uint64_t memory_manager_message_queue;       // buffers the owner may free
  std::atomic<int64_t> parent_pid;
  std::atomic<int64_t> stub_pid;
  std::atomic<uint64_t> parent_heartbeat;      // bumped by the parent's health loop
  std::atomic<uint64_t> stub_heartbeat;        // bumped by the stub's health loop
};
static_assert(offsetof(IPCControlShm, stub_health_mutex) == 64, "control layout");
static_assert(offsetof(IPCControlShm, parent_health_mutex) == 128, "control layout");
static_assert(offsetof(IPCControlShm, stub_health) == 192, "control layout");
static_assert(offsetof(IPCControlShm, stub_message_queue) == 208, "control layout");
static_assert(offsetof(IPCControlShm, memory_manager_message_queue) == 240, "control layout");
static_assert(offsetof(IPCControlShm, stub_heartbeat) == 272, "control layout");
static_assert(sizeof(IPCControlShm) == 320, "control layout");

/// Names of the control block's queues, in the order of their fields.
enum class ControlQueue : uint32_t {
  kStubMessage = 0,
  kParentMessage = 1,
  kStubToParent = 2,
  kParentToStub = 3,
  kMemoryManager = 4,
};

/// A process-local view of a control block. Flag accessors may be called from any thread.
class IPCControl {
 public:
  /// Allocates a control block with all flags clear and no queues.
  static IPCControl create(const std::shared_ptr<Pool>& pool);
  /// Validates the block at `handle`: magic, layout version, size. Refuses a mismatch clearly.
  static IPCControl attach(const std::shared_ptr<Pool>& pool, uint64_t handle);

  uint64_t handle() const noexcept { return handle_; }
  IPCControlShm& shm() noexcept { return *c_; }

  /// Health flags are read and written under their robust mutex, as the protocol requires.
  bool health(bool stub, double lock_timeout_s);
  void set_health(bool stub, bool value, double lock_timeout_s);

  uint64_t queue(ControlQueue which) const noexcept;
  void set_queue(ControlQueue which, uint64_t handle) noexcept;

 private:
  IPCControl(std::shared_ptr<Pool> pool, uint64_t handle, IPCControlShm* c)
      : pool_(std::move(pool)), handle_(handle), c_(c) {}
  uint64_t* queue_field(ControlQueue which) const noexcept;

  std::shared_ptr<Pool> pool_;
  uint64_t handle_;
  IPCControlShm* c_;
};

}  // namespace stubhost
