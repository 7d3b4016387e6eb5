#pragma once
// Turns a torch data.pkl into a Value tree, a storage table and a tensor table, through the
// restricted pickle VM: the allow-list mirrors torch's weights_only unpickler
// (docs/formats/torch.md "torch.save zip", **Pickle**) and the rebuild functions (**Rebuild
// functions** there) are interpreted, never run.

#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/options.h"
#include "ckpt/tensor.h"
#include "ckpt/value.h"
#include "model/checkpoint_model.h"

namespace ckpt::internal {

// A storage named by a persistent id: ('storage', <storage class>, key, location, numel[, view]).
struct PidStorage {
  std::string key;
  DType dtype = DType::kUInt8;
  uint64_t numel = 0;  // elements of dtype (bytes for UntypedStorage)
  std::string location;
};

struct TorchPickle {
  ValuePtr root;
  // Storages whose bytes the pickle itself holds (numpy arrays): storage index -> bytes. Their
  // StorageInfo::offset is kNoOffset; inline_decoder() serves them.
  std::unordered_map<size_t, std::string> inline_bytes;
  std::vector<StorageInfo> storages;  // key, dtype, nbytes, device filled; offsets left to caller
  std::vector<TensorInfo> tensors;    // names filled (dotted paths), `storage` indexes storages
};

struct TorchUnpickleOptions {
  std::string source, record;
  uint64_t base_offset = 0;
  Limits limits;
  uint64_t file_size = 0;    // UnpickleOptions::file_size
  bool torchscript = false;  // also allow __torch__.* classes and torch.jit._pickle helpers
  // Refuse classes outside the allow-list (torch's weights_only) rather than keeping them as
  // opaque objects (OpenOptions::strict).
  bool strict = false;
};

// A decoder that serves `inline_bytes` storages and hands every other one to `inner` (may be
// null when there is none).
std::shared_ptr<const StorageDecoder> inline_decoder(std::shared_ptr<const StorageDecoder> inner,
                                                     std::unordered_map<size_t, std::string> bytes);

// Classes outside the allow-list are kept as opaque objects (Value::foreign), or with `strict`
// refused. Throws Error (kUnsupported for a refused global, naming it; kCorrupt for a
// malformed persistent id or rebuild call).
TorchPickle unpickle_torch(std::span<const std::byte> data, const TorchUnpickleOptions& options,
                           size_t* consumed = nullptr);

// Assigns each tensor the dotted path where the tree first reaches it (depth-first, insertion
// order); tensors the tree does not reach keep their name or get "<unnamed>.N".
void name_tensors(const ValuePtr& root, std::vector<TensorInfo>& tensors, uint32_t max_depth);

}  // namespace ckpt::internal
