// The extension module stubhost._core: exception classes and the sub-binders.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "common/errors.h"
#include "shm/layout.h"

namespace py = pybind11;
using namespace stubhost;

PYBIND11_MODULE(_core, m) {
  m.doc() = "stubhost's shared-memory IPC core (pool, sync, queues, control block, tensor layout).";

  // Base first: pybind11 tries the most recently registered translator first.
  auto core_error = py::register_exception<CoreError>(m, "CoreError", PyExc_RuntimeError);
  py::register_exception<SystemError>(m, "ShmError", core_error);
  py::register_exception<ShmSpaceError>(m, "ShmSpaceError", core_error);
  py::register_exception<PoolFullError>(m, "PoolFullError", core_error);
  py::register_exception<InvalidHandleError>(m, "InvalidHandleError", core_error);
  py::register_exception<CorruptionError>(m, "CorruptionError", core_error);
  py::register_exception<FormatError>(m, "FormatError", core_error);
  py::register_exception<LayoutVersionError>(m, "LayoutVersionError", core_error);
  py::register_exception<LockTimeoutError>(m, "LockTimeoutError", core_error);

  m.attr("LAYOUT_VERSION") = kLayoutVersion;
  m.attr("MAX_SEGMENTS") = kMaxSegments;
  m.attr("ALIGNMENT") = kAlignment;

  bindings::bind_pool(m);
  bindings::bind_ipc(m);
  bindings::bind_tensor(m);
  bindings::bind_dlpack(m);
  bindings::bind_record(m);
}
