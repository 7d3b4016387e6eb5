#include "util/arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ckpt/error.h"

namespace ckpt::internal {

std::shared_ptr<std::byte> allocate_arena(size_t size) {
  constexpr size_t kHuge = 2 << 20;
  if (size < kHuge) {
    void* p = ::operator new(std::max<size_t>(size, 1), std::align_val_t(64), std::nothrow);
    if (!p) throw Error(ErrorCode::kIo, "out of memory allocating " + std::to_string(size) + " bytes");
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) {
      ::operator delete(q, std::align_val_t(64));
    });
  }
  // Over-map by one huge page so the start can be aligned to it (THP needs aligned 2 MiB runs).
  size_t len = (size + kHuge - 1) / kHuge * kHuge + kHuge;
  void* raw = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    throw Error(ErrorCode::kIo, std::string("mmap of ") + std::to_string(size) +
                                    " bytes failed: " + std::strerror(errno));
  auto base = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  ::madvise(reinterpret_cast<void*>(aligned), len - (aligned - base), MADV_HUGEPAGE);
  return std::shared_ptr<std::byte>(reinterpret_cast<std::byte*>(aligned),
                                    [raw, len](std::byte*) { ::munmap(raw, len); });
}

void byteswap_elements(std::byte* data, size_t nbytes, size_t elem_size, bool complex) {
  size_t unit = complex ? elem_size / 2 : elem_size;
  if (unit <= 1) return;
  for (size_t off = 0; off + unit <= nbytes; off += unit) std::reverse(data + off, data + off + unit);
}

int default_threads() {
  // Computed once: hardware_concurrency() reads /sys on every call (glibc get_nprocs), which
  // costs ~5 us, and a load plan asks for it per storage() call.
  static const int n =
      static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  return n;
}

}  // namespace ckpt::internal
