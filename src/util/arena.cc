#include "util/arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "ckpt/error.h"
#include "ckpt/memory.h"

namespace ckpt::internal {

namespace {
// The kept arena (ckpt/memory.h): at most one, guarded by `mu`.
struct Kept {
  std::mutex mu;
  void* raw = nullptr;
  size_t len = 0;
  size_t min = 64 << 20;
  std::atomic<uint64_t> max{0};
};
Kept& kept() {
  static Kept* k = [] {
    auto* x = new Kept;  // never destroyed: arenas may be freed during exit
    uint64_t limit = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                     static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) / 2;
    if (const char* e = std::getenv("CKPT_KEEP_ARENA_MB"); e && *e)
      limit = std::strtoull(e, nullptr, 10) << 20;
    x->max = limit;
    return x;
  }();
  return *k;
}
// 2 MiB blocks the kernel's buddy allocator has free now (/proc/buddyinfo, orders 9 and up),
// or SIZE_MAX where that cannot be read.
size_t free_huge_blocks() {
  FILE* f = std::fopen("/proc/buddyinfo", "re");
  if (!f) return SIZE_MAX;
  size_t blocks = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    const char* p = std::strstr(line, "zone");
    if (!p) continue;
    p += 4;
    while (*p == ' ') ++p;
    while (*p && *p != ' ') ++p;  // the zone's name
    char* end = nullptr;
    for (int order = 0;; ++order, p = end) {
      const unsigned long long n = std::strtoull(p, &end, 10);
      if (end == p) break;
      if (order >= 9) blocks += static_cast<size_t>(n) << (order - 9);
    }
  }
  std::fclose(f);
  return blocks;
}

}  // namespace

std::shared_ptr<std::byte> zero_pages(size_t size) {
  const size_t span = std::max<size_t>(size, 1);
  void* p = ::mmap(nullptr, span, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error(ErrorCode::kIo,
                "cannot map " + std::to_string(size) + " bytes of zeros: " + std::strerror(errno));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                    [span](std::byte* q) { ::munmap(q, span); });
}

std::shared_ptr<std::byte> allocate_arena(size_t size) {
  constexpr size_t kHuge = 2 << 20;
  if (size < kHuge) {
    void* p = ::operator new(std::max<size_t>(size, 1), std::align_val_t(64), std::nothrow);
    if (!p)
      throw Error(ErrorCode::kIo, "out of memory allocating " + std::to_string(size) + " bytes");
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) {
      ::operator delete(q, std::align_val_t(64));
    });
  }
  // Over-map by one huge page so the start can be aligned to it (THP needs aligned 2 MiB runs).
  size_t len = (size + kHuge - 1) / kHuge * kHuge + kHuge;
  void* raw = nullptr;
  void* stale = nullptr;
  size_t stale_len = 0;
  {
    Kept& k = kept();
    std::lock_guard<std::mutex> lock(k.mu);
    if (k.raw && k.len >= len && k.len - len <= k.len / 4) {
      raw = std::exchange(k.raw, nullptr);
      len = std::exchange(k.len, 0);
    } else if (k.raw) {
      stale = std::exchange(k.raw, nullptr);
      stale_len = std::exchange(k.len, 0);
    }
  }
  if (stale) ::munmap(stale, stale_len);  // never hold a kept arena beside a new one
  // Huge pages for fresh memory only where the kernel has them free: where it must compact
  // memory to make them (THP defrag "madvise": synchronously, in the faulting thread), a 1 GiB
  // arena's first touch costs ~2x the system time of plain pages (docs/benchmarks.md).
  bool huge = raw != nullptr || free_huge_blocks() >= len / kHuge;
  if (!raw) {
    raw = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      // Out of memory (or of address space) is std::bad_alloc, which the checkpoint's load
      // turns into Error{kLimitExceeded} naming the file.
      if (errno == ENOMEM) throw std::bad_alloc();
      throw Error(ErrorCode::kIo, std::string("mmap of ") + std::to_string(size) +
                                      " bytes failed: " + std::strerror(errno));
    }
  }
  auto base = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  if (huge) ::madvise(reinterpret_cast<void*>(aligned), len - (aligned - base), MADV_HUGEPAGE);
  return std::shared_ptr<std::byte>(reinterpret_cast<std::byte*>(aligned), [raw, len](std::byte*) {
    Kept& k = kept();
    // Kept only if the kernel takes lazily freed pages (MADV_FREE, Linux 4.5) and the slot is
    // free; else unmapped as before.
    if (len >= k.min && len <= k.max.load(std::memory_order_relaxed) &&
        ::madvise(raw, len, MADV_FREE) == 0) {
      std::lock_guard<std::mutex> lock(k.mu);
      if (!k.raw) {
        k.raw = raw;
        k.len = len;
        return;
      }
    }
    ::munmap(raw, len);
  });
}

void byteswap_elements(std::byte* data, size_t nbytes, size_t elem_size, bool complex) {
  size_t unit = complex ? elem_size / 2 : elem_size;
  if (unit <= 1) return;
  for (size_t off = 0; off + unit <= nbytes; off += unit)
    std::reverse(data + off, data + off + unit);
}

int default_threads() {
  // Computed once: hardware_concurrency() reads /sys on every call (glibc get_nprocs), which
  // costs ~5 us, and a load plan asks for it per storage() call.
  // Every core: on a 16-core machine 16 readers load 1.6x faster from the page cache than 8
  // (docs/benchmarks.md). Capped where more threads only add contention.
  static const int n =
      static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 64));
  return n;
}

}  // namespace ckpt::internal

namespace ckpt {

void set_kept_memory_limit(uint64_t max_bytes) {
  internal::kept().max = max_bytes;
  if (max_bytes == 0) release_kept_memory();
}

uint64_t kept_memory_limit() { return internal::kept().max; }

uint64_t release_kept_memory() {
  internal::Kept& k = internal::kept();
  void* raw;
  size_t len;
  {
    std::lock_guard<std::mutex> lock(k.mu);
    raw = std::exchange(k.raw, nullptr);
    len = std::exchange(k.len, 0);
  }
  if (raw) ::munmap(raw, len);
  return raw ? len : 0;
}

uint64_t kept_memory() {
  internal::Kept& k = internal::kept();
  std::lock_guard<std::mutex> lock(k.mu);
  return k.raw ? k.len : 0;
}

}  // namespace ckpt
