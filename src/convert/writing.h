#pragma once
// The steps of convert(): read -> flatten -> writer -> commit (docs/design/writers.md).
// make_target picks the writer for ConvertOptions::target and checks the options against its
// capabilities; flat_state / tree_content build what it writes, refusing what it cannot hold;
// the caller commits. Each rule is checked here, once, before the output exists.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/convert.h"
#include "formats/writer.h"

namespace ckpt::internal {

// The checkpoint's tensors with their bytes. A mapped checkpoint whose storages are all raw
// gives views (zero-copy; pages are read as the writer reaches them). Any other (a
// torch.distributed.checkpoint folder, a URL, compressed or encrypted records) gives tensors
// without bytes and a feed (feed()) that
// reads their storages in the writer's order through a ring of max(budget, the largest storage)
// bytes, `o.threads` readers ahead of the writer. With `copy`, the checkpoint is loaded whole
// first by load_all's reader threads. Both references must outlive the source and its feed.
class TensorSource {
 public:
  TensorSource(const Checkpoint& c, const LoadOptions& o, uint64_t budget);
  Tensor get(size_t index) const;
  // Null unless the tensors come without bytes.
  std::shared_ptr<const TensorFeed> feed() const { return feed_; }

 private:
  const Checkpoint& c_;
  const LoadOptions& o_;
  std::vector<Tensor> all_;
  bool loaded_ = false;
  std::vector<StoragePtr> placeholders_;  // per storage, when fed
  std::shared_ptr<const TensorFeed> feed_;
};

// The writer for `o.target` (resolved, not std::monostate) with the target's options.
struct TargetWriter {
  std::unique_ptr<Writer> writer;
  // A new random key goes to this file, committed before the output
  // (TensorizerSaveOptions::key_file).
  std::string new_key_file;
};
// The target's row makes it (src/convert/target_format.cc: the one place a target format
// becomes a writer). Error{kInvalidArgument} for std::monostate.
TargetWriter target_writer(const ConvertTarget& target);
// Checks `o` against the writer's capabilities (max_shard_size: Error{kInvalidArgument} naming
// the option), then reads keys and passwords (Error{kNotFound}).
TargetWriter make_target(const ConvertOptions& o);

// A flat target's entries, checked against the writer: meta tensors (MetaTensors), quantized
// tensors, a single unnamed tensor, dtypes, shared bytes (SafetensorsSaveOptions::copy_shared).
// Fills r.meta_zeroed / meta_skipped, r.copied_shared, r.not_written, r.tensors, r.tensor_bytes.
FlatStateDict flat_state(const Checkpoint& c, const Writer& w, const ConvertOptions& o,
                         ConvertReport& r);
// The entries' tensors under their flat names (aliases share their tensor's storage), and the
// metadata a writer with metadata keeps (the input's safetensors __metadata__, else
// {"format": "pt"}). With SafetensorsSaveOptions::store_digests, `w` must be wrapped by
// with_digests.
WriteContent flat_content(const Checkpoint& c, const FlatStateDict& flat,
                          const TensorSource& source, const Writer& w);
// A writer with object_tree: the whole tree (a TorchScript archive: its state dict, then the
// per-channel scales and zero points it refers to; a safetensors file: a state dict). Fills
// r.tensors and r.tensor_bytes.
WriteContent tree_content(const Checkpoint& c, const TensorSource& source, ConvertReport& r);

// `inner` storing each tensor's SHA-256 in the metadata under kSafetensorsDigestKey (every
// write: each file of a shard set gets its own); `stored` counts the digests stored.
std::unique_ptr<Writer> with_digests(std::unique_ptr<Writer> inner, int threads, size_t& stored);

// Refuses (Error{kInvalidArgument}, naming `out`) an output path that is one of the input's own
// files (a file of a set, a DCP folder's data file, its index or the file itself): writing it
// would replace what the input is read from and leave the input unreadable.
void refuse_own_input(const Checkpoint& c, const std::string& out);

// Keys of a safetensors input's __metadata__ a writer without metadata drops.
std::vector<std::string> metadata_not_written(const Checkpoint& c, const Writer& w);

}  // namespace ckpt::internal
