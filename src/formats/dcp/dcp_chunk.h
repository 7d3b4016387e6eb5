#pragma once
// A tensor chunk's item of a DCP folder (formats/dcp): a torch.save zip of one tensor, whose
// bytes are one raw run of the data file. What the reader (dcp_reader.cc) needs of it: the
// tensor's dtype and shape, and where its bytes lie in the item.
//
// A folder holds one such item per chunk (400,000 for an optimizer's state): opening each as a
// checkpoint (open_model: a zip reader, the pickle VM, a Value tree, a model) was a third of
// opening the folder. read_chunk_item() reads the item directly when it is laid out as torch and
// ckpt write a chunk, and leaves any other item to open_model, which checks it as before.
//
// Thread-safety: plain functions over their arguments.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/options.h"
#include "ckpt/source.h"
#include "model/checkpoint_model.h"

namespace ckpt::internal {

struct DcpChunkFacts {
  bool one_tensor = false;  // the item's root is one tensor of the model
  std::string root;         // else: the root's text, for the refusal
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  bool raw = false;     // contiguous raw bytes in native order, in the file
  uint64_t offset = 0;  // raw: where its bytes start, from the item's start
  uint64_t nbytes = 0;
};

// The facts of an item opened by open_model.
DcpChunkFacts chunk_facts(const CheckpointModel& item);

// The facts of `item` (a torch.save zip: the chunk's item, whole) read without open_model, or
// nullopt when the item is not exactly of the usual form: a zip that ZipReader opens under
// `options.limits`, its records under one folder, no TorchScript records, data.pkl stored, the
// small records (version, byteorder...) as torch writes them in little-endian order, data.pkl a
// protocol-2 pickle of torch._utils._rebuild_tensor_v2 over one persistent storage (a typed
// storage class, a string key, no view), the tensor contiguous and non-empty with bytes of whole
// bytes per element, its storage a stored record of exactly the storage's size; limits far above
// what such an item needs; not `options.strict`. Whatever it accepts, open_model opens with the
// same facts (and every check it makes passes); everything else (nullopt) goes to open_model,
// which refuses a bad item with its typed errors. Never throws Error.
std::optional<DcpChunkFacts> read_chunk_item(const SourcePtr& item, const OpenOptions& options);

}  // namespace ckpt::internal
