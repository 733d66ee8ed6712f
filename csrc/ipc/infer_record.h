// Inference records: a request or a response, its strings and its tensors in ONE pool allocation.
//
//   +0    RecordShm (64 bytes)
//   +64   strings: for each, uint32 length then its bytes (no padding between them)
//   pad to 64
//   tensors, one after another: tensor header (tensor_header_bytes) then its data, padded to 64;
//         each header's data_handle names the bytes right after it. Header-only tensors have
//         no data here: kSystemShm ones lie in a client's region (data_handle = region id,
//         data_offset = offset in it), which the reader's caller resolves; kGpu ones lie in
//         device memory, either a client's CUDA region (flag kTensorInRegion, same fields) or
//         the writer's own allocation (cuda_ipc_handle, data_offset, data_handle = buffer id).
//
// Records of one batch are chained through `next`, so a batch needs no extra allocation.
// The reader trusts nothing: every length, count and handle is checked against `total_bytes`,
// which is itself checked against the segment. See docs/design/protocol.md.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "shm/pool.h"
#include "tensor/tensor_header.h"

namespace stubhost {

constexpr uint32_t kRecordMagic = 0x43455253;  // "SREC"
constexpr uint32_t kMaxRecordStrings = 1u << 16;
constexpr uint32_t kMaxRecordTensors = 1u << 16;
constexpr uint32_t kMaxRecordInts = 3;

enum class RecordKind : uint32_t { kRequest = 1, kResponse = 2, kPayload = 3 };

struct RecordShm {
  uint32_t magic;
  uint32_t kind;          // RecordKind
  uint32_t status;        // responses: 0 = success, else an error code chosen by the protocol layer
  uint32_t string_count;
  uint32_t tensor_count;
  uint32_t started_ms;    // requests: CLOCK_MONOTONIC ms (mod 2^32, never 0) the stub began to run it; 0 before
  uint64_t total_bytes;   // bytes of the whole record, header included
  uint64_t next;          // handle of the next record of a batch, or 0
  uint64_t ints[kMaxRecordInts];  // meaning fixed by the protocol layer (flags, ids, timeouts)
};
static_assert(offsetof(RecordShm, total_bytes) == 24, "record layout");
static_assert(offsetof(RecordShm, ints) == 40, "record layout");
static_assert(sizeof(RecordShm) == 64, "record layout");

/// Where a written tensor's data lies; all but kInline write the header only.
enum class TensorPlacement : uint8_t {
  kInline,        // copied into the record after its header
  kSystemRegion,  // a client's system shm region: handle = region id, offset = offset in it
  kGpuRegion,     // a client's CUDA region: handle = region id, offset = offset in it
  kGpuExported,   // the writer's device allocation: cuda_ipc_handle names it, offset = offset of
                  // the tensor in it, handle = the owner's opaque buffer id
};

/// A tensor to be written: its data is copied (already serialized for BYTES) when inline.
struct RecordTensorSource {
  std::string name;
  DataType dtype = DataType::kInvalid;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // kInline only
  uint64_t byte_size = 0;
  TensorPlacement placement = TensorPlacement::kInline;
  uint64_t handle = 0;
  uint64_t offset = 0;
  int32_t device_id = 0;  // GPU placements
  std::array<uint8_t, kCudaIpcHandleBytes> cuda_ipc_handle{};  // kGpuExported
};

/// Everything a record holds, in ordinary memory (tensors by reference).
struct RecordSource {
  RecordKind kind = RecordKind::kPayload;
  uint32_t status = 0;
  uint64_t ints[kMaxRecordInts] = {0, 0, 0};
  std::vector<std::string> strings;
  std::vector<RecordTensorSource> tensors;
  uint64_t next = kNullHandle;
};

/// A record as read back: strings copied out, tensors described (their data stays in the pool).
struct RecordView {
  RecordKind kind = RecordKind::kPayload;
  uint32_t status = 0;
  uint64_t ints[kMaxRecordInts] = {0, 0, 0};
  uint64_t next = kNullHandle;
  std::vector<std::string> strings;
  std::vector<TensorDesc> tensors;
};

/// Bytes a record with these strings and tensors takes. Throws FormatError on overflow or limits.
uint64_t record_bytes(const RecordSource& source);
/// Allocates one block and writes the record into it (copying tensor data). Returns its handle.
/// Frees the block again if anything fails.
uint64_t write_record(Pool& pool, const RecordSource& source);
/// Reads and validates the record at `handle`; never touches memory outside it.
RecordView read_record(Pool& pool, uint64_t handle);
/// Links `handle` to `next` (building a batch chain).
void set_record_next(Pool& pool, uint64_t handle, uint64_t next);
/// Stamps the request record at `handle` with the time the stub begins to execute it.
void mark_record_started(Pool& pool, uint64_t handle);
/// Milliseconds since the request record at `handle` was stamped, or -1 if it was not.
int64_t record_running_ms(Pool& pool, uint64_t handle);
/// Frees a record and every record chained after it. Stops at the first invalid link and returns
/// how many were freed; `limit` bounds the walk so a cyclic chain cannot loop forever.
uint32_t free_record_chain(Pool& pool, uint64_t handle, uint32_t limit);

}  // namespace stubhost
