#include "tensor/dtype.h"

namespace stubhost {
namespace {

struct DtypeInfo {
  DataType type;
  const char* name;
  uint32_t size;
  uint8_t dl_code;
};

// Indexed by the DataType value.
constexpr DtypeInfo kTable[] = {
    {DataType::kInvalid, "INVALID", 0, kDLOpaqueHandle},
    {DataType::kBool, "BOOL", 1, kDLBool},
    {DataType::kUint8, "UINT8", 1, kDLUInt},
    {DataType::kUint16, "UINT16", 2, kDLUInt},
    {DataType::kUint32, "UINT32", 4, kDLUInt},
    {DataType::kUint64, "UINT64", 8, kDLUInt},
    {DataType::kInt8, "INT8", 1, kDLInt},
    {DataType::kInt16, "INT16", 2, kDLInt},
    {DataType::kInt32, "INT32", 4, kDLInt},
    {DataType::kInt64, "INT64", 8, kDLInt},
    {DataType::kFp16, "FP16", 2, kDLFloat},
    {DataType::kFp32, "FP32", 4, kDLFloat},
    {DataType::kFp64, "FP64", 8, kDLFloat},
    {DataType::kBytes, "BYTES", 0, kDLOpaqueHandle},
    {DataType::kBf16, "BF16", 2, kDLBfloat},
};
static_assert(sizeof(kTable) / sizeof(kTable[0]) == kMaxDataType + 1, "one row per dtype");

}  // namespace

bool dtype_valid(uint8_t raw) noexcept { return raw <= kMaxDataType; }

uint32_t dtype_size(DataType t) noexcept {
  const auto i = static_cast<uint8_t>(t);
  return i <= kMaxDataType ? kTable[i].size : 0;
}

const char* dtype_name(DataType t) noexcept {
  const auto i = static_cast<uint8_t>(t);
  return i <= kMaxDataType ? kTable[i].name : "INVALID";
}

std::optional<DataType> dtype_from_name(const std::string& name) noexcept {
  for (const auto& row : kTable) {
    if (name == row.name && row.type != DataType::kInvalid) return row.type;
  }
  return std::nullopt;
}

std::optional<DLDataType> dtype_to_dlpack(DataType t) noexcept {
  const uint32_t size = dtype_size(t);
  if (size == 0) return std::nullopt;
  return DLDataType{kTable[static_cast<uint8_t>(t)].dl_code, static_cast<uint8_t>(size * 8), 1};
}

std::optional<DataType> dtype_from_dlpack(DLDataType t) noexcept {
  if (t.lanes != 1) return std::nullopt;
  // Some producers still describe bool as an 8-bit unsigned integer with code kDLBool or kDLUInt;
  // only kDLBool maps to BOOL, so UINT8 data is never reinterpreted.
  for (const auto& row : kTable) {
    if (row.size != 0 && row.dl_code == t.code && row.size * 8 == t.bits) return row.type;
  }
  return std::nullopt;
}

}  // namespace stubhost
