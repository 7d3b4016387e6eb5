#pragma once
// A window of another source: bytes [offset, offset + size) of `base`, read as a source of their
// own (offset 0 is base's `offset`). For containers stored inside a larger file, such as the
// torch.save blobs inside a torch.distributed.checkpoint data file.
//
// Thread-safety: as the base source (every method is const and forwards to it).

#include <cstdint>
#include <string>

#include "ckpt/source.h"

namespace ckpt::internal {

// Throws Error{kTruncated} naming base when the window passes its end. `name` names the window
// in errors.
SourcePtr window_source(SourcePtr base, uint64_t offset, uint64_t size, std::string name);

}  // namespace ckpt::internal
