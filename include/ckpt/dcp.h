#pragma once
// Writing torch.distributed.checkpoint (DCP) folders: what torch's `dcp.save` with its
// FileSystemWriter writes, which `torch.distributed.checkpoint.load` (and
// `dcp_to_torch_save`) read back into a state dict of the same structure. The layout, byte by
// byte, and how the tensors are split over several files: docs/formats/dcp.md,
// "torch.distributed.checkpoint folders (DCP)", **Writing**.
//
// Thread-safety: save_dcp may run on several threads at once for different folders; it reads
// the tensors' bytes while writing, so those must not change meanwhile.

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/tensor.h"
#include "ckpt/value.h"

namespace ckpt {

// The options of writing a DCP folder: save_dcp takes them, and convert() as its target
// (ConvertTarget, include/ckpt/convert.h), which writes the whole object tree (non-tensor values
// as bytes items; tied and shared tensors once per key) into a folder at its path only (not a
// sink, nor a URL), created whole or not at all.
struct DcpSaveOptions {
  // The number of data files "__<rank>_0.distcp", rank 0..files-1, as that many ranks would
  // write them: every tensor of one dimension or more is cut along its first dimension the way
  // DTensor's Shard(0) cuts it (ceil(rows / files) rows per rank, the last ranks shorter or
  // without a chunk); 0-d and empty tensors go whole to the file holding the fewest bytes so
  // far; the non-tensor values go round-robin. 1 (the default): one file, one chunk per tensor.
  // 0 or more than 4096: Error{kInvalidArgument}.
  uint32_t files = 1;
  // On commit: flush the files and the folder to disk (FolderSinkOptions::fsync). convert():
  // ConvertOptions::fsync.
  bool fsync = true;
};

// Writes `root` (a dict: the state dict; null: a dict of `tensors` by name) as a DCP folder at
// `dir`, created whole or not at all (create_folder_sink: an existing empty folder is replaced,
// a non-empty one is refused with Error{kInvalidArgument}). `root`'s kTensor nodes index into
// `tensors`. The tree is flattened as DCP's default planner flattens it: dict keys (strings,
// ints, bools, None, as str() prints them) and the positions in lists that hold tensors or dicts
// joined by "." into keys; each tensor there is a tensor item (its bytes contiguous, a view
// written as the elements it shows), any other value (a number, a string, a tuple, a list
// without tensors or dicts, an object) a bytes item: the torch.save of that value. Empty dicts
// are not stored (DCP stores none) and an OrderedDict's _metadata is dropped.
//
// Throws Error: kInvalidArgument (a root that is not a dict, two paths that flatten to one key,
// a cycle in the tree, bad options, the folder exists and is not empty), kUnsupported (a
// quantized, meta or sub-byte tensor, a tensor on a device, a dict key that is not a string, an
// int, a bool or None), kLimitExceeded (a tree nested deeper than Limits{}.max_pickle_depth),
// kIo, and what save_torch throws for a value it cannot pickle. On failure nothing is left at
// `dir`.
void save_dcp(const std::string& dir, const ConstValuePtr& root, const std::vector<Tensor>& tensors,
              const DcpSaveOptions& options = {});

}  // namespace ckpt
