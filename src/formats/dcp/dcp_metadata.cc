// The `.metadata` pickle of a torch.distributed.checkpoint folder, read as data (dcp_metadata.h).
// The pickle is torch.distributed.checkpoint.metadata.Metadata as pickle.dump writes a dataclass:
// NEWOBJ of the class, then BUILD with its __dict__ (TensorProperties: BUILD with the tuple its
// __getstate__ returns). Nothing is called: allowed classes become kObject nodes whose state is
// read here field by field; any other class stays an opaque node and is refused where it matters.

#include "formats/dcp/dcp_metadata.h"

#include <string_view>
#include <unordered_map>

#include "ckpt/error.h"
#include "pickle/unpickler.h"

namespace ckpt::internal {
namespace {

// The classes whose state is read. TensorProperties moved between torch versions
// (torch.distributed._shard.sharded_tensor.metadata, then torch.distributed.checkpoint.metadata).
bool known_global(const std::string& m, const std::string& n) {
  static const std::unordered_map<std::string_view, std::string_view> names = {
      {"Metadata", "torch.distributed.checkpoint.metadata"},
      {"TensorStorageMetadata", "torch.distributed.checkpoint.metadata"},
      {"BytesStorageMetadata", "torch.distributed.checkpoint.metadata"},
      {"ChunkStorageMetadata", "torch.distributed.checkpoint.metadata"},
      {"MetadataIndex", "torch.distributed.checkpoint.metadata"},
      {"StorageMeta", "torch.distributed.checkpoint.metadata"},
      {"_MEM_FORMAT_ENCODING", "torch.distributed.checkpoint.metadata"},
      {"_StorageInfo", "torch.distributed.checkpoint.filesystem"},
  };
  if (m == "torch") return true;  // torch.Size, dtypes (torch.float32), layouts (torch.strided)
  if (m == "torch.serialization" && n == "_get_layout") return true;
  if (n == "TensorProperties")
    return m == "torch.distributed.checkpoint.metadata" ||
           m == "torch.distributed._shard.sharded_tensor.metadata";
  if (n == "_MEM_FORMAT_ENCODING" && m == "torch.distributed._shard.sharded_tensor.metadata")
    return true;
  auto it = names.find(n);
  return it != names.end() && it->second == m;
}

class Reader {
 public:
  Reader(std::string source, const Limits& limits) : source_(std::move(source)), limits_(limits) {}

  [[noreturn]] void fail(ErrorCode code, const std::string& what,
                         const std::string& key = {}) const {
    throw Error(code, ".metadata: " + what, source_, key);
  }

  bool is(const ValuePtr& v, std::string_view name) const {
    return v && v->kind() == Value::Kind::kObject && v->name() == name && !v->foreign();
  }

  // A dataclass field: the BUILD state's dict entry (or the first dict of a (dict, slots) state).
  ValuePtr field(const ValuePtr& obj, std::string_view name) const {
    const ValuePtr& st = obj->state();
    if (!st) return nullptr;
    if (st->is_dict()) return st->get(name);
    if (st->kind() == Value::Kind::kTuple)
      for (const ValuePtr& part : st->items())
        if (part && part->is_dict())
          if (ValuePtr v = part->get(name)) return v;
    return nullptr;
  }

  // torch.Size(tuple) or a plain tuple/list of non-negative ints.
  std::vector<int64_t> ints(const ValuePtr& v, const char* what, const std::string& key) const {
    ValuePtr seq = v;
    if (v && v->kind() == Value::Kind::kObject && v->module() == "torch" && v->name() == "Size") {
      if (v->items().size() != 1) fail(ErrorCode::kCorrupt, std::string(what) + ": torch.Size takes one argument", key);
      seq = v->items()[0];
    }
    if (!seq || !seq->is_sequence())
      fail(ErrorCode::kCorrupt,
           std::string(what) + " is " + (seq ? seq->repr(40) : std::string("missing")) +
               ", not a sequence of ints",
           key);
    if (seq->items().size() > limits_.max_dims)
      fail(ErrorCode::kLimitExceeded,
           std::string(what) + " has " + std::to_string(seq->items().size()) +
               " dimensions (limit " + std::to_string(limits_.max_dims) + ")",
           key);
    std::vector<int64_t> out;
    for (const ValuePtr& i : seq->items()) {
      if (!i || i->kind() != Value::Kind::kInt || i->is_big_int() || i->as_int() < 0)
        fail(ErrorCode::kCorrupt,
             std::string(what) + " holds " + (i ? i->repr(40) : std::string("null")) +
                 ", not a non-negative int",
             key);
      out.push_back(i->as_int());
    }
    return out;
  }

  uint64_t uint(const ValuePtr& v, const char* what, const std::string& key) const {
    if (!v || v->kind() != Value::Kind::kInt || v->is_big_int() || v->as_int() < 0)
      fail(ErrorCode::kCorrupt,
           std::string(what) + " is " + (v ? v->repr(40) : std::string("missing")) +
               ", not a non-negative int",
           key);
    return static_cast<uint64_t>(v->as_int());
  }

  std::string text(const ValuePtr& v, const char* what, const std::string& key) const {
    if (!v || v->kind() != Value::Kind::kString)
      fail(ErrorCode::kCorrupt,
           std::string(what) + " is " + (v ? v->repr(40) : std::string("missing")) +
               ", not a string",
           key);
    return v->str();
  }

  // TensorProperties: its state is (dtype, layout, requires_grad, memory_format, pin_memory)
  // from its __getstate__, or a dict with those names (the dataclass default).
  void properties(const ValuePtr& p, DcpEntry& e) const {
    if (!is(p, "TensorProperties"))
      fail(ErrorCode::kCorrupt, "properties are " + (p ? p->repr(40) : std::string("missing")) +
                                    ", not TensorProperties", e.fqn);
    ValuePtr dtype, layout;
    const ValuePtr& st = p->state();
    if (st && st->kind() == Value::Kind::kTuple && st->items().size() >= 2) {
      dtype = st->items()[0];
      layout = st->items()[1];
    } else {
      dtype = field(p, "dtype");
      layout = field(p, "layout");
    }
    if (!dtype || dtype->kind() != Value::Kind::kGlobal || dtype->module() != "torch")
      fail(ErrorCode::kCorrupt, "dtype is " + (dtype ? dtype->repr(40) : std::string("missing")),
           e.fqn);
    auto dt = dtype_from_name(dtype->name());
    if (!dt) fail(ErrorCode::kUnsupported, "dtype torch." + dtype->name() + " is not known", e.fqn);
    e.dtype = *dt;
    // The layout: torch.serialization._get_layout('torch.strided'), or the global itself.
    std::string lname = "torch.strided";
    if (layout && layout->kind() == Value::Kind::kObject && layout->name() == "_get_layout" &&
        layout->items().size() == 1 && layout->items()[0]->kind() == Value::Kind::kString)
      lname = layout->items()[0]->str();
    else if (layout && layout->kind() == Value::Kind::kGlobal)
      lname = layout->module() + "." + layout->name();
    else if (layout && !layout->is_none())
      fail(ErrorCode::kCorrupt, "layout is " + layout->repr(40), e.fqn);
    if (lname != "torch.strided")
      fail(ErrorCode::kUnsupported, "tensor layout " + lname + " (only torch.strided is read)",
           e.fqn);
  }

  DcpEntry entry(const ValuePtr& key, const ValuePtr& v) const {
    DcpEntry e;
    e.fqn = text(key, "a state_dict_metadata key", {});
    if (is(v, "BytesStorageMetadata")) {
      e.is_bytes = true;
      return e;
    }
    if (!is(v, "TensorStorageMetadata"))
      fail(ErrorCode::kUnsupported,
           "storage metadata " + (v ? (v->module().empty() ? v->repr(40) : v->module() + "." + v->name())
                                    : std::string("null")) +
               " is not TensorStorageMetadata or BytesStorageMetadata",
           e.fqn);
    properties(field(v, "properties"), e);
    e.size = ints(field(v, "size"), "size", e.fqn);
    ValuePtr chunks = field(v, "chunks");
    if (!chunks || !chunks->is_sequence())
      fail(ErrorCode::kCorrupt, "chunks are not a list", e.fqn);
    for (const ValuePtr& c : chunks->items()) {
      if (!is(c, "ChunkStorageMetadata"))
        fail(ErrorCode::kCorrupt, "a chunk is " + (c ? c->repr(40) : std::string("null")), e.fqn);
      DcpChunk ch;
      ch.offsets = ints(field(c, "offsets"), "chunk offsets", e.fqn);
      ch.sizes = ints(field(c, "sizes"), "chunk sizes", e.fqn);
      e.chunks.push_back(std::move(ch));
    }
    return e;
  }

  DcpStorage storage(const ValuePtr& k, const ValuePtr& v) const {
    DcpStorage s;
    if (!is(k, "MetadataIndex"))
      fail(ErrorCode::kUnsupported,
           "a storage_data key is " + (k ? k->repr(40) : std::string("null")) +
               ", not MetadataIndex");
    s.fqn = text(field(k, "fqn"), "MetadataIndex.fqn", {});
    ValuePtr off = field(k, "offset");
    if (off && !off->is_none()) s.chunk_offsets = ints(off, "MetadataIndex.offset", s.fqn);
    if (!is(v, "_StorageInfo"))
      fail(ErrorCode::kUnsupported,
           "the storage of an item is " + (v ? v->repr(40) : std::string("null")) +
               ", not _StorageInfo (a storage layout this reader does not know)",
           s.fqn);
    s.relative_path = text(field(v, "relative_path"), "_StorageInfo.relative_path", s.fqn);
    s.offset = uint(field(v, "offset"), "_StorageInfo.offset", s.fqn);
    s.length = uint(field(v, "length"), "_StorageInfo.length", s.fqn);
    ValuePtr tr = field(v, "transform_descriptors");
    if (tr && !tr->is_none()) {
      if (!tr->is_sequence()) fail(ErrorCode::kCorrupt, "transform_descriptors are not a list", s.fqn);
      for (const ValuePtr& t : tr->items()) {
        s.transformed = true;
        s.transforms += (s.transforms.empty() ? "" : ", ") + (t ? t->repr(40) : std::string("?"));
      }
    }
    return s;
  }

  DcpMetadata read(const ValuePtr& root) const {
    if (!is(root, "Metadata"))
      fail(ErrorCode::kUnsupported,
           "the pickle holds " + (root ? root->repr(40) : std::string("nothing")) +
               ", not torch.distributed.checkpoint.metadata.Metadata");
    DcpMetadata md;
    ValuePtr sdm = field(root, "state_dict_metadata");
    if (!sdm || !sdm->is_dict()) fail(ErrorCode::kCorrupt, "state_dict_metadata is not a dict");
    if (sdm->entries().size() > limits_.max_tensors)
      fail(ErrorCode::kLimitExceeded, std::to_string(sdm->entries().size()) +
                                          " entries (limit " +
                                          std::to_string(limits_.max_tensors) + ")");
    ValuePtr planner = field(root, "planner_data");
    for (const auto& [k, v] : sdm->entries()) {
      DcpEntry e = entry(k, v);
      if (planner && planner->is_dict())
        if (ValuePtr p = planner->get(e.fqn); p && p->is_sequence() && !p->items().empty()) {
          for (const ValuePtr& part : p->items())
            if (!part || (part->kind() != Value::Kind::kString &&
                          (part->kind() != Value::Kind::kInt || part->is_big_int() ||
                           part->as_int() < 0 || part->as_int() > (1 << 24))))
              fail(ErrorCode::kCorrupt, "planner_data path holds " +
                                            (part ? part->repr(40) : std::string("null")),
                   e.fqn);
          e.path = p->items();
        }
      md.entries.push_back(std::move(e));
    }
    ValuePtr sd = field(root, "storage_data");
    if (!sd || !sd->is_dict())
      fail(ErrorCode::kUnsupported,
           "storage_data is " + (sd ? sd->repr(40) : std::string("missing")) +
               ", not a dict of _StorageInfo (a storage layout this reader does not know)");
    if (sd->entries().size() > limits_.max_tensors)
      fail(ErrorCode::kLimitExceeded, std::to_string(sd->entries().size()) +
                                          " storage items (limit " +
                                          std::to_string(limits_.max_tensors) + ")");
    for (const auto& [k, v] : sd->entries()) md.storage.push_back(storage(k, v));
    if (ValuePtr ver = field(root, "version"); ver && ver->kind() == Value::Kind::kString)
      md.version = ver->str();
    return md;
  }

 private:
  std::string source_;
  const Limits& limits_;
};

}  // namespace

DcpMetadata read_dcp_metadata(std::span<const std::byte> data, const std::string& source,
                              const Limits& limits) {
  if (data.size() > limits.max_metadata_bytes)
    throw Error(ErrorCode::kLimitExceeded,
                ".metadata holds " + std::to_string(data.size()) + " bytes (limit " +
                    std::to_string(limits.max_metadata_bytes) + ")",
                source);
  UnpicklerHooks hooks;
  hooks.allow_global = known_global;
  // Other classes (pathlib paths in StorageMeta, a custom planner's data) stay opaque nodes:
  // never called, and refused where the reader needs a value from them.
  hooks.admit_foreign = [](const std::string&, const std::string&) { return true; };
  UnpickleOptions o;
  o.source = source;
  o.record = ".metadata";
  o.limits = limits;
  ValuePtr root = unpickle(data, hooks, o);
  return Reader(source, limits).read(root);
}

}  // namespace ckpt::internal
