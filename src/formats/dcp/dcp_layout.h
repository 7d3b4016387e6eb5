#pragma once
// A torch.distributed.checkpoint (DCP) folder as the reader lays it out (formats/dcp): where
// each storage's bytes lie in the folder's data files. The reader (dcp_reader.cc) reads
// `.metadata`, checks every chunk against the data files and builds this; the decoder
// (dcp_decoder.cc) assembles each global tensor from its chunks.
//
// Thread-safety: a DcpLayout is immutable once the reader made it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint_model.h"

namespace ckpt::internal {

// One run of stored bytes that lands in a storage of the model: `nbytes` raw bytes at
// `file_offset` in data file `file`. For a chunk of a global tensor, `sizes`/`offsets` place the
// chunk's box (row-major, contiguous in the file) inside the storage's tensor of shape `shape`;
// empty `shape`, `sizes` and `offsets` with `whole` set: the bytes are the storage from
// `dst_offset` on (a tensor inside a bytes item).
struct DcpPiece {
  uint32_t file = 0;
  uint64_t file_offset = 0;
  uint64_t nbytes = 0;
  bool whole = false;
  uint64_t dst_offset = 0;
  std::vector<int64_t> shape, offsets, sizes;
};

struct DcpLayout {
  std::string dir;                            // the folder, as opened
  std::vector<std::string> paths;             // the data files (the model's files)
  std::vector<SourcePtr> sources;             // in paths order (pread sources)
  std::vector<std::vector<DcpPiece>> pieces;  // per storage of the model
};

// The decoder that assembles storage s from layout.pieces[s] (reads run in parallel when a
// storage has several large pieces), and reads a box of a tensor from only the chunks that meet
// it (StorageDecoder::read_box).
std::shared_ptr<const StorageDecoder> dcp_decoder(std::shared_ptr<const DcpLayout> layout);

}  // namespace ckpt::internal
