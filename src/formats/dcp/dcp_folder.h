#pragma once
// The metadata of a folder that torch.distributed.checkpoint wrote, wherever its writer put it
// (docs/formats/dcp.md, "torch.distributed.checkpoint folders"):
//   kMetadata   `.metadata`: dcp.save with rank coordination (the usual folder, and a URL prefix)
//   kRankLocal  `__<rank>.metadata`, one per rank, each describing that rank's own items:
//               dcp.save(..., use_collectives=False). They are merged into one: a tensor's chunks
//               from every rank, and of an item two ranks both wrote (a replicated tensor, a
//               non-tensor value) the lowest rank's.
//   kHfShards   no pickle: HuggingFaceStorageWriter(save_distributed=True) writes one
//               `shard-<rank>-model-<i>-of-<n>.safetensors` per rank and file; the header's
//               `__metadata__["DCP_SHARDING_INFO"]` gives each tensor's `saved_offsets` in the
//               global tensor, whose shape is the largest offset plus extent per dimension (as
//               torch's HuggingFaceStorageReader takes it). Every item is then the whole file,
//               a safetensors blob (dcp_reader.cc finds each tensor in it by name).
// A local kMetadata folder that Megatron-core's dist_checkpointing saved with its `torch_dist`
// backend (megatron/core/dist_checkpointing/serialization.py, save) also holds `metadata.json`
// (a JSON object with a string "sharded_backend": "torch_dist"; another metadata.json is not
// Megatron's and is left alone) and `common.pt`, torch.save of the state that is not
// sharded: common.pt joins the metadata as one more bytes item, the whole file, under the key
// `common` (what load_common_state_dict returns), and metadata.json's backends become properties.
//
// Thread-safety: plain functions over their arguments.

#include <map>
#include <string>

#include "ckpt/options.h"
#include "ckpt/source.h"
#include "formats/dcp/dcp_metadata.h"

namespace ckpt::internal {

enum class DcpFolderKind { kNone, kMetadata, kRankLocal, kHfShards };

// Which kind a local folder is (a URL prefix is kMetadata: its files cannot be listed).
DcpFolderKind dcp_folder_kind(const std::string& dir);

struct DcpFolderMetadata {
  DcpMetadata md;
  SourcePtr source;  // the (first) metadata file, or the first shard: the model's source
  DcpFolderKind kind = DcpFolderKind::kNone;
  std::map<std::string, std::string> properties;  // the checkpoint's (Megatron's backends)
};

// Reads the folder's metadata. Throws Error: kNotFound when the folder is none of the kinds, a
// rank's `__<rank>.metadata` is missing between others or a Megatron folder's common.pt is
// missing, kCorrupt for ranks that disagree on a tensor's dtype or shape or shards without
// DCP_SHARDING_INFO that disagree, kUnsupported for a `.metadata` with Megatron's mcore_data
// (tensors saved reshaped: DcpMetadata::mcore_keys) or a Megatron folder with a sharded key
// `common` or `common.*` (common.pt's place, its tensors' names), kLimitExceeded for a metadata
// file past Limits::max_metadata_bytes, and what read_dcp_metadata and the safetensors reader
// throw.
DcpFolderMetadata read_dcp_folder(const std::string& dir, const OpenOptions& options);

}  // namespace ckpt::internal
