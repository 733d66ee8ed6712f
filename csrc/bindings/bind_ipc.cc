// Bindings of the message queue, the control block and IPC messages.
#include <pybind11/stl.h>

#include <pybind11/native_enum.h>

#include "bindings/bindings.h"
#include "ipc/control.h"
#include "ipc/message.h"
#include "ipc/message_queue.h"

namespace stubhost::bindings {

void bind_ipc(py::module_& m) {
  py::class_<MessageQueue>(m, "MessageQueue", "Bounded ring of 64-bit handles in a pool (MPMC).")
      .def_static("create", &MessageQueue::create, py::arg("pool"), py::arg("capacity"))
      .def_static("attach", &MessageQueue::attach, py::arg("pool"), py::arg("handle"))
      .def_static("bytes_for", &MessageQueue::bytes_for, py::arg("capacity"))
      .def_property_readonly("handle", &MessageQueue::handle)
      .def_property_readonly("capacity", &MessageQueue::capacity)
      .def("__len__", &MessageQueue::size)
      .def(
          "push",
          [](MessageQueue& q, uint64_t value, std::optional<double> timeout) {
            return interruptible(timeout, [&](const Deadline& d) { return q.push(value, d); });
          },
          py::arg("value"), py::arg("timeout") = py::none(),
          "Append a handle; False if the queue stayed full until the timeout (None waits for ever).")
      .def(
          "pop",
          [](MessageQueue& q, std::optional<double> timeout) {
            return interruptible(timeout, [&](const Deadline& d) { return q.pop(d); });
          },
          py::arg("timeout") = py::none(),
          "Take the oldest handle; None if the queue stayed empty until the timeout.");

  py::native_enum<ControlQueue>(m, "ControlQueue", "enum.IntEnum")
      .value("STUB_MESSAGE", ControlQueue::kStubMessage)
      .value("PARENT_MESSAGE", ControlQueue::kParentMessage)
      .value("STUB_TO_PARENT", ControlQueue::kStubToParent)
      .value("PARENT_TO_STUB", ControlQueue::kParentToStub)
      .value("MEMORY_MANAGER", ControlQueue::kMemoryManager)
      .finalize();

  auto flag = [](std::atomic<uint32_t> IPCControlShm::*field) {
    return py::cpp_function([field](IPCControl& c) { return (c.shm().*field).load() != 0; });
  };
  auto set_flag = [](std::atomic<uint32_t> IPCControlShm::*field) {
    return py::cpp_function([field](IPCControl& c, bool v) { (c.shm().*field).store(v ? 1 : 0); });
  };
  auto queue_prop = [](ControlQueue q) {
    return std::make_pair(py::cpp_function([q](IPCControl& c) { return c.queue(q); }),
                          py::cpp_function([q](IPCControl& c, uint64_t h) { c.set_queue(q, h); }));
  };
  auto [smq_get, smq_set] = queue_prop(ControlQueue::kStubMessage);
  auto [pmq_get, pmq_set] = queue_prop(ControlQueue::kParentMessage);
  auto [s2p_get, s2p_set] = queue_prop(ControlQueue::kStubToParent);
  auto [p2s_get, p2s_set] = queue_prop(ControlQueue::kParentToStub);
  auto [mm_get, mm_set] = queue_prop(ControlQueue::kMemoryManager);

  py::class_<IPCControl>(m, "IPCControl", "The IPCControlShm block shared by a parent and its stub.")
      .def_static("create", &IPCControl::create, py::arg("pool"))
      .def_static("attach", &IPCControl::attach, py::arg("pool"), py::arg("handle"))
      .def_property_readonly("handle", &IPCControl::handle)
      .def("health", &IPCControl::health, py::arg("stub"), py::arg("lock_timeout") = 1.0,
           py::call_guard<py::gil_scoped_release>(), "Read a health flag under its robust mutex.")
      .def("set_health", &IPCControl::set_health, py::arg("stub"), py::arg("value"),
           py::arg("lock_timeout") = 1.0, py::call_guard<py::gil_scoped_release>())
      .def_property("uses_env", flag(&IPCControlShm::uses_env), set_flag(&IPCControlShm::uses_env))
      .def_property("decoupled", flag(&IPCControlShm::decoupled), set_flag(&IPCControlShm::decoupled))
      .def_property(
          "parent_pid", [](IPCControl& c) { return c.shm().parent_pid.load(); },
          [](IPCControl& c, int64_t v) { c.shm().parent_pid.store(v); })
      .def_property(
          "stub_pid", [](IPCControl& c) { return c.shm().stub_pid.load(); },
          [](IPCControl& c, int64_t v) { c.shm().stub_pid.store(v); })
      .def_property_readonly("parent_heartbeat", [](IPCControl& c) { return c.shm().parent_heartbeat.load(); })
      .def_property_readonly("stub_heartbeat", [](IPCControl& c) { return c.shm().stub_heartbeat.load(); })
      .def("beat", [](IPCControl& c, bool stub) { (stub ? c.shm().stub_heartbeat : c.shm().parent_heartbeat)++; },
           py::arg("stub"), "Bump one side's heartbeat counter.")
      .def_property("stub_message_queue", smq_get, smq_set)
      .def_property("parent_message_queue", pmq_get, pmq_set)
      .def_property("stub_to_parent_mq", s2p_get, s2p_set)
      .def_property("parent_to_stub_mq", p2s_get, p2s_set)
      .def_property("memory_manager_message_queue", mm_get, mm_set);

  py::native_enum<Command>(m, "Command", "enum.IntEnum")
      .value("INITIALIZE_REQUEST", Command::kInitializeRequest)
      .value("INITIALIZE_RESPONSE", Command::kInitializeResponse)
      .value("EXECUTE_REQUEST", Command::kExecuteRequest)
      .value("EXECUTE_RESPONSE", Command::kExecuteResponse)
      .value("FINALIZE_REQUEST", Command::kFinalizeRequest)
      .value("FINALIZE_RESPONSE", Command::kFinalizeResponse)
      .value("AUTO_COMPLETE_REQUEST", Command::kAutoCompleteRequest)
      .value("AUTO_COMPLETE_RESPONSE", Command::kAutoCompleteResponse)
      .value("INFER_EXEC_REQUEST", Command::kInferExecRequest)
      .value("INFER_EXEC_RESPONSE", Command::kInferExecResponse)
      .value("INFER_STREAM_EXEC_REQUEST", Command::kInferStreamExecRequest)
      .value("RESPONSE_SEND", Command::kResponseSend)
      .value("RESPONSE_CLOSE", Command::kResponseClose)
      .value("LOG_REQUEST", Command::kLogRequest)
      .value("METRIC_REQUEST", Command::kMetricRequest)
      .value("MODEL_CONTROL_REQUEST", Command::kModelControlRequest)
      .value("CANCEL_REQUEST", Command::kCancelRequest)
      .value("IS_REQUEST_CANCELLED", Command::kIsRequestCancelled)
      .value("MEMORY_RELEASE", Command::kMemoryRelease)
      .value("PING", Command::kPing)
      .value("SHUTDOWN", Command::kShutdown)
      .value("REGION_MAP", Command::kRegionMap)
      .value("REGION_UNMAP", Command::kRegionUnmap)
      .finalize();

  // Command members by value (None where no member has that value), for the `command` property.
  py::tuple members(kMaxCommand + 1);
  for (uint32_t value = 0; value <= kMaxCommand; ++value) {
    members[value] = value == 0 ? py::none() : py::cast(static_cast<Command>(value));
  }

  py::class_<IPCMessage>(m, "IPCMessage", "One protocol message: command, args handle, inline-reply slot.")
      .def_static("create", &IPCMessage::create, py::arg("pool"), py::arg("command"), py::arg("args") = 0,
                  py::arg("request_id") = 0, py::arg("inline_reply") = false, py::arg("notify") = false,
                  py::arg("ring") = false)
      .def_static("attach", &IPCMessage::attach, py::arg("pool"), py::arg("handle"))
      .def_property_readonly("handle", &IPCMessage::handle)
      .def_property_readonly("command",
                             [members](const IPCMessage& msg) -> py::object {
                               // The member itself, not Command(value): an IntEnum lookup costs
                               // more than half a microsecond, and the stub asks once a message.
                               const uint32_t value = msg.command();
                               if (value < members.size()) return members[value];
                               return py::cast(static_cast<Command>(value));
                             })
      .def_property_readonly("args", &IPCMessage::args)
      .def_property_readonly("request_id", &IPCMessage::request_id)
      .def_property_readonly("inline_reply", &IPCMessage::inline_reply)
      .def_property_readonly("notify", &IPCMessage::notify,
                             "After replying, the responder also pushes this handle on the parent queue.")
      .def("set_notify", &IPCMessage::set_notify, py::arg("on"),
           "Turn the responder's notification on or off in flight; returns `answered` as read after.")
      .def_property_readonly("ring", &IPCMessage::ring,
                             "After replying, the responder also rings the parent's doorbell (an eventfd).")
      .def_property_readonly("answered", &IPCMessage::answered,
                             "True once the reply is complete; unlike wait_reply(), consumes nothing.")
      .def_property_readonly("reply_status", &IPCMessage::reply_status)
      .def_property_readonly("reply_args", &IPCMessage::reply_args)
      .def("reply", &IPCMessage::reply, py::arg("status") = 0, py::arg("args") = 0,
           "Answer an inline-reply message (once; a second reply raises CoreError).")
      .def("release", &IPCMessage::release, py::call_guard<py::gil_scoped_release>(),
           "Drop this holder's reference; the last holder frees the message.")
      .def(
          "wait_reply",
          [](IPCMessage& msg, std::optional<double> timeout) {
            return interruptible(timeout, [&](const Deadline& d) { return msg.wait_reply(d); });
          },
          py::arg("timeout") = py::none(), "Wait for the responder's reply(); False on timeout.");
}

}  // namespace stubhost::bindings
