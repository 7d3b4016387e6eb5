// copy_box (util/box.h).

#include "util/box.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ckpt::internal {

void copy_box(std::span<const int64_t> src_begin, std::span<const int64_t> src_sizes,
              const std::byte* src, std::span<const int64_t> dst_begin,
              std::span<const int64_t> dst_end, std::byte* dst, size_t elsize) {
  const size_t n = src_begin.size();
  if (n == 0) {
    std::memcpy(dst, src, elsize);
    return;
  }
  std::vector<int64_t> lo(n), hi(n);
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(src_begin[d], dst_begin[d]);
    hi[d] = std::min(src_begin[d] + src_sizes[d], dst_end[d]);
    if (lo[d] >= hi[d]) return;  // the boxes do not meet
  }
  std::vector<uint64_t> ss(n, 1), ds(n, 1);  // strides in elements
  for (size_t d = n - 1; d-- > 0;) {
    ss[d] = ss[d + 1] * static_cast<uint64_t>(src_sizes[d + 1]);
    ds[d] = ds[d + 1] * static_cast<uint64_t>(dst_end[d + 1] - dst_begin[d + 1]);
  }
  const size_t run = static_cast<size_t>(hi[n - 1] - lo[n - 1]) * elsize;
  std::vector<int64_t> i(lo);
  for (;;) {
    uint64_t so = 0, dof = 0;
    for (size_t d = 0; d < n; ++d) {
      so += static_cast<uint64_t>(i[d] - src_begin[d]) * ss[d];
      dof += static_cast<uint64_t>(i[d] - dst_begin[d]) * ds[d];
    }
    std::memcpy(dst + dof * elsize, src + so * elsize, run);
    size_t d = n - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++i[d] < hi[d]) break;
      i[d] = lo[d];
    }
  }
}

}  // namespace ckpt::internal
