#pragma once
// What the DCP reader (dcp_reader.cc) checks of `.metadata` against itself, each in O(n log n):
// that a tensor's chunks tile it, and that no two items share bytes of a data file.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/error.h"
#include "formats/dcp/dcp_metadata.h"

namespace ckpt::internal {

// "[1, 2, 3]": a shape or offsets, for messages.
std::string dims(const std::vector<int64_t>& v);

// dir/name (one slash).
std::string join(const std::string& dir, const std::string& name);

// Throws the error for a fault of chunk `chunk` of the tensor (null: of the tensor as a whole).
using ChunkFail = std::function<void(ErrorCode, const std::string& what, const DcpChunk* chunk)>;

// Checks that e's chunks tile the tensor: each has the tensor's dimensions and lies inside it,
// none overlaps another, every element is covered (else `fail` with kCorrupt). Exact duplicates
// (one storage item, as torch keys items by offset) are dropped, the first kept, order kept.
// O(n log n) for chunks that split up to two dimensions of the tensor (FSDP rows, tensor-
// parallel columns, both), O(n * chunks live across a split) beyond.
void check_tiling(DcpEntry& e, const ChunkFail& fail);

// A storage item's bytes: `length` bytes at `offset` of data file `file`.
struct DcpItemRange {
  uint32_t file = 0;
  uint64_t offset = 0, length = 0;
  size_t item = 0;  // index into DcpMetadata::storage
};

// Two items (indices into `ranges`' items, the earlier in the file first) whose bytes overlap,
// or nothing. Empty items share nothing.
std::optional<std::pair<size_t, size_t>> shared_bytes(std::vector<DcpItemRange> ranges);

}  // namespace ckpt::internal
