// Bindings of dtypes, tensor headers and the BYTES codec.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>

#include <pybind11/native_enum.h>

#include "bindings/bindings.h"
#include "common/errors.h"
#include "tensor/bytes_codec.h"
#include "tensor/dtype.h"
#include "tensor/tensor_header.h"

namespace stubhost::bindings {
namespace {

/// A BYTES element as raw bytes: bytes/bytearray as they are, str as UTF-8, anything else as
/// str(x) in UTF-8 (what Triton's serialize_byte_tensor does).
std::string element_bytes(const py::handle& item) {
  if (PyBytes_Check(item.ptr())) return std::string(PyBytes_AS_STRING(item.ptr()), PyBytes_GET_SIZE(item.ptr()));
  if (PyByteArray_Check(item.ptr())) {
    return std::string(PyByteArray_AS_STRING(item.ptr()), PyByteArray_GET_SIZE(item.ptr()));
  }
  // Keep the str alive while its UTF-8 buffer is copied.
  const py::str text = PyUnicode_Check(item.ptr()) ? py::reinterpret_borrow<py::str>(item) : py::str(item);
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
  if (s == nullptr) throw py::error_already_set();
  return std::string(s, static_cast<size_t>(n));
}


uint64_t encoded_size(const std::vector<std::string>& elements) {
  uint64_t total = 0;
  for (const auto& e : elements) total += 4 + e.size();
  return total;
}

/// A contiguous read-only view of any bytes-like object.
py::buffer_info readable(const py::buffer& b) {
  py::buffer_info info = b.request();
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != expect) throw py::value_error("buffer must be C-contiguous");
    expect *= info.shape[i];
  }
  return info;
}

uint64_t buffer_nbytes(const py::buffer_info& info) {
  return static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
}

}  // namespace

std::vector<std::string> collect_elements(const py::iterable& items) {
  std::vector<std::string> out;
  for (const py::handle item : items) {
    out.push_back(element_bytes(item));
    if (out.back().size() > UINT32_MAX) throw FormatError("a BYTES element is larger than 4 GiB");
  }
  return out;
}

py::array decode_bytes_array(const uint8_t* data, uint64_t size, uint64_t count) {
  check_bytes_count(size, count);  // before the count sizes an allocation
  py::array out = py::module_::import("numpy").attr("empty")(count, py::arg("dtype") = "object");
  auto** slots = static_cast<PyObject**>(out.mutable_data());
  uint64_t i = 0;
  decode_bytes(data, size, count, [&](const char* element, uint32_t len) {
    PyObject* item = PyBytes_FromStringAndSize(element, static_cast<Py_ssize_t>(len));
    if (item == nullptr) throw py::error_already_set();
    PyObject** slot = &slots[i++];  // Py_XSETREF evaluates its target twice
    Py_XSETREF(*slot, item);
  });
  return out;
}

const char* numpy_format(DataType t) {
  switch (t) {
    case DataType::kBool: return "?";
    case DataType::kUint8: return "u1";
    case DataType::kUint16: return "<u2";
    case DataType::kUint32: return "<u4";
    case DataType::kUint64: return "<u8";
    case DataType::kInt8: return "i1";
    case DataType::kInt16: return "<i2";
    case DataType::kInt32: return "<i4";
    case DataType::kInt64: return "<i8";
    case DataType::kFp16: return "<f2";
    case DataType::kFp32: return "<f4";
    case DataType::kFp64: return "<f8";
    case DataType::kBf16: return "<u2";
    default: throw py::value_error(std::string("no numpy form for ") + dtype_name(t) + " tensors");
  }
}

void bind_tensor(py::module_& m) {
  py::native_enum<DataType>(m, "DataType", "enum.IntEnum", "Triton data types, numbered as TRITONSERVER_DataType.")
      .value("INVALID", DataType::kInvalid)
      .value("BOOL", DataType::kBool)
      .value("UINT8", DataType::kUint8)
      .value("UINT16", DataType::kUint16)
      .value("UINT32", DataType::kUint32)
      .value("UINT64", DataType::kUint64)
      .value("INT8", DataType::kInt8)
      .value("INT16", DataType::kInt16)
      .value("INT32", DataType::kInt32)
      .value("INT64", DataType::kInt64)
      .value("FP16", DataType::kFp16)
      .value("FP32", DataType::kFp32)
      .value("FP64", DataType::kFp64)
      .value("BYTES", DataType::kBytes)
      .value("BF16", DataType::kBf16)
      .finalize();
  py::native_enum<MemoryType>(m, "MemoryType", "enum.IntEnum")
      .value("CPU", MemoryType::kCpu)
      .value("CPU_PINNED", MemoryType::kCpuPinned)
      .value("GPU", MemoryType::kGpu)
      .value("SYSTEM_SHM", MemoryType::kSystemShm)
      .finalize();

  m.def("dtype_size", &dtype_size, py::arg("dtype"), "Bytes per element (0 for BYTES).");
  m.def("dtype_name", &dtype_name, py::arg("dtype"));
  m.def(
      "dtype_from_name",
      [](const std::string& name) {
        auto t = dtype_from_name(name);
        if (!t) throw py::value_error("unknown Triton data type '" + name + "'");
        return *t;
      },
      py::arg("name"));

  py::class_<TensorDesc>(m, "TensorInfo", "A tensor header as read from (or written to) the pool.")
      .def_readonly("name", &TensorDesc::name)
      .def_readonly("dtype", &TensorDesc::dtype)
      .def_property_readonly("shape", [](const TensorDesc& d) { return py::tuple(py::cast(d.shape)); })
      .def_readonly("memory_type", &TensorDesc::memory_type)
      .def_readonly("device_id", &TensorDesc::device_id)
      .def_readonly("byte_size", &TensorDesc::byte_size)
      .def_readonly("data_handle", &TensorDesc::data_handle)
      .def_readonly("data_offset", &TensorDesc::data_offset)
      .def_property_readonly("cuda_ipc_handle", [](const TensorDesc& d) {
        return py::bytes(reinterpret_cast<const char*>(d.cuda_ipc_handle.data()), d.cuda_ipc_handle.size());
      });

  auto make_desc = [](const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                      uint64_t byte_size, MemoryType memory_type, int32_t device_id, uint64_t data_handle,
                      uint64_t data_offset, const py::bytes& ipc) {
    TensorDesc d;
    d.name = name;
    d.dtype = dtype;
    d.shape = shape;
    d.byte_size = byte_size;
    d.memory_type = memory_type;
    d.device_id = device_id;
    d.data_handle = data_handle;
    d.data_offset = data_offset;
    const std::string raw = ipc;
    if (raw.size() > d.cuda_ipc_handle.size()) throw py::value_error("a CUDA IPC handle is 64 bytes");
    std::memcpy(d.cuda_ipc_handle.data(), raw.data(), raw.size());
    return d;
  };

  m.def(
      "write_tensor",
      [make_desc](const std::shared_ptr<Pool>& pool, const std::string& name, DataType dtype,
                  const std::vector<int64_t>& shape, uint64_t byte_size, MemoryType memory_type, int32_t device_id,
                  uint64_t data_handle, uint64_t data_offset, const py::bytes& ipc) {
        TensorDesc d = make_desc(name, dtype, shape, byte_size, memory_type, device_id, data_handle, data_offset, ipc);
        const uint64_t h = write_tensor(open_pool(pool), d);
        return py::make_tuple(h, std::move(d));
      },
      py::arg("pool"), py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("byte_size"),
      py::arg("memory_type") = MemoryType::kCpu, py::arg("device_id") = 0, py::arg("data_handle") = 0,
      py::arg("data_offset") = 0, py::arg("cuda_ipc_handle") = py::bytes(),
      "Allocate and write a tensor header (with room for CPU data after it unless data_handle is given).\n"
      "Returns (header_handle, TensorInfo); freeing header_handle frees both.");
  m.def(
      "tensor_array",
      [](const std::shared_ptr<Pool>& pool, const TensorDesc& d) {
        if (d.memory_type == MemoryType::kGpu) throw py::type_error("a GPU tensor has no numpy view");
        const char* format = numpy_format(d.dtype);
        uint8_t* data = open_pool(pool).resolve(d.data_handle, d.byte_size);
        // The Python Pool object is the array's base: the mapping lives as long as the array.
        return py::array(py::dtype(format), std::vector<py::ssize_t>(d.shape.begin(), d.shape.end()), {}, data,
                         py::cast(pool));
      },
      py::arg("pool"), py::arg("info"),
      "Zero-copy numpy view of a CPU tensor's data (BF16 as uint16 words; not for BYTES).");
  m.def(
      "read_tensor", [](const std::shared_ptr<Pool>& pool, uint64_t h) { return read_tensor(open_pool(pool), h); },
      py::arg("pool"), py::arg("handle"), "Read and validate the tensor header at handle.");
  m.def(
      "encode_tensor_header",
      [make_desc](const std::string& name, DataType dtype, const std::vector<int64_t>& shape, uint64_t byte_size,
                  MemoryType memory_type, int32_t device_id, uint64_t data_handle, uint64_t data_offset,
                  const py::bytes& ipc) {
        TensorDesc d = make_desc(name, dtype, shape, byte_size, memory_type, device_id, data_handle, data_offset, ipc);
        std::string out(tensor_header_bytes(d.name.size(), d.shape.size()), '\0');
        encode_tensor_header(d, reinterpret_cast<uint8_t*>(out.data()), out.size());
        return py::bytes(out);
      },
      py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("byte_size"),
      py::arg("memory_type") = MemoryType::kCpu, py::arg("device_id") = 0, py::arg("data_handle") = 0,
      py::arg("data_offset") = 0, py::arg("cuda_ipc_handle") = py::bytes());
  m.def(
      "decode_tensor_header",
      [](const py::buffer& b) {
        py::buffer_info info = readable(b);
        return decode_tensor_header(static_cast<const uint8_t*>(info.ptr), buffer_nbytes(info));
      },
      py::arg("buffer"), "Parse a tensor header from any bytes-like object (never reads past its end).");
  m.def("tensor_header_bytes", &tensor_header_bytes, py::arg("name_length"), py::arg("ndim"));

  m.def(
      "encode_bytes",
      [](const py::iterable& items) {
        const auto elements = collect_elements(items);
        std::string out(encoded_size(elements), '\0');
        auto* dst = reinterpret_cast<uint8_t*>(out.data());
        for (const auto& e : elements) dst += encode_bytes_element(dst, e.data(), static_cast<uint32_t>(e.size()));
        return py::bytes(out);
      },
      py::arg("items"), "Serialize elements (C order) in Triton's BYTES layout.");
  m.def(
      "encode_bytes_into",
      [](const py::buffer& target, const py::iterable& items) {
        const auto elements = collect_elements(items);
        py::buffer_info info = target.request(true);
        const uint64_t need = encoded_size(elements);
        if (need > buffer_nbytes(info)) {
          throw FormatError("BYTES data needs " + std::to_string(need) + " bytes but the buffer has " +
                            std::to_string(buffer_nbytes(info)));
        }
        auto* dst = static_cast<uint8_t*>(info.ptr);
        for (const auto& e : elements) dst += encode_bytes_element(dst, e.data(), static_cast<uint32_t>(e.size()));
        return need;
      },
      py::arg("buffer"), py::arg("items"), "Serialize into a writable buffer; returns the bytes written.");
  m.def(
      "encoded_bytes_size", [](const py::iterable& items) { return encoded_size(collect_elements(items)); },
      py::arg("items"));
  m.def(
      "decode_bytes",
      [](const py::buffer& b, uint64_t count) {
        py::buffer_info info = readable(b);
        return decode_bytes_array(static_cast<const uint8_t*>(info.ptr), buffer_nbytes(info), count);
      },
      py::arg("buffer"), py::arg("count"),
      "Parse `count` length-prefixed elements into a 1-D numpy object array of bytes.");
  m.def(
      "count_bytes_elements",
      [](const py::buffer& b) {
        py::buffer_info info = readable(b);
        return count_bytes_elements(static_cast<const uint8_t*>(info.ptr), buffer_nbytes(info));
      },
      py::arg("buffer"));
}

}  // namespace stubhost::bindings
