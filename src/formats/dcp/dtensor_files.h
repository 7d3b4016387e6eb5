#pragma once
// A folder of per-rank torch.save files of DTensor state dicts, as verl's FSDP checkpoint manager
// writes them: `model_world_size_<N>_rank_<R>.pt` for R in 0..N-1, each torch.save of
// model.state_dict() where every value is a DTensor (torch.distributed.tensor) on a 1-D mesh of
// the N ranks (FSDP2: Shard(0); Replicate() too) or a plain tensor every rank holds. Each file's
// DTensor is its rank's shard (torch_unpickle.cc keeps the DTensorSpec beside it); this assembles
// them into one checkpoint of whole tensors, with the DCP reader's decoder (dcp_layout.h). The
// global shape is the spec's tensor_meta; the rank's box along a Shard(d) placement is torch's
// (a ceil(size / N) chunk per coordinate, the last ones shorter or empty), its coordinate the
// mesh's `_coordinate_on_dim` (else R). docs/formats/dcp.md,
// "torch.distributed.checkpoint folders", **Per-rank DTensor files**.
//
// Thread-safety: a plain function over its arguments.

#include <memory>
#include <string>

#include "model/checkpoint_model.h"

namespace ckpt::internal {

// Whether the local folder holds model_world_size_<N>_rank_0.pt files.
bool has_dtensor_files(const std::string& dir);

// Opens the folder (finalized). Throws Error naming the file and tensor: kNotFound for a missing
// rank's file, kCorrupt for ranks that disagree (names, dtypes, global shapes) or a shard whose
// shape is not its box, chunks that do not tile their tensor, kUnsupported for a placement other
// than Shard/Replicate on a 1-D mesh, a shard that is not contiguous raw bytes, and what opening
// each torch.save file throws.
std::shared_ptr<CheckpointModel> open_dtensor_files(const std::string& dir,
                                                    const OpenOptions& options);

}  // namespace ckpt::internal
