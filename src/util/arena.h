#pragma once
// Large destination buffers backed by huge pages where the kernel allows (madvise MADV_HUGEPAGE):
// on this class of machine first-touch faults of 4 KiB pages dominate load time.

#include <cstddef>
#include <memory>

namespace ckpt::internal {

// An uninitialised buffer of `size` bytes, 2 MiB-aligned when large, asking for huge pages when
// the kernel has enough free 2 MiB blocks for it (/proc/buddyinfo; never when it would have to
// compact memory first). Pages are not touched here: the readers fault them in in parallel as
// they write. Throws Error{kIo} when out of memory.
std::shared_ptr<std::byte> allocate_arena(size_t size);

// `size` zero bytes that cost no memory: a private read-only anonymous mapping (every page the
// kernel's shared zero page), for meta storages. Writes fault. Throws Error{kIo} when the address
// space is exhausted.
std::shared_ptr<std::byte> zero_pages(size_t size);

// Swaps each element of `elem_size` bytes (2, 4, 8, 16: complex types swap each half).
void byteswap_elements(std::byte* data, size_t nbytes, size_t elem_size, bool complex);

// Threads to use for parallel reads/copies on this machine when the caller says 0.
int default_threads();

}  // namespace ckpt::internal
