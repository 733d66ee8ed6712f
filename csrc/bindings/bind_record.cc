// Bindings of inference records: numpy arrays in, zero-copy numpy views out. No protocol logic here.
#include <pybind11/numpy.h>
#include <pybind11/gil_safe_call_once.h>
#include <pybind11/native_enum.h>
#include <pybind11/stl.h>

#include <array>
#include <cstring>

#include "bindings/bindings.h"
#include "common/errors.h"
#include "common/text.h"
#include "ipc/infer_record.h"
#include "tensor/bytes_codec.h"
#include "tensor/dtype.h"

namespace stubhost::bindings {
namespace {

/// Frees one record when the last numpy view of its tensors goes away.
class RecordLease {
 public:
  RecordLease(std::shared_ptr<Pool> pool, uint64_t handle) : pool_(std::move(pool)), handle_(handle) {}
  RecordLease(const RecordLease&) = delete;
  RecordLease& operator=(const RecordLease&) = delete;
  ~RecordLease() {
    if (pool_->closed()) return;  // the owner is tearing the pool down; nothing left to return
    try {
      pool_->free(handle_);
    } catch (const CoreError&) {
      // The handle was valid when read, so only a peer that corrupted its own pool gets here;
      // a destructor has no caller to tell, and the pool's check() will report the damage.
    }
  }

 private:
  std::shared_ptr<Pool> pool_;
  uint64_t handle_;
};

DataType dtype_of(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  switch (kind) {
    case 'b': return DataType::kBool;
    case 'u':
      if (size == 1) return DataType::kUint8;
      if (size == 2) return DataType::kUint16;
      if (size == 4) return DataType::kUint32;
      if (size == 8) return DataType::kUint64;
      break;
    case 'i':
      if (size == 1) return DataType::kInt8;
      if (size == 2) return DataType::kInt16;
      if (size == 4) return DataType::kInt32;
      if (size == 8) return DataType::kInt64;
      break;
    case 'f':
      if (size == 2) return DataType::kFp16;
      if (size == 4) return DataType::kFp32;
      if (size == 8) return DataType::kFp64;
      break;
    case 'O':
    case 'S':
    case 'U': return DataType::kBytes;
    default: break;
  }
  throw py::type_error("numpy dtype " + py::str(py::handle(reinterpret_cast<PyObject*>(dt.ptr()))).cast<std::string>() +
                       " has no Triton data type");
}

std::string to_string(const py::handle& s) {
  if (PyBytes_Check(s.ptr())) return std::string(PyBytes_AS_STRING(s.ptr()), PyBytes_GET_SIZE(s.ptr()));
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
  if (p == nullptr) throw py::error_already_set();
  return std::string(p, static_cast<size_t>(n));
}

py::str from_utf8(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

/// Keeps what write_record copies from alive and describes it.
struct TensorInputs {
  std::vector<py::array> arrays;       // numeric data, C-contiguous, native byte order
  std::vector<std::string> serialized; // BYTES data
  std::vector<RecordTensorSource> sources;
};

/// The (name, shape, dtype) that every header-only tuple form starts with.
RecordTensorSource header_only(const py::tuple& entry, TensorPlacement placement) {
  RecordTensorSource src;
  src.name = to_string(entry[0]);
  for (const py::handle d : py::reinterpret_borrow<py::sequence>(entry[1])) src.shape.push_back(d.cast<int64_t>());
  src.dtype = static_cast<DataType>(entry[2].cast<int>());
  src.placement = placement;
  return src;
}

/// A device id from Python; out-of-range values (even beyond int32) get the core's FormatError.
int32_t device_of(const std::string& name, const py::handle& value) {
  const auto id = value.cast<int64_t>();
  check_gpu_device(name, id);
  return static_cast<int32_t>(id);
}

/// The bytes of a bytes-like object (bytes, bytearray, memoryview, ...).
std::string bytes_like(const py::handle& value) {
  if (PyBytes_Check(value.ptr())) return std::string(PyBytes_AS_STRING(value.ptr()), PyBytes_GET_SIZE(value.ptr()));
  if (!PyObject_CheckBuffer(value.ptr())) throw py::type_error("a CUDA IPC handle must be bytes");
  PyObject* copy = PyBytes_FromObject(value.ptr());
  if (copy == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::bytes>(copy);
}

/// Header-only forms; the data stays where it is and only the header is written:
///   6: (name, shape, dtype, region, region_offset, byte_size)             system shm region
///   7: (name, shape, dtype, region, region_offset, byte_size, device_id)  client CUDA region
///   8: (name, shape, dtype, ipc_handle, offset, byte_size, device_id, buffer_id)
///      the writer's own device allocation, exported through its 64-byte CUDA IPC handle
RecordTensorSource header_only_tensor(const py::tuple& entry) {
  const auto n = entry.size();
  const auto placement = n == 6 ? TensorPlacement::kSystemRegion
                         : n == 7 ? TensorPlacement::kGpuRegion
                                  : TensorPlacement::kGpuExported;
  RecordTensorSource src = header_only(entry, placement);
  src.offset = entry[4].cast<uint64_t>();
  src.byte_size = entry[5].cast<uint64_t>();
  if (n >= 7) src.device_id = device_of(src.name, entry[6]);
  if (n == 8) {
    const std::string raw = bytes_like(entry[3]);
    if (raw.size() != kCudaIpcHandleBytes) {
      throw py::value_error("tensor '" + src.name + "': a CUDA IPC handle is 64 bytes, not " +
                            std::to_string(raw.size()));
    }
    std::memcpy(src.cuda_ipc_handle.data(), raw.data(), kCudaIpcHandleBytes);
    src.handle = entry[7].cast<uint64_t>();
  } else {
    src.handle = entry[3].cast<uint64_t>();
  }
  return src;
}

void add_tensor(TensorInputs& in, const py::handle& item) {
  const auto entry = py::reinterpret_borrow<py::tuple>(item);
  if (entry.size() >= 6 && entry.size() <= 8) {
    in.sources.push_back(header_only_tensor(entry));
    return;
  }
  if (entry.size() < 2 || entry.size() > 3) {
    throw py::value_error("a tensor is (name, array), (name, array, dtype), "
                          "(name, shape, dtype, region, region_offset, byte_size[, device_id]) or "
                          "(name, shape, dtype, ipc_handle, offset, byte_size, device_id, buffer_id)");
  }
  RecordTensorSource src;
  src.name = to_string(entry[0]);
  py::array arr = py::array::ensure(entry[1]);
  if (!arr) throw py::error_already_set();
  const bool explicit_dtype = entry.size() == 3 && !entry[2].is_none();
  src.dtype = explicit_dtype ? static_cast<DataType>(entry[2].cast<int>()) : dtype_of(arr.dtype());
  src.shape.assign(arr.shape(), arr.shape() + arr.ndim());
  if (src.dtype == DataType::kBytes) {
    const auto elements = collect_elements(arr.attr("ravel")());
    std::string data;
    uint64_t size = 0;
    for (const auto& e : elements) size += 4 + e.size();
    data.resize(size);
    auto* dst = reinterpret_cast<uint8_t*>(data.data());
    for (const auto& e : elements) dst += encode_bytes_element(dst, e.data(), static_cast<uint32_t>(e.size()));
    in.serialized.push_back(std::move(data));
    src.data = reinterpret_cast<const uint8_t*>(in.serialized.back().data());
    src.byte_size = in.serialized.back().size();
  } else {
    if (arr.dtype().kind() == 'O' || arr.dtype().kind() == 'S' || arr.dtype().kind() == 'U') {
      throw py::type_error("tensor '" + src.name + "' holds strings but is declared " + dtype_name(src.dtype));
    }
    if (explicit_dtype && static_cast<py::ssize_t>(dtype_size(src.dtype)) != arr.itemsize()) {
      throw py::type_error("tensor '" + src.name + "' has " + std::to_string(arr.itemsize()) +
                           "-byte elements but is declared " + dtype_name(src.dtype));
    }
    if (arr.dtype().byteorder() == '>') {
      arr = arr.attr("astype")(arr.dtype().attr("newbyteorder")("<"));
    }
    arr = py::array::ensure(arr, py::array::c_style);
    if (!arr) throw py::error_already_set();
    src.data = static_cast<const uint8_t*>(arr.data());
    src.byte_size = static_cast<uint64_t>(arr.nbytes());
    in.arrays.push_back(std::move(arr));
  }
  in.sources.push_back(std::move(src));
}

/// numpy dtype objects per Triton dtype, built once: parsing a format string per view is costly.
/// Stored the pybind11 way that never destroys them after the interpreter is gone.
py::dtype numpy_dtype(DataType t) {
  using Table = std::array<py::object, kMaxDataType + 1>;
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<Table> storage;
  const Table& table = storage
                           .call_once_and_store_result([] {
                             Table built;
                             for (uint8_t i = 0; i <= kMaxDataType; ++i) {
                               const auto dt = static_cast<DataType>(i);
                               if (dt != DataType::kInvalid && dt != DataType::kBytes) {
                                 built[i] = py::dtype(numpy_format(dt));
                               }
                             }
                             return built;
                           })
                           .get_stored();
  return py::reinterpret_borrow<py::dtype>(table[static_cast<uint8_t>(t)]);
}

/// The bytes of a tensor that lives in a client region: `regions` maps region ids to objects
/// exposing the region's bytes (an mmap); the range is checked against the region's length.
/// `readonly` tells whether that object refuses writes (its views must then refuse them too).
const uint8_t* region_data(const TensorDesc& d, const py::object& regions, py::object* base, bool* readonly) {
  const auto map = py::reinterpret_borrow<py::dict>(regions);
  const py::int_ key(d.data_handle);
  if (!map.contains(key)) {
    throw FormatError("tensor " + quoted_name(d.name) + " names client region " + std::to_string(d.data_handle) +
                      ", which is not mapped");
  }
  *base = map[key];
  const py::buffer_info info = py::reinterpret_borrow<py::buffer>(*base).request();
  const auto size = static_cast<uint64_t>(info.size * info.itemsize);
  if (d.data_offset > size || d.byte_size > size - d.data_offset) {
    throw FormatError("tensor " + quoted_name(d.name) + " runs past the end of its client region");
  }
  if (d.dtype == DataType::kBytes) check_bytes_count(d.byte_size, element_count(d.shape));
  *readonly = info.readonly;
  return static_cast<const uint8_t*>(info.ptr) + d.data_offset;
}

py::array tensor_view(const std::shared_ptr<Pool>& pool, const TensorDesc& d, const py::object& pool_base,
                      const py::object& regions) {
  py::object base = pool_base;
  bool readonly = false;
  const uint8_t* data = d.memory_type == MemoryType::kSystemShm ? region_data(d, regions, &base, &readonly)
                                                                 : pool->resolve(d.data_handle, d.byte_size);
  if (d.dtype == DataType::kBytes) {
    py::array flat = decode_bytes_array(data, d.byte_size, element_count(d.shape));
    return flat.attr("reshape")(py::cast(d.shape));
  }
  py::array view(numpy_dtype(d.dtype), std::vector<py::ssize_t>(d.shape.begin(), d.shape.end()), {}, data, base);
  if (readonly) view.attr("setflags")(py::arg("write") = false);  // pybind11 marks views writable
  return view;
}

/// A GPU tensor is always described, never viewed: this process may have no GPU, and device
/// memory is opened (and its range checked) by whoever uses it.
py::tuple gpu_description(const TensorDesc& d) {
  const py::tuple shape(py::cast(d.shape));
  if (d.flags & kTensorInRegion) {
    return py::make_tuple("cuda_region", d.data_handle, d.data_offset, d.byte_size, shape, d.device_id);
  }
  const py::bytes handle(reinterpret_cast<const char*>(d.cuda_ipc_handle.data()), d.cuda_ipc_handle.size());
  return py::make_tuple("cuda_ipc", handle, d.data_offset, d.byte_size, shape, d.device_id, d.data_handle);
}

}  // namespace

void bind_record(py::module_& m) {
  py::class_<RecordLease>(m, "RecordLease", "Frees an inference record when its last tensor view goes away.");

  py::native_enum<RecordKind>(m, "RecordKind", "enum.IntEnum")
      .value("REQUEST", RecordKind::kRequest)
      .value("RESPONSE", RecordKind::kResponse)
      .value("PAYLOAD", RecordKind::kPayload)
      .finalize();

  m.def(
      "write_record",
      [](const std::shared_ptr<Pool>& pool, uint32_t kind, uint32_t status, const py::sequence& ints,
         const py::sequence& strings, const py::sequence& tensors, uint64_t next) {
        RecordSource source;
        if (kind < 1 || kind > 3) throw py::value_error("unknown record kind " + std::to_string(kind));
        source.kind = static_cast<RecordKind>(kind);
        source.status = status;
        source.next = next;
        if (ints.size() > kMaxRecordInts) throw py::value_error("a record holds at most 3 integers");
        for (size_t i = 0; i < ints.size(); ++i) source.ints[i] = ints[i].cast<uint64_t>();
        source.strings.reserve(strings.size());
        for (const py::handle s : strings) source.strings.push_back(to_string(s));
        TensorInputs in;
        in.sources.reserve(tensors.size());
        for (const py::handle t : tensors) add_tensor(in, t);
        source.tensors = std::move(in.sources);
        Pool& p = open_pool(pool);
        uint64_t data_bytes = 0;  // what gets copied: header-only tensors copy nothing
        for (const auto& t : source.tensors) {
          if (t.placement == TensorPlacement::kInline) data_bytes += t.byte_size;
        }
        if (data_bytes < (1u << 20)) return write_record(p, source);
        py::gil_scoped_release release;  // large copies run without the GIL; `in` keeps the data alive
        return write_record(p, source);
      },
      py::arg("pool"), py::arg("kind"), py::arg("status") = 0, py::arg("ints") = py::tuple(),
      py::arg("strings") = py::tuple(), py::arg("tensors") = py::tuple(), py::arg("next") = 0,
      "Write one record (strings, and tensors given as (name, array[, dtype])) in one allocation.\n"
      "Arrays are copied once; str/bytes/object arrays become BYTES. Header-only tensors (no copy):\n"
      "(name, shape, dtype, region, region_offset, byte_size) in a client system region;\n"
      "(name, shape, dtype, region, region_offset, byte_size, device_id) in a client CUDA region;\n"
      "(name, shape, dtype, ipc_handle, offset, byte_size, device_id, buffer_id) in the writer's\n"
      "device allocation named by a 64-byte CUDA IPC handle. Returns the record's handle.");
  m.def(
      "read_record",
      [](const std::shared_ptr<Pool>& pool, uint64_t handle, bool lease, const py::object& regions) {
        RecordView view = read_record(open_pool(pool), handle);
        const py::object base = lease ? py::cast(std::make_unique<RecordLease>(pool, handle)) : py::cast(pool);
        py::list strings;
        for (const auto& s : view.strings) strings.append(from_utf8(s));
        py::list tensors;
        for (const auto& d : view.tensors) {
          if (d.memory_type == MemoryType::kGpu) {
            tensors.append(py::make_tuple(py::str(d.name), static_cast<int>(d.dtype), gpu_description(d)));
            continue;
          }
          if (d.memory_type == MemoryType::kSystemShm && regions.is_none()) {
            // A tensor the peer placed in a client region: described, not viewed.
            tensors.append(py::make_tuple(py::str(d.name), static_cast<int>(d.dtype),
                                          py::make_tuple(d.data_handle, d.data_offset, d.byte_size,
                                                         py::tuple(py::cast(d.shape)))));
            continue;
          }
          tensors.append(
              py::make_tuple(py::str(d.name), static_cast<int>(d.dtype), tensor_view(pool, d, base, regions)));
        }
        return py::make_tuple(static_cast<int>(view.kind), view.status,
                              py::make_tuple(view.ints[0], view.ints[1], view.ints[2]), view.next, strings, tensors);
      },
      py::arg("pool"), py::arg("handle"), py::arg("lease") = false, py::arg("regions") = py::none(),
      "Read and validate a record: (kind, status, ints, next, strings, [(name, dtype, array)]).\n"
      "Arrays are zero-copy views (BYTES are decoded to object arrays). With lease=True the record\n"
      "is freed when the last view goes away; otherwise the writer stays its owner. Tensors that\n"
      "live in a client region are views of regions[id] (a dict of buffer objects), bounds-checked;\n"
      "without `regions` they are described as (region, offset, byte_size, shape) instead.\n"
      "GPU tensors are always described: (\"cuda_region\", region, offset, byte_size, shape,\n"
      "device_id) or (\"cuda_ipc\", ipc_handle, offset, byte_size, shape, device_id, buffer_id).");
  m.def(
      "set_record_next",
      [](const std::shared_ptr<Pool>& pool, uint64_t handle, uint64_t next) {
        set_record_next(open_pool(pool), handle, next);
      },
      py::arg("pool"), py::arg("handle"), py::arg("next"));
  m.def(
      "mark_record_started",
      [](const std::shared_ptr<Pool>& pool, uint64_t handle) { mark_record_started(open_pool(pool), handle); },
      py::arg("pool"), py::arg("handle"),
      "Stamp a request record with the time its execution begins (the stub, as it starts it).");
  m.def(
      "record_running_ms",
      [](const std::shared_ptr<Pool>& pool, uint64_t handle) { return record_running_ms(open_pool(pool), handle); },
      py::arg("pool"), py::arg("handle"),
      "Milliseconds since a request record was stamped by mark_record_started, or -1 if it was not.");
  m.def(
      "free_record_chain",
      [](const std::shared_ptr<Pool>& pool, uint64_t handle, uint32_t limit) {
        return free_record_chain(open_pool(pool), handle, limit);
      },
      py::arg("pool"), py::arg("handle"), py::arg("limit") = 1u << 20,
      "Free a record and the records chained after it; returns how many were freed.");
}

}  // namespace stubhost::bindings
