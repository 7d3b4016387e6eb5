// copy_box and box_runs (util/box.h).

#include "util/box.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ckpt::internal {
namespace {

// The last dimension the box does not span whole (-1 when it spans all of them).
int last_partial(std::span<const int64_t> shape, std::span<const int64_t> begin,
                 std::span<const int64_t> end) {
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d)
    if (begin[d] != 0 || end[d] != shape[d]) return d;
  return -1;
}

bool empty_box(std::span<const int64_t> begin, std::span<const int64_t> end) {
  for (size_t d = 0; d < begin.size(); ++d)
    if (end[d] <= begin[d]) return true;
  return false;
}

}  // namespace

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

uint64_t box_run_count(std::span<const int64_t> shape, std::span<const int64_t> begin,
                       std::span<const int64_t> end) {
  if (empty_box(begin, end)) return 0;
  const int k = last_partial(shape, begin, end);
  uint64_t n = 1;
  for (int d = 0; d < k; ++d) n *= static_cast<uint64_t>(end[d] - begin[d]);
  return n;
}

std::vector<ByteRun> box_runs(std::span<const int64_t> shape, std::span<const int64_t> begin,
                              std::span<const int64_t> end, uint64_t elsize) {
  std::vector<ByteRun> runs;
  if (empty_box(begin, end)) return runs;
  const size_t n = shape.size();
  const int k = last_partial(shape, begin, end);
  // stride[d]: bytes between consecutive indices of dimension d.
  std::vector<uint64_t> stride(n + 1, elsize);
  for (size_t d = n; d-- > 0;) stride[d] = d + 1 < n ? stride[d + 1] * shape[d + 1] : elsize;
  if (k < 0) {
    uint64_t all = n ? stride[0] * static_cast<uint64_t>(shape[0]) : elsize;
    runs.push_back({0, all});
    return runs;
  }
  const uint64_t len = stride[k] * static_cast<uint64_t>(end[k] - begin[k]);
  std::vector<int64_t> i(begin.begin(), begin.begin() + k);
  runs.reserve(box_run_count(shape, begin, end));
  for (;;) {
    uint64_t off = stride[k] * static_cast<uint64_t>(begin[k]);
    for (int d = 0; d < k; ++d) off += stride[d] * static_cast<uint64_t>(i[d]);
    runs.push_back({off, len});
    int d = k - 1;
    for (; d >= 0; --d) {
      if (++i[d] < end[d]) break;
      i[d] = begin[d];
    }
    if (d < 0) return runs;
  }
}

}  // namespace ckpt::internal
