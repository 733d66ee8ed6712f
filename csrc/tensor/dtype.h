// Triton data types: numbering, element sizes, names, and their DLPack equivalents.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tensor/dlpack.h"

namespace stubhost {

/// Same numbering as TRITONSERVER_DataType, which pb_utils' triton_dtype() exposes.
enum class DataType : uint8_t {
  kInvalid = 0,
  kBool = 1,
  kUint8 = 2,
  kUint16 = 3,
  kUint32 = 4,
  kUint64 = 5,
  kInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kFp16 = 10,
  kFp32 = 11,
  kFp64 = 12,
  kBytes = 13,
  kBf16 = 14,
};
constexpr uint8_t kMaxDataType = 14;

/// Bytes per element; 0 for BYTES (variable) and INVALID.
uint32_t dtype_size(DataType t) noexcept;
/// KServe/Triton wire name: "BOOL", "UINT8", ..., "FP32", "BYTES", "BF16".
const char* dtype_name(DataType t) noexcept;
std::optional<DataType> dtype_from_name(const std::string& name) noexcept;
bool dtype_valid(uint8_t raw) noexcept;

/// DLPack type of a fixed-size dtype; nullopt for BYTES/INVALID.
std::optional<DLDataType> dtype_to_dlpack(DataType t) noexcept;
std::optional<DataType> dtype_from_dlpack(DLDataType t) noexcept;

/// Where a tensor's bytes live. kSystemShm: in a client's registered system shared-memory
/// region, outside the pool (data_handle names the region, data_offset the byte offset in it).
enum class MemoryType : uint8_t { kCpu = 0, kCpuPinned = 1, kGpu = 2, kSystemShm = 3 };
constexpr uint8_t kMaxMemoryType = 3;

}  // namespace stubhost
