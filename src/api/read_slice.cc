// Checkpoint::read_slice: a box of a tensor, and the default of CheckpointKind::read_slice (load
// the tensor, copy the box out with copy_box, util/box.h).

#include "api/checkpoint_impl.h"
#include "api/checkpoint_kind.h"
#include "util/box.h"

namespace ckpt {
namespace internal {

void CheckpointKind::read_slice(size_t t, std::span<const int64_t> begin,
                                std::span<const int64_t> end, std::span<std::byte> dst,
                                const LoadOptions& options) const {
  const TensorInfo& info = model().tensors[t];
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
