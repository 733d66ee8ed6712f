// Shared helpers of the binding files: timeouts and interruptible waits. No core logic here.
#pragma once

#include <pybind11/pybind11.h>

#include <pybind11/numpy.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "shm/pool.h"
#include "sync/futex.h"
#include "tensor/dtype.h"

namespace stubhost::bindings {

namespace py = pybind11;

void bind_pool(py::module_& m);
void bind_ipc(py::module_& m);
void bind_tensor(py::module_& m);
void bind_dlpack(py::module_& m);
void bind_record(py::module_& m);

/// Each item of a BYTES tensor as raw bytes (bytes as is, str as UTF-8, else str(x)), in order.
std::vector<std::string> collect_elements(const py::iterable& items);
/// `count` length-prefixed elements parsed into a 1-D numpy object array of bytes (validated).
py::array decode_bytes_array(const uint8_t* data, uint64_t size, uint64_t count);

/// numpy's format string for a Triton dtype; BF16 (no numpy type) is seen as its raw uint16 words.
/// Raises ValueError for BYTES and INVALID.
const char* numpy_format(DataType t);

/// Raises ValueError if the pool was closed by this process.
Pool& open_pool(const std::shared_ptr<Pool>& pool);

/// Runs attempt(slice_deadline) with the GIL released, in slices of at most 200 ms, checking for
/// signals (Ctrl-C) between slices. `attempt` returns something truthy when done.
/// Returns the last result (falsy on timeout).
template <class Attempt>
auto interruptible(std::optional<double> timeout, Attempt&& attempt) {
  // First a poll with the GIL held: an operation that can complete at once (a push with room, a
  // reply already there) costs less than releasing and retaking the GIL, and retaking it may
  // wait behind other Python threads.
  if (auto result = attempt(Deadline::after(0.0)); result || (timeout && *timeout <= 0)) return result;
  const Deadline total = Deadline::after(timeout);
  for (;;) {
    decltype(attempt(total)) result;
    {
      py::gil_scoped_release release;
      result = attempt(total.capped(std::chrono::milliseconds(200)));
    }
    if (result || total.expired()) return result;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace stubhost::bindings
