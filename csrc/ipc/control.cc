#include "ipc/control.h"

#include <new>
#include <string>

#include "common/errors.h"

namespace stubhost {

IPCControl IPCControl::create(const std::shared_ptr<Pool>& pool) {
  const uint64_t h = pool->allocate(sizeof(IPCControlShm));
  auto* c = new (pool->resolve(h, sizeof(IPCControlShm))) IPCControlShm;
  c->layout_version = kLayoutVersion;
  c->struct_bytes = sizeof(IPCControlShm);
  c->stub_health_mutex.init();
  c->parent_health_mutex.init();
  c->stub_health.store(0);
  c->parent_health.store(0);
  c->uses_env.store(0);
  c->decoupled.store(0);
  c->stub_message_queue = c->parent_message_queue = c->stub_to_parent_mq = c->parent_to_stub_mq =
      c->memory_manager_message_queue = kNullHandle;
  c->parent_pid.store(0);
  c->stub_pid.store(0);
  c->parent_heartbeat.store(0);
  c->stub_heartbeat.store(0);
  // SYNC POINT WRITE: magic last (pairs with attach).
  __atomic_store_n(&c->magic, kControlMagic, __ATOMIC_RELEASE);
  return IPCControl(pool, h, c);
}

IPCControl IPCControl::attach(const std::shared_ptr<Pool>& pool, uint64_t handle) {
  auto* c = reinterpret_cast<IPCControlShm*>(pool->resolve(handle, sizeof(IPCControlShm)));
  // SYNC POINT READ: pairs with the magic store in create().
  if (__atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != kControlMagic) {
    throw InvalidHandleError("handle does not name an IPC control block");
  }
  if (c->layout_version != kLayoutVersion || c->struct_bytes != sizeof(IPCControlShm)) {
    throw LayoutVersionError("IPC control block has layout version " + std::to_string(c->layout_version) +
                             " (" + std::to_string(c->struct_bytes) + " bytes) but this stubhost speaks "
                             "version " + std::to_string(kLayoutVersion) + " (" +
                             std::to_string(sizeof(IPCControlShm)) +
                             " bytes); parent and stub must run the same stubhost build");
  }
  return IPCControl(pool, handle, c);
}

bool IPCControl::health(bool stub, double lock_timeout_s) {
  RobustLock lock(stub ? c_->stub_health_mutex : c_->parent_health_mutex, Deadline::after(lock_timeout_s),
                  stub ? "stub health" : "parent health");
  return (stub ? c_->stub_health : c_->parent_health).load(std::memory_order_acquire) != 0;
}

void IPCControl::set_health(bool stub, bool value, double lock_timeout_s) {
  RobustLock lock(stub ? c_->stub_health_mutex : c_->parent_health_mutex, Deadline::after(lock_timeout_s),
                  stub ? "stub health" : "parent health");
  (stub ? c_->stub_health : c_->parent_health).store(value ? 1 : 0, std::memory_order_release);
}

uint64_t* IPCControl::queue_field(ControlQueue which) const noexcept {
  switch (which) {
    case ControlQueue::kStubMessage:
      return &c_->stub_message_queue;
    case ControlQueue::kParentMessage:
      return &c_->parent_message_queue;
    case ControlQueue::kStubToParent:
      return &c_->stub_to_parent_mq;
    case ControlQueue::kParentToStub:
      return &c_->parent_to_stub_mq;
    case ControlQueue::kMemoryManager:
      break;
  }
  return &c_->memory_manager_message_queue;
}

uint64_t IPCControl::queue(ControlQueue which) const noexcept {
  return __atomic_load_n(queue_field(which), __ATOMIC_ACQUIRE);
}

void IPCControl::set_queue(ControlQueue which, uint64_t handle) noexcept {
  __atomic_store_n(queue_field(which), handle, __ATOMIC_RELEASE);
}

}  // namespace stubhost
