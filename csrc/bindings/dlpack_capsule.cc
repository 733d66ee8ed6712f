// DLPack export and import for CPU memory (legacy "dltensor" capsules, which every consumer takes).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/bindings.h"
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

}  // namespace

void bind_dlpack(py::module_& m) {
  m.def(
      "to_dlpack",
      [](py::object owner, uintptr_t address, DataType dtype, const std::vector<int64_t>& shape, int32_t device_type,
         int32_t device_id) {
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
      },
      py::arg("owner"), py::arg("address"), py::arg("dtype"), py::arg("shape"), py::arg("device_type") = int32_t{kDLCPU},
      py::arg("device_id") = 0,
      "Export memory at `address` (kept alive through `owner`) as a DLPack capsule, compact row-major.");

  m.def(
      "from_dlpack",
      [](py::object source) {
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
        if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
          throw py::value_error("DLPack tensor is on device type " + std::to_string(t.device.device_type) +
                                "; only CPU memory can be imported here (GPU tensors go through stubhost.gpu)");
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
      "Import a CPU DLPack tensor (object with __dlpack__ or a capsule) without copying.\n"
      "Returns (DataType, numpy view); BF16 is viewed as uint16 words.");
}

}  // namespace stubhost::bindings
