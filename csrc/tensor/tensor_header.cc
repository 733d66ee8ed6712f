#include "tensor/tensor_header.h"

#include <cstdio>
#include <cstring>

#include "common/errors.h"
#include "common/text.h"

namespace stubhost {
namespace {

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%x", v);
  return buf;
}

}  // namespace

uint64_t element_count(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw FormatError("tensor shape has a negative dimension " + std::to_string(d));
    if (mul_overflows(n, static_cast<uint64_t>(d), &n)) throw FormatError("tensor shape overflows");
  }
  return n;
}

uint64_t tensor_header_bytes(size_t name_length, size_t ndim) {
  uint64_t n = sizeof(TensorHeaderShm) + 8 * uint64_t{ndim} + uint64_t{name_length};
  round_up(n, kAlignment, &n);
  return n;
}

void validate_tensor_desc(const TensorDesc& desc) {
  if (!dtype_valid(static_cast<uint8_t>(desc.dtype)) || desc.dtype == DataType::kInvalid) {
    throw FormatError("tensor " + quoted_name(desc.name) + " has an invalid data type " +
                      std::to_string(static_cast<int>(desc.dtype)));
  }
  if (static_cast<uint8_t>(desc.memory_type) > kMaxMemoryType) {
    throw FormatError("tensor has an invalid memory type " + std::to_string(int(desc.memory_type)));
  }
  if (desc.shape.size() > kMaxTensorDims) {
    throw FormatError("tensor has " + std::to_string(desc.shape.size()) + " dimensions, more than " +
                      std::to_string(kMaxTensorDims));
  }
  if (desc.name.size() > kMaxTensorNameLength) throw FormatError("tensor name is too long");
  if (!valid_utf8(desc.name)) throw FormatError("tensor name " + quoted_name(desc.name) + " is not valid UTF-8");
  const uint64_t count = element_count(desc.shape);
  const uint32_t size = dtype_size(desc.dtype);
  if (size != 0) {
    uint64_t expected;
    if (mul_overflows(count, size, &expected) || expected != desc.byte_size) {
      throw FormatError("tensor " + quoted_name(desc.name) + " of " + dtype_name(desc.dtype) + " with " +
                        std::to_string(count) + " elements cannot have " + std::to_string(desc.byte_size) +
                        " bytes");
    }
  } else {
    // BYTES: every element takes at least its 4-byte length prefix.
    uint64_t least;
    if (mul_overflows(count, 4, &least) || desc.byte_size < least) {
      throw FormatError("BYTES tensor " + quoted_name(desc.name) + " with " + std::to_string(count) +
                        " elements cannot have only " + std::to_string(desc.byte_size) + " bytes");
    }
  }
}

void check_gpu_device(const std::string& name, int64_t device_id) {
  if (device_id < 0 || device_id >= kMaxGpuDevices) {
    throw FormatError("GPU tensor " + quoted_name(name) + " names device " + std::to_string(device_id) +
                      ", outside [0, " + std::to_string(kMaxGpuDevices) + ")");
  }
}

void validate_placement(const TensorDesc& desc) {
  if (desc.flags & ~kKnownTensorFlags) {
    throw FormatError("tensor " + quoted_name(desc.name) + " has unknown header flags 0x" + hex(desc.flags));
  }
  if (desc.memory_type != MemoryType::kGpu) {
    // kSystemShm means "in a region" by its memory type alone; the flag is for GPU tensors.
    if (desc.flags != 0) {
      throw FormatError("tensor " + quoted_name(desc.name) + " has header flags 0x" + hex(desc.flags) +
                        " but is not a GPU tensor");
    }
    return;
  }
  if (desc.dtype == DataType::kBytes) {
    throw FormatError("BYTES tensor " + quoted_name(desc.name) + " cannot be a GPU tensor");
  }
  check_gpu_device(desc.name, desc.device_id);
  uint64_t end;
  if (add_overflows(desc.data_offset, desc.byte_size, &end)) {
    throw FormatError("GPU tensor " + quoted_name(desc.name) + " at offset " + std::to_string(desc.data_offset) +
                      " with " + std::to_string(desc.byte_size) + " bytes ends past 2^64");
  }
  bool zero_handle = true;
  for (uint8_t b : desc.cuda_ipc_handle) zero_handle = zero_handle && b == 0;
  if ((desc.flags & kTensorInRegion) && !zero_handle) {
    throw FormatError("GPU tensor " + quoted_name(desc.name) + " lies in a CUDA region but carries an IPC handle");
  }
  if (!(desc.flags & kTensorInRegion) && zero_handle) {
    throw FormatError("exported GPU tensor " + quoted_name(desc.name) + " has an all-zero CUDA IPC handle");
  }
}

uint64_t encode_tensor_header(const TensorDesc& desc, uint8_t* dst, uint64_t capacity) {
  validate_tensor_desc(desc);
  const uint64_t bytes = tensor_header_bytes(desc.name.size(), desc.shape.size());
  if (bytes > capacity) throw FormatError("tensor header does not fit its buffer");
  std::memset(dst, 0, bytes);
  TensorHeaderShm h{};
  h.magic = kTensorMagic;
  h.dtype = static_cast<uint8_t>(desc.dtype);
  h.memory_type = static_cast<uint8_t>(desc.memory_type);
  h.device_id = desc.device_id;
  h.ndim = static_cast<uint32_t>(desc.shape.size());
  h.name_length = static_cast<uint32_t>(desc.name.size());
  h.byte_size = desc.byte_size;
  h.data_handle = desc.data_handle;
  h.data_offset = desc.data_offset;
  h.flags = desc.flags;
  std::memcpy(h.cuda_ipc_handle, desc.cuda_ipc_handle.data(), kCudaIpcHandleBytes);
  std::memcpy(dst, &h, sizeof h);
  if (!desc.shape.empty()) std::memcpy(dst + sizeof h, desc.shape.data(), 8 * desc.shape.size());
  std::memcpy(dst + sizeof h + 8 * desc.shape.size(), desc.name.data(), desc.name.size());
  return bytes;
}

TensorDesc decode_tensor_header(const uint8_t* src, uint64_t available) {
  if (available < sizeof(TensorHeaderShm)) throw FormatError("tensor header is truncated");
  TensorHeaderShm h;
  // Copy first: the peer may change shared memory while we validate.
  std::memcpy(&h, src, sizeof h);
  if (h.magic != kTensorMagic) throw FormatError("memory does not hold a tensor header");
  if (h.ndim > kMaxTensorDims) throw FormatError("tensor header claims " + std::to_string(h.ndim) + " dimensions");
  if (h.name_length > kMaxTensorNameLength) throw FormatError("tensor header claims an impossible name length");
  const uint64_t need = sizeof h + 8 * uint64_t{h.ndim} + h.name_length;
  if (need > available) throw FormatError("tensor header runs past its allocation");
  TensorDesc d;
  d.dtype = static_cast<DataType>(h.dtype);
  d.memory_type = static_cast<MemoryType>(h.memory_type);
  d.device_id = h.device_id;
  d.byte_size = h.byte_size;
  d.data_handle = h.data_handle;
  d.data_offset = h.data_offset;
  d.flags = h.flags;
  std::memcpy(d.cuda_ipc_handle.data(), h.cuda_ipc_handle, kCudaIpcHandleBytes);
  d.shape.resize(h.ndim);
  if (h.ndim) std::memcpy(d.shape.data(), src + sizeof h, 8 * uint64_t{h.ndim});
  d.name.assign(reinterpret_cast<const char*>(src + sizeof h + 8 * uint64_t{h.ndim}), h.name_length);
  if (!dtype_valid(h.dtype)) throw FormatError("tensor header has an invalid data type");
  validate_tensor_desc(d);
  return d;
}

uint64_t write_tensor(Pool& pool, TensorDesc& desc) {
  validate_tensor_desc(desc);
  const uint64_t header = tensor_header_bytes(desc.name.size(), desc.shape.size());
  const bool inline_data = desc.memory_type != MemoryType::kGpu && desc.data_handle == kNullHandle;
  uint64_t total = header;
  if (inline_data && add_overflows(header, desc.byte_size, &total)) throw FormatError("tensor too large");
  const uint64_t h = pool.allocate(total);
  try {
    if (inline_data) desc.data_handle = h + header;
    encode_tensor_header(desc, pool.resolve(h, header), header);
  } catch (...) {
    pool.free(h);
    throw;
  }
  return h;
}

TensorDesc read_tensor(Pool& pool, uint64_t handle) {
  const uint8_t* fixed = pool.resolve(handle, sizeof(TensorHeaderShm));
  TensorHeaderShm h;
  std::memcpy(&h, fixed, sizeof h);
  if (h.ndim > kMaxTensorDims || h.name_length > kMaxTensorNameLength) {
    throw FormatError("memory does not hold a valid tensor header");
  }
  const uint64_t bytes = tensor_header_bytes(h.name_length, h.ndim);
  TensorDesc d = decode_tensor_header(pool.resolve(handle, bytes), bytes);
  if (d.memory_type == MemoryType::kSystemShm) {
    throw FormatError("tensor " + quoted_name(d.name) + " lives in a client region, not in the pool");
  }
  if (d.memory_type != MemoryType::kGpu) pool.resolve(d.data_handle, d.byte_size);  // bounds check
  return d;
}

}  // namespace stubhost
