#pragma once
// Whether a source is one of the library's own local files (open_file_source,
// open_mmap_source): reading a range of it twice costs a page-cache copy, not a second transfer.
// Remote sources, buffers and a caller's own sources are not.

#include "ckpt/source.h"

namespace ckpt::internal {

bool is_local_file(const ByteSource& source) noexcept;
// Its open file descriptor (valid while the source lives), or -1 for any other source.
int local_file_fd(const ByteSource& source) noexcept;

}  // namespace ckpt::internal
