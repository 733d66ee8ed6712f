// DLPack export and import (legacy "dltensor" capsules, which every consumer takes): CPU memory
// becomes numpy views, CUDA memory a GpuView that only describes it.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "common/errors.h"
#include "tensor/dlpack.h"
#include "tensor/dtype.h"
#include "tensor/tensor_header.h"

namespace stubhost::bindings {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

/// Owns an exported DLManagedTensor: its shape array and a reference to the memory's owner.
struct ExportContext {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  PyObject* owner = nullptr;  // strong reference, released by the deleter
};

void export_deleter(DLManagedTensor* self) {
  // Ownership of the context passed to the DLPack consumer as a raw pointer (the C ABI requires
  // it); take it back here so it is destroyed exactly once.
  std::unique_ptr<ExportContext> ctx(static_cast<ExportContext*>(self->manager_ctx));
  // The consumer may call us from any thread, with or without the GIL.
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF(ctx->owner);
  PyGILState_Release(gil);
}

void unconsumed_capsule_destructor(PyObject* capsule) {
  // A capsule nobody consumed still owns its tensor.
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

/// A new "dltensor" capsule of compact row-major memory at `address`, kept alive through `owner`.
py::capsule export_capsule(py::object owner, uintptr_t address, DataType dtype, const std::vector<int64_t>& shape,
                           int32_t device_type, int32_t device_id) {
  const auto dl_dtype = dtype_to_dlpack(dtype);
  if (!dl_dtype) throw py::value_error(std::string("DLPack cannot carry ") + dtype_name(dtype) + " tensors");
  element_count(shape);  // rejects negative dims and overflow
  auto ctx = std::make_unique<ExportContext>();
  ctx->shape = shape;
  ctx->owner = owner.release().ptr();
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = reinterpret_cast<void*>(address);
  t.device = DLDevice{device_type, device_id};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = *dl_dtype;
  t.shape = ctx->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = export_deleter;
  PyObject* capsule = PyCapsule_New(&ctx->managed, kCapsuleName, unconsumed_capsule_destructor);
  if (capsule == nullptr) {
    Py_XDECREF(ctx->owner);
    throw py::error_already_set();
  }
  ctx.release();  // now owned by the capsule, then by its consumer (see export_deleter)
  return py::reinterpret_steal<py::capsule>(capsule);
}

/// Device memory described for Python; this process never dereferences it. `owner_` keeps the
/// memory alive: the capsule that owns a consumed DLManagedTensor (its deleter runs once, when
/// the last reference to the view goes, with the GIL held like every capsule destructor), or
/// whatever object gpu_view() was given.
class GpuView {
 public:
  GpuView(py::object owner, uintptr_t ptr, DataType dtype, std::vector<int64_t> shape, int32_t device_id)
      : owner_(std::move(owner)), ptr_(ptr), dtype_(dtype), shape_(std::move(shape)), device_id_(device_id) {
    if (!dtype_to_dlpack(dtype_)) {
      throw py::value_error(std::string("a GPU view cannot hold ") + dtype_name(dtype_) + " tensors");
    }
    if (device_id_ < 0 || device_id_ >= kMaxGpuDevices) {
      throw py::value_error("CUDA device id " + std::to_string(device_id_) + " is out of range");
    }
    if (shape_.size() > kMaxTensorDims) throw py::value_error("GPU tensor rank out of range");
    if (mul_overflows(element_count(shape_), dtype_size(dtype_), &byte_size_)) {
      throw FormatError("GPU tensor size overflows");
    }
  }

  uintptr_t ptr() const { return ptr_; }
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int32_t device_id() const { return device_id_; }
  uint64_t byte_size() const { return byte_size_; }

 private:
  py::object owner_;
  uintptr_t ptr_;
  DataType dtype_;
  std::vector<int64_t> shape_;
  int32_t device_id_;
  uint64_t byte_size_ = 0;
};

/// Compact row-major (C order), as Triton requires of GPU tensors: strides absent, or equal to
/// the compact ones except on dims of size 1 (never stepped along). An empty tensor addresses
/// nothing, so any strides do.
bool c_contiguous(const DLTensor& t, const std::vector<int64_t>& shape) {
  if (t.strides == nullptr || element_count(shape) == 0) return true;
  uint64_t expect = 1;  // cannot overflow: the element count fits in 64 bits
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (static_cast<uint64_t>(t.strides[i]) != expect) return false;
    expect *= static_cast<uint64_t>(shape[i]);
  }
  return true;
}

constexpr const char* kNotContiguous =
    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are supported.";

}  // namespace

void bind_dlpack(py::module_& m) {
  m.def(
      "to_dlpack",
      [](py::object owner, uintptr_t address, DataType dtype, const std::vector<int64_t>& shape, int32_t device_type,
         int32_t device_id) { return export_capsule(std::move(owner), address, dtype, shape, device_type, device_id); },
      py::arg("owner"), py::arg("address"), py::arg("dtype"), py::arg("shape"), py::arg("device_type") = int32_t{kDLCPU},
      py::arg("device_id") = 0,
      "Export memory at `address` (kept alive through `owner`) as a DLPack capsule, compact row-major.");

  py::class_<GpuView>(m, "GpuView",
                      "CUDA device memory (never dereferenced here), kept alive as long as this view.\n"
                      "From from_dlpack it owns the consumed DLPack tensor; from gpu_view it holds the owner.")
      .def_property_readonly("ptr", &GpuView::ptr, "Device address of the first element.")
      .def_property_readonly("shape", [](const GpuView& v) { return py::tuple(py::cast(v.shape())); })
      .def_property_readonly("dtype", &GpuView::dtype)
      .def_property_readonly("device_id", &GpuView::device_id)
      .def_property_readonly("byte_size", &GpuView::byte_size)
      .def(
          "__dlpack__",
          [](py::object self, const py::object& /*stream*/, const py::kwargs& kwargs) {
            // No stream to order against: the memory is complete when the view exists.
            const auto& v = self.cast<const GpuView&>();
            if (kwargs.contains("copy") && py::bool_(kwargs["copy"])) {
              throw py::buffer_error("GpuView exports without copying; copy=True is not supported");
            }
            const py::object device = kwargs.contains("dl_device") ? py::object(kwargs["dl_device"]) : py::none();
            const py::object own = py::make_tuple(int32_t{kDLCUDA}, v.device_id());
            if (!device.is_none() && !device.equal(own)) {
              throw py::buffer_error("GpuView can only be exported on its own CUDA device");
            }
            return export_capsule(self, v.ptr(), v.dtype(), v.shape(), kDLCUDA, v.device_id());
          },
          py::arg("stream") = py::none(),
          "A new kDLCUDA capsule of the same memory; it keeps this view (and so the memory) alive.")
      .def("__dlpack_device__", [](const GpuView& v) { return py::make_tuple(int32_t{kDLCUDA}, v.device_id()); })
      .def("__repr__", [](const GpuView& v) {
        return "GpuView(ptr=" + std::to_string(v.ptr()) + ", dtype=" + dtype_name(v.dtype()) +
               ", shape=" + py::repr(py::tuple(py::cast(v.shape()))).cast<std::string>() +
               ", device_id=" + std::to_string(v.device_id()) + ")";
      });

  m.def(
      "gpu_view",
      [](py::object owner, uintptr_t ptr, DataType dtype, const std::vector<int64_t>& shape, int32_t device_id) {
        return GpuView(std::move(owner), ptr, dtype, shape, device_id);
      },
      py::arg("owner"), py::arg("ptr"), py::arg("dtype"), py::arg("shape"), py::arg("device_id"),
      "Describe device memory at `ptr` that `owner` keeps alive (e.g. an opened CUDA IPC handle).");

  m.def(
      "from_dlpack",
      [](py::object source) -> py::tuple {
        py::object capsule = source;
        if (!PyCapsule_CheckExact(source.ptr())) {
          if (!py::hasattr(source, "__dlpack__")) throw py::type_error("object supports neither __dlpack__ nor is a DLPack capsule");
          capsule = source.attr("__dlpack__")();
        }
        if (!PyCapsule_IsValid(capsule.ptr(), kCapsuleName)) {
          throw py::value_error("not a DLPack capsule, or one that was already consumed");
        }
        auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
        PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName);
        // From here we own `managed`: this capsule calls its deleter when the last view goes.
        py::capsule keep(managed, [](void* p) {
          auto* t = static_cast<DLManagedTensor*>(p);
          if (t->deleter != nullptr) t->deleter(t);
        });
        const DLTensor& t = managed->dl_tensor;
        const bool cuda = t.device.device_type == kDLCUDA;
        if (!cuda && t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
          throw py::value_error("DLPack tensor is on device type " + std::to_string(t.device.device_type) +
                                "; only CPU and CUDA memory can be imported here");
        }
        const auto dtype = dtype_from_dlpack(t.dtype);
        if (!dtype) {
          throw py::value_error("DLPack data type (code " + std::to_string(t.dtype.code) + ", " +
                                std::to_string(t.dtype.bits) + " bits, " + std::to_string(t.dtype.lanes) +
                                " lanes) has no Triton equivalent");
        }
        if (t.ndim < 0 || static_cast<uint32_t>(t.ndim) > kMaxTensorDims) throw py::value_error("DLPack tensor rank out of range");
        std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
        element_count(shape);
        if (cuda) {
          if (!c_contiguous(t, shape)) throw py::value_error(kNotContiguous);
          const uintptr_t ptr = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;  // never dereferenced
          return py::make_tuple(*dtype, GpuView(keep, ptr, *dtype, std::move(shape), t.device.device_id));
        }
        const auto itemsize = static_cast<int64_t>(dtype_size(*dtype));
        std::vector<py::ssize_t> strides(static_cast<size_t>(t.ndim));
        int64_t expect = itemsize;
        for (int32_t i = t.ndim - 1; i >= 0; --i) {
          strides[static_cast<size_t>(i)] = static_cast<py::ssize_t>(t.strides ? t.strides[i] * itemsize : expect);
          expect *= shape[static_cast<size_t>(i)];
        }
        auto* data = static_cast<uint8_t*>(t.data) + t.byte_offset;
        py::array view(py::dtype(numpy_format(*dtype)), std::vector<py::ssize_t>(shape.begin(), shape.end()), strides,
                       data, keep);
        return py::make_tuple(*dtype, view);
      },
      py::arg("source"),
      "Import a DLPack tensor (object with __dlpack__ or a capsule) without copying.\n"
      "CPU: returns (DataType, numpy view); BF16 is viewed as uint16 words.\n"
      "CUDA (kDLCUDA, C-contiguous only): returns (DataType, GpuView), which owns the tensor.");
}

}  // namespace stubhost::bindings
