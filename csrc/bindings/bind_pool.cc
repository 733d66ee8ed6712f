// Bindings of the pool, memory views and the stand-alone sync objects.
#include <pybind11/stl.h>

#include <pybind11/native_enum.h>

#include "bindings/bindings.h"
#include "common/errors.h"
#include "sync/shared_objects.h"

namespace stubhost::bindings {
namespace {

/// A writable (or read-only) window on pool memory that keeps the pool's mappings alive.
struct ShmView {
  std::shared_ptr<Pool> pool;
  uint8_t* data;
  uint64_t size;
  uint64_t handle;
  bool readonly;
};

}  // namespace

Pool& open_pool(const std::shared_ptr<Pool>& pool) {
  if (pool->closed()) throw py::value_error("the shared-memory pool is closed");
  return *pool;
}

void bind_pool(py::module_& m) {
  py::class_<ShmView>(m, "ShmView", py::buffer_protocol(),
                      "Zero-copy window on pool memory; supports the buffer protocol (numpy.frombuffer).")
      .def_buffer([](ShmView& v) {
        return py::buffer_info(v.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(v.size)}, {1}, v.readonly);
      })
      .def_readonly("handle", &ShmView::handle)
      .def_readonly("readonly", &ShmView::readonly)
      .def_property_readonly("nbytes", [](const ShmView& v) { return v.size; })
      .def_property_readonly("address", [](const ShmView& v) { return reinterpret_cast<uintptr_t>(v.data); })
      .def("__len__", [](const ShmView& v) { return v.size; });

  py::class_<Pool, std::shared_ptr<Pool>>(m, "Pool",
                                          "A growable shared-memory pool of POSIX shm segments.")
      .def_static(
          "create",
          [](const std::string& prefix, uint64_t initial_size, uint64_t growth_size, uint64_t max_size,
             double lock_timeout) {
            PoolOptions o;
            o.prefix = prefix;
            o.initial_bytes = initial_size;
            o.growth_bytes = growth_size;
            o.max_bytes = max_size;
            o.lock_timeout_s = lock_timeout;
            return Pool::create(o);
          },
          py::arg("prefix") = PoolOptions{}.prefix, py::arg("initial_size") = PoolOptions{}.initial_bytes,
          py::arg("growth_size") = PoolOptions{}.growth_bytes, py::arg("max_size") = PoolOptions{}.max_bytes,
          py::arg("lock_timeout") = PoolOptions{}.lock_timeout_s)
      .def_static("attach", &Pool::attach, py::arg("name"), py::arg("lock_timeout") = 10.0)
      .def_property_readonly("name", &Pool::name)
      .def_property_readonly("owner", &Pool::owner)
      .def_property_readonly("closed", &Pool::closed)
      .def(
          "allocate", [](const std::shared_ptr<Pool>& p, uint64_t n) { return open_pool(p).allocate(n); },
          py::arg("nbytes"), py::call_guard<py::gil_scoped_release>())
      .def(
          "free", [](const std::shared_ptr<Pool>& p, uint64_t h) { open_pool(p).free(h); }, py::arg("handle"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "allocation_size", [](const std::shared_ptr<Pool>& p, uint64_t h) { return open_pool(p).allocation_size(h); },
          py::arg("handle"), py::call_guard<py::gil_scoped_release>())
      .def(
          "view",
          [](const std::shared_ptr<Pool>& p, uint64_t h, uint64_t n, bool readonly) {
            return ShmView{p, open_pool(p).resolve(h, n), n, h, readonly};
          },
          py::arg("handle"), py::arg("nbytes"), py::arg("readonly") = false)
      .def(
          "handle_of", [](const Pool& p, uintptr_t address) { return p.handle_of(reinterpret_cast<void*>(address)); },
          py::arg("address"), "Handle of an address inside this pool's mappings, or 0.")
      .def_property_readonly("capacity_bytes", [](const Pool& p) { return p.stats().capacity_bytes; })
      .def_property_readonly("used_bytes", [](const Pool& p) { return p.stats().used_bytes; })
      .def_property_readonly("free_bytes", [](const Pool& p) { return p.stats().free_bytes; })
      .def_property_readonly("allocations", [](const Pool& p) { return p.stats().allocations; })
      .def_property_readonly("segment_count", [](const Pool& p) { return p.stats().segments; })
      .def("check", [](const std::shared_ptr<Pool>& p) { open_pool(p).check(); },
           py::call_guard<py::gil_scoped_release>(), "Verify every allocator invariant; raises CorruptionError.")
      .def("unlink", &Pool::unlink_all, "Remove every segment name of this pool from /dev/shm.")
      .def("close", &Pool::close)
      .def("__enter__", [](const std::shared_ptr<Pool>& p) { return p; })
      .def("__exit__", [](Pool& p, py::args) { p.close(); })
      .def("_debug_lock", &Pool::debug_lock, py::call_guard<py::gil_scoped_release>())
      .def("_debug_unlock", &Pool::debug_unlock);

  py::class_<SharedSemaphore>(m, "Semaphore", "A futex-based counting semaphore in a pool.")
      .def_static("create", &SharedSemaphore::create, py::arg("pool"), py::arg("initial") = 0)
      .def_static("attach", &SharedSemaphore::attach, py::arg("pool"), py::arg("handle"))
      .def_property_readonly("handle", &SharedSemaphore::handle)
      .def_property_readonly("value", &SharedSemaphore::value)
      .def("post", &SharedSemaphore::post)
      .def(
          "wait",
          [](SharedSemaphore& s, std::optional<double> timeout) {
            return interruptible(timeout, [&](const Deadline& d) { return s.wait(d); });
          },
          py::arg("timeout") = py::none(), "Take one unit; False on timeout (None waits for ever).");

  py::native_enum<RobustMutex::LockResult>(m, "LockResult", "enum.IntEnum")
      .value("ACQUIRED", RobustMutex::LockResult::kAcquired)
      .value("RECOVERED", RobustMutex::LockResult::kRecovered)
      .value("TIMED_OUT", RobustMutex::LockResult::kTimedOut)
      .finalize();

  py::class_<SharedMutex>(m, "RobustMutex", "A process-shared robust mutex in a pool.")
      .def_static("create", &SharedMutex::create, py::arg("pool"))
      .def_static("attach", &SharedMutex::attach, py::arg("pool"), py::arg("handle"))
      .def_property_readonly("handle", &SharedMutex::handle)
      .def(
          "lock",
          [](SharedMutex& mu, std::optional<double> timeout) {
            const auto result = interruptible(timeout, [&](const Deadline& d) {
              const auto r = mu.lock(d);
              return r == RobustMutex::LockResult::kTimedOut ? std::optional<RobustMutex::LockResult>() : r;
            });
            return result.value_or(RobustMutex::LockResult::kTimedOut);
          },
          py::arg("timeout") = py::none(),
          "ACQUIRED, RECOVERED (the previous owner died holding it) or TIMED_OUT.")
      .def("unlock", &SharedMutex::unlock);

  m.def(
      "set_spin_budget",
      [](double seconds) {
        set_spin_budget(std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9)));
      },
      py::arg("seconds"), "How long a waiter spins before sleeping (process-wide; 0 disables).");
  m.def("spin_budget", [] { return static_cast<double>(spin_budget().count()) / 1e9; });
  m.def("make_handle", &make_handle, py::arg("segment"), py::arg("offset"));
  m.def("handle_segment", &handle_segment, py::arg("handle"));
  m.def("handle_offset", &handle_offset, py::arg("handle"));
}

}  // namespace stubhost::bindings
