// PageCacheDropper (io/page_cache.h).

#include "io/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "io/local_file.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kWindow = 1ull << 30;      // mapped at a time to read residency
constexpr size_t kMaxRuns = size_t{1} << 20;  // beyond: treat the whole file as cached

uint64_t page_size() {
  static const uint64_t ps = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return ps;
}

// Calls f(first_page, resident) for each page of [first, end) pages of `fd`; false when the
// file cannot be mapped.
template <typename F>
bool each_page(int fd, uint64_t first, uint64_t end, F&& f) {
  const uint64_t ps = page_size();
  std::vector<unsigned char> vec;
  for (uint64_t p = first; p < end;) {
    const uint64_t pages = std::min(end - p, kWindow / ps);
    void* m = ::mmap(nullptr, pages * ps, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(p * ps));
    if (m == MAP_FAILED) return false;
    vec.assign(pages, 0);
    const int rc = ::mincore(m, pages * ps, vec.data());
    ::munmap(m, pages * ps);
    if (rc != 0) return false;
    for (uint64_t i = 0; i < pages; ++i) f(p + i, (vec[i] & 1) != 0);
    p += pages;
  }
  return true;
}

}  // namespace

std::unique_ptr<PageCacheDropper> PageCacheDropper::make(const ByteSource& source) {
  const int fd = local_file_fd(source);
  if (fd < 0) return nullptr;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return nullptr;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::unique_ptr<PageCacheDropper> d(new PageCacheDropper(fd, size));
  auto& runs = d->cached_;
  bool too_many = false;
  const bool ok =
      each_page(fd, 0, (size + page_size() - 1) / page_size(), [&](uint64_t p, bool in) {
        if (!in || too_many) return;
        if (!runs.empty() && runs.back().second == p) {
          runs.back().second = p + 1;
        } else if (runs.size() < kMaxRuns) {
          runs.emplace_back(p, p + 1);
        } else {
          too_many = true;
        }
      });
  if (!ok || too_many) return nullptr;
  return d;
}

void PageCacheDropper::consumed(uint64_t offset, uint64_t n) const noexcept {
  if (n == 0 || offset >= size_) return;
  const uint64_t ps = page_size();
  uint64_t p = offset / ps;
  const uint64_t end = (std::min(offset + n, size_) + ps - 1) / ps;
  auto drop = [&](uint64_t a, uint64_t b) {
    if (a < b)
      ::posix_fadvise(fd_, static_cast<off_t>(a * ps), static_cast<off_t>((b - a) * ps),
                      POSIX_FADV_DONTNEED);
  };
  // The first cached run that ends after p.
  auto it = std::upper_bound(cached_.begin(), cached_.end(), p,
                             [](uint64_t v, const auto& r) { return v < r.second; });
  for (; p < end && it != cached_.end() && it->first < end; ++it) {
    drop(p, std::max(p, it->first));
    p = std::max(p, it->second);
  }
  drop(p, end);
}

void PageCacheDropper::consumed_all(
    std::vector<std::pair<uint64_t, uint64_t>> ranges) const noexcept {
  std::sort(ranges.begin(), ranges.end());
  uint64_t from = 0, to = 0;
  for (const auto& [off, len] : ranges) {
    if (len == 0) continue;
    if (to > from && off <= to + (1 << 20)) {
      to = std::max(to, off + len);
      continue;
    }
    if (to > from) consumed(from, to - from);
    from = off, to = off + len;
  }
  if (to > from) consumed(from, to - from);
}

uint64_t PageCacheDropper::cached_pages() const noexcept {
  uint64_t n = 0;
  for (const auto& r : cached_) n += r.second - r.first;
  return n;
}

uint64_t resident_pages(int fd, uint64_t offset, uint64_t n) {
  const uint64_t ps = page_size();
  uint64_t count = 0;
  if (n == 0) return 0;
  each_page(fd, offset / ps, (offset + n + ps - 1) / ps, [&](uint64_t, bool in) { count += in; });
  return count;
}

}  // namespace ckpt::internal
