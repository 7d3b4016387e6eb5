// The `.metadata` pickle a DCP writer leaves (dcp_writer.h): the Metadata object torch's
// FileSystemWriter.finish pickles, as a Value tree for the project's pickler. Every dataclass
// is NEWOBJ of its class with no arguments, then BUILD with its fields as a dict, as pickle
// writes a dataclass; TensorProperties builds from the tuple its __getstate__ returns. Field
// names, their order and the classes' modules: torch/distributed/checkpoint/metadata.py and
// filesystem.py (docs/formats/dcp.md, "torch.distributed.checkpoint folders (DCP)").

#include <string>
#include <utility>
#include <vector>

#include "formats/dcp/dcp_writer.h"
#include "pickle/pickler.h"

namespace ckpt::internal {
namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

// A dataclass instance: cls.__new__(cls), then BUILD of `fields` (null: no BUILD).
ValuePtr dataclass(const char* module, const char* name, ValuePtr fields) {
  ValuePtr v = Value::object(module, name, {}, std::move(fields));
  v->set_call(Value::Call::kNewObj);
  return v;
}

ValuePtr fields(std::vector<std::pair<const char*, ValuePtr>> kv) {
  ValuePtr d = Value::dict();
  for (auto& [k, v] : kv) d->set(k, std::move(v));
  return d;
}

// torch.Size(tuple): a REDUCE of the class with the tuple.
ValuePtr torch_size(const std::vector<int64_t>& dims) {
  std::vector<ValuePtr> items;
  items.reserve(dims.size());
  for (int64_t d : dims) items.push_back(Value::integer(d));
  return Value::object("torch", "Size", {Value::tuple(std::move(items))});
}

class MetadataBuilder {
 public:
  ValuePtr build(const DcpWrittenState& s) {
    ValuePtr sdm = Value::dict();
    ValuePtr planner = Value::dict();
    std::vector<ValuePtr> chunk_lists(s.entries.size());
    for (size_t i = 0; i < s.entries.size(); ++i) {
      const DcpWrittenEntry& e = s.entries[i];
      ValuePtr md;
      if (e.is_bytes) {
        md = dataclass(kMetadataModule, "BytesStorageMetadata", nullptr);  // no fields
      } else {
        chunk_lists[i] = Value::list();
        md = dataclass(kMetadataModule, "TensorStorageMetadata",
                       fields({{"properties", properties(e)},
                               {"size", torch_size(e.size)},
                               {"chunks", chunk_lists[i]}}));
      }
      // The keys are distinct (the writer refuses duplicates): appended, not looked up.
      sdm->entries().emplace_back(Value::string(e.fqn), md);
      planner->entries().emplace_back(Value::string(e.fqn), Value::tuple(e.path));
    }
    ValuePtr storage = Value::dict();
    std::vector<int64_t> index(s.entries.size(), 0);
    for (const DcpWrittenItem& it : s.items) {
      const DcpWrittenEntry& e = s.entries[it.entry];
      ValuePtr key;
      if (e.is_bytes) {
        // MetadataIndex(fqn): its __init__ sets fqn and index, and offset only when given.
        key = dataclass(kMetadataModule, "MetadataIndex",
                        fields({{"fqn", Value::string(e.fqn)}, {"index", Value::none()}}));
      } else {
        // The global plan's index hint: the chunk's position in its entry's chunk list.
        key = dataclass(kMetadataModule, "MetadataIndex",
                        fields({{"fqn", Value::string(e.fqn)},
                                {"index", Value::integer(index[it.entry]++)},
                                {"offset", torch_size(it.offsets)}}));
        chunk_lists[it.entry]->items().push_back(dataclass(
            kMetadataModule, "ChunkStorageMetadata",
            fields({{"offsets", torch_size(it.offsets)}, {"sizes", torch_size(it.sizes)}})));
      }
      // _StorageInfo.__getstate__ leaves out the fields that are None (transform_descriptors).
      ValuePtr info =
          dataclass(kFilesystemModule, "_StorageInfo",
                    fields({{"relative_path", Value::string(it.file)},
                            {"offset", Value::integer(static_cast<int64_t>(it.offset))},
                            {"length", Value::integer(static_cast<int64_t>(it.length))}}));
      storage->entries().emplace_back(key, info);
    }
    // StorageMeta: FileSystemWriter stores the folder's path and a random save id; this writer
    // stores None for both, so that the same input gives the same bytes (neither is read back
    // by dcp.load).
    ValuePtr storage_meta = dataclass(kMetadataModule, "StorageMeta",
                                      fields({{"checkpoint_id", Value::none()},
                                              {"save_id", Value::none()},
                                              {"load_id", Value::none()},
                                              {"modules", Value::list()}}));
    return dataclass(kMetadataModule, "Metadata",
                     fields({{"state_dict_metadata", sdm},
                             {"planner_data", planner},
                             {"storage_data", storage},
                             {"storage_meta", storage_meta},
                             {"version", Value::string("1.0.0")}}));  // CURRENT_DCP_VERSION
  }

 private:
  // TensorProperties' __getstate__ tuple: (dtype, layout, requires_grad, memory format
  // encoding, pin_memory). The layout and encoding objects are shared, as pickle's memo would.
  ValuePtr properties(const DcpWrittenEntry& e) {
    if (!strided_) {
      strided_ =
          Value::object("torch.serialization", "_get_layout", {Value::string("torch.strided")});
      contiguous_ = Value::object(kMetadataModule, "_MEM_FORMAT_ENCODING", {Value::integer(0)});
    }
    ValuePtr& dtype = dtypes_[static_cast<size_t>(e.dtype)];
    if (!dtype) dtype = Value::global("torch", dtype_info(e.dtype).name);
    ValuePtr state = Value::tuple(
        {dtype, strided_, Value::boolean(e.requires_grad), contiguous_, Value::boolean(false)});
    return dataclass(kMetadataModule, "TensorProperties", state);
  }

  ValuePtr strided_, contiguous_;
  std::vector<ValuePtr> dtypes_ = std::vector<ValuePtr>(256);
};

}  // namespace

std::string dcp_metadata_pickle(const DcpWrittenState& state) {
  std::string out;
  pickle(MetadataBuilder().build(state), out);
  return out;
}

}  // namespace ckpt::internal
