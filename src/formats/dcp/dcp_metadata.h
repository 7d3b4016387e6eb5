#pragma once
// The `.metadata` file of a torch.distributed.checkpoint (DCP) folder, read as data: a pickle of
// torch.distributed.checkpoint.metadata.Metadata run by the restricted pickle VM (nothing is
// called; the classes below are recognised by name and their pickled state read field by field).
// What the folder's layout is, byte by byte, and where each fact comes from in torch:
// docs/formats/dcp.md, "torch.distributed.checkpoint folders".
//
// Layer: formats. It reads one buffer; the folder's data files are the API layer's
// (dcp_reader.cc), which checks every chunk against them.
//
// Thread-safety: a plain function over its arguments; the result is a value.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/options.h"
#include "ckpt/value.h"
#include "util/name_index.h"

namespace ckpt::internal {

// One ChunkStorageMetadata: a box of the global tensor.
struct DcpChunk {
  std::vector<int64_t> offsets;  // where it starts, per dimension
  std::vector<int64_t> sizes;    // its extent, per dimension
};

// One entry of Metadata.state_dict_metadata, in the pickle's order.
struct DcpEntry {
  std::string fqn;        // the flattened key ("model.layers.0.weight")
  bool is_bytes = false;  // BytesStorageMetadata: a torch.save blob of any value
  // TensorStorageMetadata only:
  DType dtype = DType::kFloat32;
  std::vector<int64_t> size;     // the global shape
  std::vector<DcpChunk> chunks;  // as listed
  // Metadata.planner_data[fqn] when the planner recorded it: the key's path in the nested
  // state dict (strings, and ints for list positions); empty otherwise.
  std::vector<ValuePtr> path;
};

// One item of Metadata.storage_data: MetadataIndex -> _StorageInfo.
struct DcpStorage {
  std::string fqn;
  std::vector<int64_t> chunk_offsets;  // MetadataIndex.offset (empty for bytes entries)
  std::string relative_path;           // the data file, relative to the folder
  uint64_t offset = 0;                 // where the item's bytes start in that file
  uint64_t length = 0;                 // how many bytes
  bool transformed = false;            // transform_descriptors present (compression, ...)
  std::string transforms;              // their names, for the refusal
};

// A storage item's key as MetadataIndex gives it, (fqn, chunk offsets), as views: for hashed
// lookups and duplicate checks over a DcpMetadata that no longer changes.
struct DcpItemKey {
  std::string_view fqn;
  std::span<const int64_t> offsets;
  bool operator==(const DcpItemKey& o) const {
    return fqn == o.fqn &&
           std::equal(offsets.begin(), offsets.end(), o.offsets.begin(), o.offsets.end());
  }
};
struct DcpItemKeyHash {
  size_t operator()(const DcpItemKey& k) const noexcept {
    uint64_t h = name_hash(k.fqn);  // seeded per process
    for (int64_t o : k.offsets) h = (h ^ static_cast<uint64_t>(o)) * 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

struct DcpMetadata {
  std::vector<DcpEntry> entries;
  std::vector<DcpStorage> storage;
  std::string version;  // Metadata.version, when present
  // The keys of Metadata.mcore_data, which Megatron-core before 0.14 added for the tensors it
  // saved reshaped (a flattened_range shard: nd_reformulated_orig_global_shape).
  std::vector<std::string> mcore_keys;
};

// Reads the pickle in `data`: read_dcp_metadata_direct when it gives a result, otherwise
// read_dcp_metadata_generic (both give the same result for what the former reads). Throws Error
// naming `source` and, where it can, the key: kCorrupt for a structure that is not DCP metadata (a
// chunk without offsets, a negative size, a storage item of another shape), kUnsupported for a
// class or layout it does not know (another storage-metadata class, storage_data that is not a dict
// of _StorageInfo), kLimitExceeded past options' limits (tensors, dimensions, pickle limits), and
// whatever the pickle VM throws.
DcpMetadata read_dcp_metadata(std::span<const std::byte> data, const std::string& source,
                              const Limits& limits);

// The generic reader: the restricted pickle VM's heap (pickle/unpickler.h), read field by field.
// Any pickle; every refusal above, typed and naming the file, the record and the offset.
DcpMetadata read_dcp_metadata_generic(std::span<const std::byte> data, const std::string& source,
                                      const Limits& limits);

// The direct reader (dcp_metadata_direct.cc): DcpMetadata made straight from the pickle's
// opcodes, without the heap, for the shapes torch's and ckpt's DCP writers give (protocols 2-5,
// memoized or not). Anything else gives nullopt, never an error and never a partial result: an
// opcode or a class it does not read, a value that the generic reader would refuse or that is
// near one of `limits` (memo, stack, depth, the object budget, tensors, dimensions, planner
// paths), a shared mutable object. The caller then runs the generic reader, which gives the
// typed error. `data` must hold at most limits.max_metadata_bytes.
std::optional<DcpMetadata> read_dcp_metadata_direct(std::span<const std::byte> data,
                                                    const Limits& limits);

// True where the two readers' results agree field by field (planner paths by their repr): what
// the tests and the fuzz target check of the direct reader against the generic one.
bool same_metadata(const DcpMetadata& a, const DcpMetadata& b);

}  // namespace ckpt::internal
