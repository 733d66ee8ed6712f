// IPCMessage: one command crossing a queue, with an optional inline-reply completion slot.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "shm/pool.h"
#include "sync/futex.h"

namespace stubhost {

constexpr uint32_t kMessageMagic = 0x47534d53;  // "SMSG"

/// Commands of the parent/stub protocol (names follow Triton's Python backend).
enum class Command : uint32_t {
  kInitializeRequest = 1,
  kInitializeResponse = 2,
  kExecuteRequest = 3,
  kExecuteResponse = 4,
  kFinalizeRequest = 5,
  kFinalizeResponse = 6,
  kAutoCompleteRequest = 7,
  kAutoCompleteResponse = 8,
  kInferExecRequest = 9,         // BLS
  kInferExecResponse = 10,
  kInferStreamExecRequest = 11,  // decoupled BLS
  kResponseSend = 12,            // decoupled response
  kResponseClose = 13,
  kLogRequest = 14,
  kMetricRequest = 15,
  kModelControlRequest = 16,
  kCancelRequest = 17,
  kIsRequestCancelled = 18,
  kMemoryRelease = 19,           // memory manager: a buffer may be freed
  kPing = 20,                    // health / benchmarks
  kShutdown = 21,
  kRegionMap = 22,               // map a client's system shared-memory region (zero-copy inputs)
  kRegionUnmap = 23,             // forget it (the client unregistered it)
};
constexpr uint32_t kMaxCommand = 23;

constexpr uint32_t kMessageInlineReply = 1u;  // the sender waits on reply_ready
constexpr uint32_t kMessageNotify = 2u;       // after replying, the responder also pushes the handle
                                              // on the parent queue (callers that wait without a thread)
constexpr uint32_t kMessageRing = 4u;         // after replying, the responder rings the parent's
                                              // doorbell (an event loop waits for the reply)

struct IPCMessageShm {
  uint32_t magic;
  uint32_t command;        // a Command
  uint64_t args;           // handle of the command's arguments, or 0
  uint64_t request_id;
  std::atomic<uint32_t> flags;  // kMessageInlineReply | kMessageNotify | kMessageRing (notify may change in flight)
  uint32_t reply_status;   // 0 = ok; otherwise an error code chosen by the protocol layer
  uint64_t reply_args;     // handle of the reply's payload, or 0
  ShmSemaphore reply_ready;
  std::atomic<uint32_t> refs;     // holders left: 2 with an inline reply (sender, responder), else 1
  std::atomic<uint32_t> replied;  // 1 once reply() began (a second one is refused), 2 once it posted
};
static_assert(offsetof(IPCMessageShm, args) == 8, "message layout");
static_assert(offsetof(IPCMessageShm, reply_args) == 32, "message layout");
static_assert(offsetof(IPCMessageShm, reply_ready) == 40, "message layout");
static_assert(offsetof(IPCMessageShm, refs) == 56, "message layout");
static_assert(sizeof(IPCMessageShm) == 64, "message layout");

/// A process-local view of one message.
///
/// Ownership: a one-way message passes to whoever pops it, who calls release(). A message with an
/// inline reply has two holders, sender and responder, and each calls release() once; the last
/// one frees it. So a sender that gave up waiting can release safely while a slow responder still
/// writes its reply. Handles named by args/reply_args travel the same way: the receiver frees them.
class IPCMessage {
 public:
  static IPCMessage create(const std::shared_ptr<Pool>& pool, Command command, uint64_t args,
                           uint64_t request_id, bool inline_reply, bool notify = false, bool ring = false);
  /// Validates the message at `handle` (magic, command range).
  static IPCMessage attach(const std::shared_ptr<Pool>& pool, uint64_t handle);

  uint64_t handle() const noexcept { return handle_; }
  uint32_t command() const noexcept { return m_->command; }
  uint64_t args() const noexcept { return m_->args; }
  uint64_t request_id() const noexcept { return m_->request_id; }
  bool inline_reply() const noexcept { return (m_->flags.load(std::memory_order_relaxed) & kMessageInlineReply) != 0; }
  /// Whether the responder, having replied, must push the handle on the parent queue. Read it
  /// after reply(): the sender may turn it on meanwhile (see set_notify).
  bool notify() const noexcept;
  bool ring() const noexcept { return (m_->flags.load(std::memory_order_relaxed) & kMessageRing) != 0; }
  /// Turns the responder's notification on or off while the message is in flight (sender side):
  /// a sender that waits for the reply itself needs none, until it stops waiting. Returns
  /// answered() as read after the change: when true, the responder may have read the old value,
  /// so the sender must take the reply itself (a notification may come too).
  bool set_notify(bool on) noexcept;
  uint32_t reply_status() const noexcept { return m_->reply_status; }
  uint64_t reply_args() const noexcept { return m_->reply_args; }

  /// Writes the reply and wakes the sender (responder side). Throws CoreError on a second reply.
  void reply(uint32_t status, uint64_t reply_args);
  /// Drops this holder's reference; frees the message when it was the last one.
  void release();
  /// Waits for reply() (sender side). Returns false on timeout; once it returns true, answered()
  /// is true too.
  bool wait_reply(const Deadline& deadline);
  /// True once the reply is complete. Unlike wait_reply(), it consumes nothing, so any number of
  /// threads may ask (wait_reply takes the one wake-up the reply posts).
  bool answered() const noexcept;

 private:
  IPCMessage(std::shared_ptr<Pool> pool, uint64_t handle, IPCMessageShm* m)
      : pool_(std::move(pool)), handle_(handle), m_(m) {}

  std::shared_ptr<Pool> pool_;
  uint64_t handle_;
  IPCMessageShm* m_;
};

}  // namespace stubhost
