// Checkpoint::read_slice: a box of a tensor, with the copy every kind uses (copy_box) and the
// default of CheckpointKind::read_slice: a set hands the box to the file that holds the tensor;
// a raw storage reads only the box's byte runs (rows along dim 0 are one read); anything else
// (decoded, byte-swapped, verified, strided) loads the tensor and copies the box out.

#include <algorithm>
#include <cstring>

#include "api/checkpoint_impl.h"
#include "api/checkpoint_kind.h"
#include "load/plan.h"
#include "util/box.h"

namespace ckpt {
namespace internal {

namespace {

// Reads the box's runs straight into dst where tensor t's bytes lie raw in the model's source:
// false (nothing read) where they do not.
bool read_raw_box(const CheckpointModel& m, size_t t, std::span<const int64_t> begin,
                  std::span<const int64_t> end, std::span<std::byte> dst,
                  const LoadOptions& options) {
  const TensorInfo& info = m.tensors[t];
  const StorageInfo& si = m.storages[info.storage];
  if (si.offset == kNoOffset || si.byteswap || si.meta || !info.is_contiguous()) return false;
  if (options.verify && si.crc32) return false;  // a CRC covers the whole storage
  if (route_of(m, info.storage, options, false) != Route::kRead) return false;
  std::vector<ByteRun> runs = box_runs(info.shape, begin, end, dtype_size(info.dtype));
  std::vector<ReadRequest> reqs;
  reqs.reserve(runs.size());
  uint64_t at = 0;
  for (const ByteRun& r : runs) {
    reqs.push_back({si.offset + info.byte_offset() + r.offset, dst.subspan(at, r.length)});
    at += r.length;
  }
  m.source->read_batch(reqs);
  return true;
}

}  // namespace

void CheckpointKind::read_slice(size_t t, std::span<const int64_t> begin,
                                std::span<const int64_t> end, std::span<std::byte> dst,
                                const LoadOptions& options) const {
  const TensorInfo& info = model().tensors[t];
  if (const auto& p = parts(); !p.empty()) {
    // A set: the part that holds the tensor, under its own name there.
    const Checkpoint& part = p[files_of(t)[0]];
    if (auto local = part.find(info.name)) return part.read_slice(*local, begin, end, dst, options);
  } else if (read_raw_box(model(), t, begin, end, dst, options)) {
    return;
  }
  std::vector<std::byte> all(info.nbytes());
  read_into(t, all, options);
  const std::vector<int64_t> zero(info.shape.size(), 0);
  copy_box(zero, info.shape, all.data(), begin, end, dst.data(), dtype_size(info.dtype));
}

}  // namespace internal

void Checkpoint::read_slice(size_t index, std::span<const int64_t> begin,
                            std::span<const int64_t> end, std::span<std::byte> dst,
                            const LoadOptions& options) const {
  const internal::CheckpointModel& m = impl_->kind->model();
  if (index >= m.tensors.size())
    throw Error(ErrorCode::kNotFound, "no tensor #" + std::to_string(index), m.source->name());
  const TensorInfo& t = m.tensors[index];
  if (begin.size() != t.shape.size() || end.size() != t.shape.size())
    throw Error(ErrorCode::kInvalidArgument,
                "a box of " + std::to_string(begin.size()) + " dimensions for a tensor of " +
                    std::to_string(t.shape.size()),
                m.source->name(), t.name);
  uint64_t numel = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (begin[d] < 0 || begin[d] > end[d] || end[d] > t.shape[d])
      throw Error(ErrorCode::kInvalidArgument,
                  "the box [" + std::to_string(begin[d]) + ", " + std::to_string(end[d]) +
                      ") of dimension " + std::to_string(d) + " is not inside its size " +
                      std::to_string(t.shape[d]),
                  m.source->name(), t.name);
    numel *= static_cast<uint64_t>(end[d] - begin[d]);
  }
  if (dst.size() != numel * dtype_size(t.dtype))
    throw Error(ErrorCode::kInvalidArgument,
                "destination holds " + std::to_string(dst.size()) + " bytes; the box needs " +
                    std::to_string(numel * dtype_size(t.dtype)),
                m.source->name(), t.name);
  if (numel == 0) return;
  if (!options.device.is_cpu())
    throw Error(ErrorCode::kUnsupported, "read_slice() fills host memory", m.source->name());
  impl_->kind->read_slice(index, begin, end, dst, options);
}

}  // namespace ckpt
