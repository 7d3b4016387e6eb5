// The `.metadata` pickle of a torch.distributed.checkpoint folder, read as data (dcp_metadata.h).
// The pickle is torch.distributed.checkpoint.metadata.Metadata as pickle.dump writes a dataclass:
// NEWOBJ of the class, then BUILD with its __dict__ (TensorProperties: BUILD with the tuple its
// __getstate__ returns). Nothing is called: allowed classes become kObject nodes whose state is
// read here field by field; any other class stays an opaque node and is refused where it matters.

#include "formats/dcp/dcp_metadata.h"

#include <algorithm>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/error.h"
#include "pickle/heap.h"
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

// The nested state dict that planner_data's paths describe (torch's set_element makes it: a dict
// per string step, a list per int step, padded with None up to the index). Each path is added
// to a trie of its steps; a list's length is its largest index plus one. Every step and every
// list slot counts as one object against `objects` (limits.object_bytes_for(.metadata size) /
// PickleHeap::kBytesPerObject): an index is padding a few bytes of pickle can ask for, and
// torch itself writes gaps (an empty dict in a list leaves no key), so only its cost is bounded.
class PathTree {
 public:
  explicit PathTree(uint64_t objects) : budget_(objects) {}

  // False when the path's objects would exceed the budget.
  bool add(const std::vector<ValuePtr>& path) {
    uint32_t node = 0;  // the root dict
    for (const ValuePtr& step : path) {
      key_.assign(reinterpret_cast<const char*>(&node), sizeof node);
      const bool index = step->kind() == Value::Kind::kInt;
      key_ += index ? 'i' : 's';
      key_ += index ? std::to_string(step->as_int()) : step->str();
      auto [it, fresh] = children_.try_emplace(key_, static_cast<uint32_t>(children_.size() + 1));
      if (fresh && !spend(1)) return false;
      if (index) {
        uint64_t& len = list_len_[node];
        const uint64_t want = static_cast<uint64_t>(step->as_int()) + 1;
        if (want > len && !spend(want - len)) return false;
        len = std::max(len, want);
      }
      node = it->second;
    }
    return true;
  }

 private:
  bool spend(uint64_t n) {
    if (n > budget_) return false;
    budget_ -= n;
    return true;
  }
  uint64_t budget_;
  std::string key_;
  std::unordered_map<std::string, uint32_t> children_;  // (parent, step) -> node
  std::unordered_map<uint32_t, uint64_t> list_len_;     // node -> its length as a list
};

class Reader {
 public:
  Reader(std::string source, const Limits& limits, uint64_t metadata_bytes)
      : source_(std::move(source)), limits_(limits), metadata_bytes_(metadata_bytes) {}

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
      if (v->items().size() != 1)
        fail(ErrorCode::kCorrupt, std::string(what) + ": torch.Size takes one argument", key);
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
      fail(
          ErrorCode::kCorrupt,
          "properties are " + (p ? p->repr(40) : std::string("missing")) + ", not TensorProperties",
          e.fqn);
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
           "storage metadata " +
               (v ? (v->module().empty() ? v->repr(40) : v->module() + "." + v->name())
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
      fail(ErrorCode::kUnsupported, "a storage_data key is " +
                                        (k ? k->repr(40) : std::string("null")) +
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
      if (!tr->is_sequence())
        fail(ErrorCode::kCorrupt, "transform_descriptors are not a list", s.fqn);
      for (const ValuePtr& t : tr->items()) {
        s.transformed = true;
        s.transforms += (s.transforms.empty() ? "" : ", ") + (t ? t->repr(40) : std::string("?"));
      }
    }
    return s;
  }

  DcpMetadata read(const ValuePtr& root) const {
    if (!is(root, "Metadata"))
      fail(ErrorCode::kUnsupported, "the pickle holds " +
                                        (root ? root->repr(40) : std::string("nothing")) +
                                        ", not torch.distributed.checkpoint.metadata.Metadata");
    DcpMetadata md;
    ValuePtr sdm = field(root, "state_dict_metadata");
    if (!sdm || !sdm->is_dict()) fail(ErrorCode::kCorrupt, "state_dict_metadata is not a dict");
    if (sdm->entries().size() > limits_.max_tensors)
      fail(ErrorCode::kLimitExceeded, std::to_string(sdm->entries().size()) + " entries (limit " +
                                          std::to_string(limits_.max_tensors) + ")");
    const auto planner = planner_paths(field(root, "planner_data"));
    PathTree tree(limits_.object_bytes_for(metadata_bytes_) / PickleHeap::kBytesPerObject);
    std::unordered_set<std::string_view> keys;
    keys.reserve(sdm->entries().size());
    md.entries.reserve(sdm->entries().size());
    for (const auto& [k, v] : sdm->entries()) {
      DcpEntry e = entry(k, v);
      // Python's dict has each key once; a pickle can list one twice (SETITEMS appends).
      if (!keys.insert(k->str()).second)
        fail(ErrorCode::kCorrupt, "state_dict_metadata lists the key twice", e.fqn);
      if (auto it = planner.find(e.fqn); it != planner.end()) {
        path(*it->second, e);
        if (!tree.add(e.path))
          fail(ErrorCode::kLimitExceeded,
               "planner_data's paths make more objects (nested dicts, lists and the None that "
               "pads a list up to an index) than a .metadata of " +
                   std::to_string(metadata_bytes_) +
                   " bytes may make (limits.max_object_bytes + limits.object_bytes_per_byte per "
                   "byte)",
               e.fqn);
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
    std::set<std::pair<std::string_view, const std::vector<int64_t>*>, ItemLess> items;
    md.storage.reserve(sd->entries().size());
    for (const auto& [k, v] : sd->entries()) {
      md.storage.push_back(storage(k, v));
      const DcpStorage& s = md.storage.back();
      if (!items.emplace(s.fqn, &s.chunk_offsets).second)
        fail(ErrorCode::kCorrupt,
             "storage_data lists the item at chunk offsets " + offsets_text(s.chunk_offsets) +
                 " twice",
             s.fqn);
    }
    if (ValuePtr ver = field(root, "version"); ver && ver->kind() == Value::Kind::kString)
      md.version = ver->str();
    return md;
  }

  // planner_data: fqn -> its path, looked up once per key (a dict of 400,000 keys).
  std::unordered_map<std::string_view, const Value*> planner_paths(const ValuePtr& planner) const {
    std::unordered_map<std::string_view, const Value*> out;
    if (!planner || !planner->is_dict()) return out;
    out.reserve(planner->entries().size());
    for (const auto& [k, v] : planner->entries())
      if (k && k->kind() == Value::Kind::kString && v && v->is_sequence() && !v->items().empty())
        if (!out.emplace(k->str(), v.get()).second)
          fail(ErrorCode::kCorrupt, "planner_data lists the key twice", k->str());
    return out;
  }

  // A planner_data path: strings (dict keys) and non-negative ints (list positions), no longer
  // than the tree may nest.
  void path(const Value& p, DcpEntry& e) const {
    if (p.items().size() > limits_.max_pickle_depth)
      fail(ErrorCode::kLimitExceeded,
           "planner_data path has " + std::to_string(p.items().size()) +
               " steps, deeper than Limits::max_pickle_depth (" +
               std::to_string(limits_.max_pickle_depth) + ")",
           e.fqn);
    for (const ValuePtr& part : p.items())
      if (!part ||
          (part->kind() != Value::Kind::kString &&
           (part->kind() != Value::Kind::kInt || part->is_big_int() || part->as_int() < 0)))
        fail(ErrorCode::kCorrupt,
             "planner_data path holds " + (part ? part->repr(40) : std::string("null")), e.fqn);
    e.path = p.items();
  }

  static std::string offsets_text(const std::vector<int64_t>& o) {
    std::string s = "[";
    for (size_t i = 0; i < o.size(); ++i) s += (i ? ", " : "") + std::to_string(o[i]);
    return s + "]";
  }
  struct ItemLess {
    using Key = std::pair<std::string_view, const std::vector<int64_t>*>;
    bool operator()(const Key& a, const Key& b) const {
      if (a.first != b.first) return a.first < b.first;
      return *a.second < *b.second;
    }
  };

 private:
  std::string source_;
  const Limits& limits_;
  uint64_t metadata_bytes_;
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
  return Reader(source, limits, data.size()).read(root);
}

}  // namespace ckpt::internal
