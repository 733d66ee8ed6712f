// The tensor header: how a tensor is described in the pool.
//
//   +0    TensorHeaderShm (128 bytes)
//   +128  int64 shape[ndim]
//   +..   char name[name_length]            (no terminator)
//   pad to 64
//   data (when stored inline: data_handle = header handle + tensor_header_bytes())
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shm/pool.h"
#include "tensor/dtype.h"

namespace stubhost {

constexpr uint32_t kTensorMagic = 0x534e5453;  // "STNS"
constexpr uint32_t kMaxTensorDims = 64;
constexpr uint32_t kMaxTensorNameLength = 4096;
constexpr uint32_t kCudaIpcHandleBytes = 64;
/// Header flag: a GPU tensor whose data lies in a client's registered CUDA region (data_handle =
/// region id, data_offset = offset in it, no IPC handle). Clear on a GPU tensor: the writer
/// exported its own allocation (cuda_ipc_handle = that allocation's handle, data_offset = offset
/// of the tensor in it, data_handle = the owner's opaque buffer id).
constexpr uint32_t kTensorInRegion = 1u << 0;
constexpr uint32_t kKnownTensorFlags = kTensorInRegion;
/// GPU device ids a header may name: [0, kMaxGpuDevices).
constexpr int64_t kMaxGpuDevices = 4096;

struct TensorHeaderShm {
  uint32_t magic;
  uint8_t dtype;        // DataType
  uint8_t memory_type;  // MemoryType
  uint16_t reserved0;
  int32_t device_id;
  uint32_t ndim;
  uint32_t name_length;
  uint32_t flags;        // kTensorInRegion (GPU tensors only)
  uint64_t byte_size;    // bytes of data (for BYTES: the serialized length-prefixed size)
  uint64_t data_handle;  // CPU: pool handle of the first data byte
  uint64_t data_offset;  // GPU: offset of the tensor inside the allocation the IPC handle names
  uint8_t cuda_ipc_handle[kCudaIpcHandleBytes];
  uint64_t reserved[2];
};
static_assert(offsetof(TensorHeaderShm, device_id) == 8, "tensor header layout");
static_assert(offsetof(TensorHeaderShm, byte_size) == 24, "tensor header layout");
static_assert(offsetof(TensorHeaderShm, data_handle) == 32, "tensor header layout");
static_assert(offsetof(TensorHeaderShm, cuda_ipc_handle) == 48, "tensor header layout");
static_assert(sizeof(TensorHeaderShm) == 128, "tensor header layout");

/// A tensor description in ordinary memory.
struct TensorDesc {
  std::string name;
  DataType dtype = DataType::kInvalid;
  std::vector<int64_t> shape;
  MemoryType memory_type = MemoryType::kCpu;
  int32_t device_id = 0;
  uint64_t byte_size = 0;
  uint64_t data_handle = kNullHandle;
  uint64_t data_offset = 0;
  uint32_t flags = 0;  // kTensorInRegion
  std::array<uint8_t, kCudaIpcHandleBytes> cuda_ipc_handle{};
};

/// Element count of a shape; throws FormatError on a negative dim or overflow.
uint64_t element_count(const std::vector<int64_t>& shape);
/// Bytes a header with this name and rank takes, rounded to 64.
uint64_t tensor_header_bytes(size_t name_length, size_t ndim);
/// Throws FormatError unless the description is self-consistent (dtype, rank, name, byte size).
void validate_tensor_desc(const TensorDesc& desc);

/// Throws FormatError unless memory type, flags, device id and the GPU fields agree: flags only
/// known bits and only on GPU tensors; a GPU tensor is not BYTES, names a device in
/// [0, kMaxGpuDevices), ends before 2^64, and carries an IPC handle exactly when it is exported
/// (not in a region). decode_tensor_header does not apply these rules (a bare header keeps its raw
/// fields); readers that know what the header must describe, such as read_record, do.
void validate_placement(const TensorDesc& desc);
/// Throws FormatError naming the tensor unless device_id is in [0, kMaxGpuDevices).
void check_gpu_device(const std::string& name, int64_t device_id);

/// Serializes a header into dst (capacity bytes). Returns the bytes written (rounded to 64).
uint64_t encode_tensor_header(const TensorDesc& desc, uint8_t* dst, uint64_t capacity);
/// Parses a header from src (available bytes), validating every field against `available`.
/// Never reads outside [src, src + available).
TensorDesc decode_tensor_header(const uint8_t* src, uint64_t available);

/// Allocates one block holding header and (for CPU tensors with no data_handle) the data, writes
/// the header and sets desc.data_handle. Returns the header handle; free it to free both.
uint64_t write_tensor(Pool& pool, TensorDesc& desc);
/// Reads and validates the tensor at `handle`; for CPU tensors also checks that the data range
/// lies inside the pool.
TensorDesc read_tensor(Pool& pool, uint64_t handle);

}  // namespace stubhost
