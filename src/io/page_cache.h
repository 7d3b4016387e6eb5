#pragma once
// LoadOptions::drop_cache: a load's file pages leave the page cache once their bytes are
// consumed, but only the pages the load brought in. The file's residency is recorded first
// (mincore over a read-only mapping, window by window); consumed() then drops with
// posix_fadvise(POSIX_FADV_DONTNEED) only the parts of a range that were not cached when the
// load began, so another process's warm cache of the same file is left alone.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ckpt/source.h"

namespace ckpt::internal {

class PageCacheDropper {
 public:
  // Null when `source` is not a local file (local_file_fd), or its residency cannot be read.
  static std::unique_ptr<PageCacheDropper> make(const ByteSource& source);
  // Drops the pages of [offset, offset + n) that were not resident at make() (whole pages:
  // a page shared with bytes not yet read is dropped too; reading it again costs one page).
  // Thread-safe; never throws.
  void consumed(uint64_t offset, uint64_t n) const noexcept;
  // The last pass of a load over every range it read (offset, length; any order): the ranges
  // are merged where less than 1 MiB apart and each merged span is dropped as above. The page
  // cache keeps large folios (several pages, up to 2 MiB and more under large read-ahead) that a
  // drop of part of one leaves in place: only spans that cover them drop them.
  void consumed_all(std::vector<std::pair<uint64_t, uint64_t>> ranges) const noexcept;
  // Pages resident at make() (for tests and reports).
  uint64_t cached_pages() const noexcept;

 private:
  PageCacheDropper(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_;
  uint64_t size_;
  std::vector<std::pair<uint64_t, uint64_t>> cached_;  // resident page runs [first, end), sorted
};

// Pages of [offset, offset + n) of the open file `fd` resident in the page cache now (mincore).
// Returns 0 where the file cannot be mapped.
uint64_t resident_pages(int fd, uint64_t offset, uint64_t n);

}  // namespace ckpt::internal
