#pragma once
// Boxes of row-major tensors: the copy that read_slice and the chunked formats share, and the byte
// runs of a box (where, in the tensor's contiguous bytes, the elements of [begin, end) lie, as
// the fewest runs: Checkpoint::read_slice of a raw storage, the rank plan's byte ranges).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ckpt::internal {
// Copies the box [begin, end) of a row-major tensor of `shape` whose bytes are `src` (a part of
// it: the box [src_begin, src_begin + src_sizes)) into `dst`, the row-major box [dst_begin,
// dst_end) of the same tensor: the elements the two boxes share. elsize: bytes per element.
void copy_box(std::span<const int64_t> src_begin, std::span<const int64_t> src_sizes,
              const std::byte* src, std::span<const int64_t> dst_begin,
              std::span<const int64_t> dst_end, std::byte* dst, size_t elsize);

struct ByteRun {
  uint64_t offset = 0;  // from the tensor's first byte
  uint64_t length = 0;
};

// The runs of the box [begin, end) (inside `shape`, same rank) in increasing offset order, each
// a row-major piece of the box, so that the runs one after another are the box's bytes: one
// run when the box spans every dimension after its first non-trivial one (rows along dim 0),
// else one run per index of the dimensions before the last one it does not span. Empty for an
// empty box; one run of elsize bytes for a 0-d tensor.
std::vector<ByteRun> box_runs(std::span<const int64_t> shape, std::span<const int64_t> begin,
                              std::span<const int64_t> end, uint64_t elsize);

// How many runs box_runs returns, without making them.
uint64_t box_run_count(std::span<const int64_t> shape, std::span<const int64_t> begin,
                       std::span<const int64_t> end);

}  // namespace ckpt::internal
