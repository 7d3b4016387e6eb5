#pragma once
// Boxes of row-major tensors: the copy read_slice and the chunked formats share.

#include <cstddef>
#include <cstdint>
#include <span>

namespace ckpt::internal {

// Copies the box [begin, end) of a row-major tensor of `shape` whose bytes are `src` (a part of
// it: the box [src_begin, src_begin + src_sizes)) into `dst`, the row-major box [dst_begin,
// dst_end) of the same tensor: the elements the two boxes share. elsize: bytes per element.
void copy_box(std::span<const int64_t> src_begin, std::span<const int64_t> src_sizes,
              const std::byte* src, std::span<const int64_t> dst_begin,
              std::span<const int64_t> dst_end, std::byte* dst, size_t elsize);

}  // namespace ckpt::internal
