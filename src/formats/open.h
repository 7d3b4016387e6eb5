#pragma once
// The format readers' interface: each opener reads metadata only and returns the neutral
// description (model/checkpoint_model.h) that the load layer serves from. open_model() detects
// the format from the first bytes and runs CheckpointModel::finalize().
//
// A new format goes here: a reader under src/formats/<name>/ with an opener of this shape, and a
// line in open_model()'s detection (src/formats/open.cc).

#include <memory>

#include "model/checkpoint_model.h"

namespace ckpt::internal {

// Detects the format, opens and validates (finalize): Checkpoint::open's work. Throws Error
// (kUnsupported for an unknown format, and whatever the format's opener throws), with the
// source's name set.
std::shared_ptr<CheckpointModel> open_model(SourcePtr source, const OpenOptions& options,
                                            const OpenHooks& hooks = {});

// Format openers. Each reads metadata only; none calls finalize().
std::shared_ptr<CheckpointModel> open_torch_zip(SourcePtr source, const OpenOptions& options,
                                                const OpenHooks& hooks = {});
std::shared_ptr<CheckpointModel> open_torch_legacy(SourcePtr source, const OpenOptions& options);
std::shared_ptr<CheckpointModel> open_safetensors(SourcePtr source, const OpenOptions& options);
std::shared_ptr<CheckpointModel> open_tensorizer(SourcePtr source, const OpenOptions& options);
std::shared_ptr<CheckpointModel> open_onnx(SourcePtr source, const OpenOptions& options);

// A torch.distributed.checkpoint folder (a local folder holding `.metadata`, or a URL prefix
// "http(s)://host/dir/", "s3://bucket/dir/" whose files are read with ranged requests), after
// finalize(): one model whose storages the decoder assembles from the folder's data files
// (CheckpointModel::files). Throws Error naming the data file and tensor: kNotFound for a missing
// data file, kTruncated for an item past a file's end, kCorrupt for chunks that overlap, leave
// holes or fall outside their tensor, or items that share bytes, kUnsupported for a storage
// layout it does not read (transforms, non-strided tensors, an item that is not a torch.save of
// one tensor), kLimitExceeded for a `.metadata` past Limits::max_metadata_bytes.
std::shared_ptr<CheckpointModel> open_dcp(const std::string& dir, const OpenOptions& options);

}  // namespace ckpt::internal
