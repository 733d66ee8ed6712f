#include "ipc/infer_record.h"

#include <chrono>
#include <cstring>

#include "common/errors.h"
#include "common/text.h"
#include "tensor/bytes_codec.h"

namespace stubhost {
namespace {

uint64_t checked_add(uint64_t a, uint64_t b) {
  uint64_t out;
  if (add_overflows(a, b, &out)) throw FormatError("record size overflows");
  return out;
}

uint64_t checked_align(uint64_t n) {
  uint64_t out;
  if (!round_up(n, kAlignment, &out)) throw FormatError("record size overflows");
  return out;
}

uint64_t strings_end(const RecordSource& source) {
  uint64_t n = sizeof(RecordShm);
  for (const auto& s : source.strings) {
    if (s.size() > UINT32_MAX) throw FormatError("a record string is larger than 4 GiB");
    n = checked_add(n, checked_add(4, s.size()));
  }
  return checked_align(n);
}

uint64_t tensor_bytes(const RecordTensorSource& t) {
  const uint64_t inline_bytes = t.placement == TensorPlacement::kInline ? t.byte_size : 0;
  return checked_align(checked_add(tensor_header_bytes(t.name.size(), t.shape.size()), inline_bytes));
}

/// The header a source is written as; data_handle of an inline tensor is set by the caller.
TensorDesc header_of(const RecordTensorSource& t) {
  TensorDesc desc;
  desc.name = t.name;
  desc.dtype = t.dtype;
  desc.shape = t.shape;
  desc.byte_size = t.byte_size;
  switch (t.placement) {
    case TensorPlacement::kInline: return desc;
    case TensorPlacement::kSystemRegion: desc.memory_type = MemoryType::kSystemShm; break;
    case TensorPlacement::kGpuRegion:
      desc.memory_type = MemoryType::kGpu;
      desc.flags = kTensorInRegion;
      desc.device_id = t.device_id;
      break;
    case TensorPlacement::kGpuExported:
      desc.memory_type = MemoryType::kGpu;
      desc.device_id = t.device_id;
      desc.cuda_ipc_handle = t.cuda_ipc_handle;
      break;
  }
  desc.data_handle = t.handle;
  desc.data_offset = t.offset;
  return desc;
}

}  // namespace

uint64_t record_bytes(const RecordSource& source) {
  if (source.strings.size() > kMaxRecordStrings) throw FormatError("a record holds too many strings");
  if (source.tensors.size() > kMaxRecordTensors) throw FormatError("a record holds too many tensors");
  uint64_t n = strings_end(source);
  for (const auto& t : source.tensors) n = checked_add(n, tensor_bytes(t));
  return n;
}

uint64_t write_record(Pool& pool, const RecordSource& source) {
  const uint64_t total = record_bytes(source);
  const uint64_t handle = pool.allocate(total);
  try {
    uint8_t* base = pool.resolve(handle, total);
    RecordShm head{};
    head.magic = kRecordMagic;
    head.kind = static_cast<uint32_t>(source.kind);
    head.status = source.status;
    head.string_count = static_cast<uint32_t>(source.strings.size());
    head.tensor_count = static_cast<uint32_t>(source.tensors.size());
    head.total_bytes = total;
    head.next = source.next;
    std::memcpy(head.ints, source.ints, sizeof head.ints);
    std::memcpy(base, &head, sizeof head);

    uint64_t at = sizeof(RecordShm);
    for (const auto& s : source.strings) {
      const auto len = static_cast<uint32_t>(s.size());
      std::memcpy(base + at, &len, 4);
      if (len) std::memcpy(base + at + 4, s.data(), len);
      at += 4 + uint64_t{len};
    }
    at = checked_align(at);
    for (const auto& t : source.tensors) {
      TensorDesc desc = header_of(t);
      const uint64_t header = tensor_header_bytes(t.name.size(), t.shape.size());
      const bool inline_data = t.placement == TensorPlacement::kInline;
      if (inline_data) desc.data_handle = handle + at + header;  // handles are (segment, offset): offsets add
      validate_placement(desc);  // what the reader will insist on, so a bad record is never sent
      encode_tensor_header(desc, base + at, header);  // validates dtype, shape and byte size
      if (inline_data && t.byte_size) std::memcpy(base + at + header, t.data, t.byte_size);
      at += tensor_bytes(t);
    }
  } catch (...) {
    pool.free(handle);
    throw;
  }
  return handle;
}

RecordView read_record(Pool& pool, uint64_t handle) {
  RecordShm head;
  std::memcpy(&head, pool.resolve(handle, sizeof head), sizeof head);  // copy: the peer may write on
  if (head.magic != kRecordMagic) throw FormatError("memory does not hold an inference record");
  if (head.kind < 1 || head.kind > 3) throw FormatError("inference record has an unknown kind");
  if (head.string_count > kMaxRecordStrings || head.tensor_count > kMaxRecordTensors) {
    throw FormatError("inference record claims too many strings or tensors");
  }
  if (head.total_bytes < sizeof head) throw FormatError("inference record is truncated");
  const uint64_t total = head.total_bytes;
  const uint8_t* base = pool.resolve(handle, total);  // the whole record lies inside one segment

  RecordView view;
  view.kind = static_cast<RecordKind>(head.kind);
  view.status = head.status;
  view.next = head.next;
  std::memcpy(view.ints, head.ints, sizeof view.ints);

  uint64_t at = sizeof head;
  view.strings.reserve(head.string_count);
  for (uint32_t i = 0; i < head.string_count; ++i) {
    if (total - at < 4) throw FormatError("inference record string table is truncated");
    uint32_t len;
    std::memcpy(&len, base + at, 4);
    if (total - at - 4 < len) throw FormatError("inference record string runs past the record");
    view.strings.emplace_back(reinterpret_cast<const char*>(base + at + 4), len);
    at += 4 + uint64_t{len};
  }
  at = checked_align(at);
  view.tensors.reserve(head.tensor_count);
  for (uint32_t i = 0; i < head.tensor_count; ++i) {
    if (at > total) throw FormatError("inference record tensor table runs past the record");
    TensorDesc desc = decode_tensor_header(base + at, total - at);
    const uint64_t header = tensor_header_bytes(desc.name.size(), desc.shape.size());
    if (header > total - at) {
      throw FormatError("inference record tensor " + quoted_name(desc.name) + " runs past the record");
    }
    validate_placement(desc);  // flags, and the GPU fields: device, offset + size, IPC handle
    if (desc.memory_type == MemoryType::kSystemShm || desc.memory_type == MemoryType::kGpu) {
      // Header only. System region: the caller checks offset and size against the region. GPU:
      // device memory this process cannot bounds-check; whoever opens it checks the range.
      at = checked_align(checked_add(at, header));
      view.tensors.push_back(std::move(desc));
      continue;
    }
    if (desc.memory_type != MemoryType::kCpu || desc.data_handle != handle + at + header) {
      throw FormatError("inference record tensor " + quoted_name(desc.name) + " does not hold its data inline");
    }
    if (desc.byte_size > total - at - header) {
      throw FormatError("inference record tensor " + quoted_name(desc.name) + " runs past the record");
    }
    if (desc.dtype == DataType::kBytes) {
      check_bytes_count(desc.byte_size, element_count(desc.shape));
    }
    at = checked_align(checked_add(checked_add(at, header), desc.byte_size));
    view.tensors.push_back(std::move(desc));
  }
  return view;
}

void set_record_next(Pool& pool, uint64_t handle, uint64_t next) {
  auto* head = reinterpret_cast<RecordShm*>(pool.resolve(handle, sizeof(RecordShm)));
  if (head->magic != kRecordMagic) throw FormatError("memory does not hold an inference record");
  head->next = next;
}

namespace {
RecordShm* request_header(Pool& pool, uint64_t handle) {
  auto* head = reinterpret_cast<RecordShm*>(pool.resolve(handle, sizeof(RecordShm)));
  if (head->magic != kRecordMagic || head->kind != static_cast<uint32_t>(RecordKind::kRequest)) {
    throw FormatError("memory does not hold a request record");
  }
  return head;
}

uint32_t monotonic_ms32() {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();  // CLOCK_MONOTONIC: one clock for all processes
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
}
}  // namespace

void mark_record_started(Pool& pool, uint64_t handle) {
  const uint32_t now = monotonic_ms32();
  // Relaxed is enough: the reader only compares times, and the other process may be writing it.
  __atomic_store_n(&request_header(pool, handle)->started_ms, now == 0 ? 1u : now, __ATOMIC_RELAXED);
}

int64_t record_running_ms(Pool& pool, uint64_t handle) {
  const uint32_t started = __atomic_load_n(&request_header(pool, handle)->started_ms, __ATOMIC_RELAXED);
  if (started == 0) return -1;
  return static_cast<uint32_t>(monotonic_ms32() - started);  // modular: right for runs under 49 days
}

uint32_t free_record_chain(Pool& pool, uint64_t handle, uint32_t limit) {
  uint32_t freed = 0;
  while (handle != kNullHandle && freed < limit) {
    uint64_t next;
    try {
      RecordShm head;
      std::memcpy(&head, pool.resolve(handle, sizeof head), sizeof head);
      if (head.magic != kRecordMagic) break;
      next = head.next;
      pool.free(handle);
    } catch (const CoreError&) {
      break;  // a forged or stale link ends the walk; what it named is not ours to free
    }
    ++freed;
    handle = next;
  }
  return freed;
}

}  // namespace stubhost
