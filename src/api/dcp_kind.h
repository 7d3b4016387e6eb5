#pragma once
// A torch.distributed.checkpoint (DCP) folder as one checkpoint: the opener (api/open_dcp.cc)
// reads `.metadata` (formats/dcp), checks every chunk against the data files and builds the
// layout below; the body (api/kind_dcp.cc) assembles each global tensor from its chunks.
//
// Thread-safety: a DcpLayout is immutable once the opener made it.

#include <cstdint>
#include <string>
#include <vector>

#include "api/checkpoint_kind.h"

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
  std::string fqn;  // names the piece in errors
};

struct DcpLayout {
  std::string dir;                   // the folder, as opened
  std::vector<std::string> paths;    // the data files (Checkpoint::files())
  std::vector<SourcePtr> sources;    // opened, in paths order (pread sources)
  std::vector<std::vector<DcpPiece>> pieces;          // per storage of the model
  std::vector<std::vector<uint32_t>> tensor_files;    // per tensor: files holding its bytes
};

// Whether `path` names a DCP folder: a local folder holding a `.metadata` file, or a URL
// prefix ending in '/'.
bool is_dcp_folder(const std::string& path);

// Opens a DCP folder (is_dcp_folder), or one under a URL prefix ("http(s)://host/dir/",
// "s3://bucket/dir/": its files are read with ranged requests). Throws Error naming the data file and tensor: kNotFound
// for a missing data file, kTruncated for an item past a file's end, kCorrupt for chunks that
// overlap, leave holes or fall outside their tensor, kUnsupported for a storage layout it does
// not read (transforms, non-strided tensors, an item that is not a torch.save of one tensor).
Checkpoint open_dcp(const std::string& dir, const OpenOptions& options);

// The body of an opened folder.
KindPtr dcp_kind(std::shared_ptr<const CheckpointModel> model,
                 std::shared_ptr<const DcpLayout> layout);
// The decoder that assembles storage s from layout.pieces[s] (reads run in parallel when a
// storage has several large pieces).
std::shared_ptr<const StorageDecoder> dcp_decoder(std::shared_ptr<const DcpLayout> layout);

}  // namespace ckpt::internal
