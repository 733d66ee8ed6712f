#include "ipc/message.h"

#include <new>
#include <string>

#include "common/errors.h"

namespace stubhost {

IPCMessage IPCMessage::create(const std::shared_ptr<Pool>& pool, Command command, uint64_t args,
                              uint64_t request_id, bool inline_reply, bool notify, bool ring) {
  const uint64_t h = pool->allocate(sizeof(IPCMessageShm));
  auto* m = new (pool->resolve(h, sizeof(IPCMessageShm))) IPCMessageShm;
  m->magic = kMessageMagic;
  m->command = static_cast<uint32_t>(command);
  m->args = args;
  m->request_id = request_id;
  m->flags.store((inline_reply ? kMessageInlineReply : 0) | (notify ? kMessageNotify : 0) | (ring ? kMessageRing : 0),
                 std::memory_order_relaxed);
  m->reply_status = 0;
  m->reply_args = kNullHandle;
  m->reply_ready.init(0);
  m->refs.store(inline_reply ? 2 : 1, std::memory_order_relaxed);
  m->replied.store(0, std::memory_order_relaxed);
  // Published by the queue push that carries the handle (its release store orders these writes).
  return IPCMessage(pool, h, m);
}

IPCMessage IPCMessage::attach(const std::shared_ptr<Pool>& pool, uint64_t handle) {
  auto* m = reinterpret_cast<IPCMessageShm*>(pool->resolve(handle, sizeof(IPCMessageShm)));
  if (m->magic != kMessageMagic) throw InvalidHandleError("handle does not name an IPC message");
  if (m->command == 0 || m->command > kMaxCommand) {
    throw CorruptionError("IPC message carries unknown command " + std::to_string(m->command));
  }
  return IPCMessage(pool, handle, m);
}

void IPCMessage::reply(uint32_t status, uint64_t reply_args) {
  if (m_->replied.exchange(1, std::memory_order_acq_rel) != 0) {
    throw CoreError("IPC message " + std::to_string(m_->request_id) + " was already answered");
  }
  m_->reply_status = status;
  m_->reply_args = reply_args;
  // SYNC POINT WRITE: the store of 2 releases the two fields above to answered() readers, and
  // post() releases them (and the 2) to the waiter. The 2 goes first: a waiter that wait_reply()
  // lets go must already find the message answered, or a caller that checks answered() after its
  // wait takes the reply for someone else's and leaves it to a slow poll.
  m_->replied.store(2, std::memory_order_release);
  m_->reply_ready.post();
}

bool IPCMessage::notify() const noexcept {
  // SYNC POINT READ: with the fence in set_notify(), either this load sees the sender's change or
  // the sender's answered() sees this side's reply, which was made before it (Dekker's pattern).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return (m_->flags.load(std::memory_order_seq_cst) & kMessageNotify) != 0;
}

bool IPCMessage::set_notify(bool on) noexcept {
  // SYNC POINT WRITE: pairs with notify(); see there.
  if (on) {
    m_->flags.fetch_or(kMessageNotify, std::memory_order_seq_cst);
  } else {
    m_->flags.fetch_and(~kMessageNotify, std::memory_order_seq_cst);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return answered();
}

bool IPCMessage::answered() const noexcept {
  // SYNC POINT READ: pairs with the store of 2 in reply().
  return m_->replied.load(std::memory_order_acquire) == 2;
}

void IPCMessage::release() {
  uint32_t refs = m_->refs.load(std::memory_order_relaxed);
  do {
    if (refs == 0 || refs > 2) throw InvalidHandleError("IPC message was released more often than it was held");
  } while (!m_->refs.compare_exchange_weak(refs, refs - 1, std::memory_order_acq_rel));
  if (refs == 1) pool_->free(handle_);
}

bool IPCMessage::wait_reply(const Deadline& deadline) {
  // SYNC POINT READ: wait() acquires the reply fields written before post().
  return m_->reply_ready.wait(deadline);
}

}  // namespace stubhost
