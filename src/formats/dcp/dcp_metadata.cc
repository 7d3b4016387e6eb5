// The `.metadata` pickle of a torch.distributed.checkpoint folder, read as data (dcp_metadata.h).
// The pickle is torch.distributed.checkpoint.metadata.Metadata as pickle.dump writes a dataclass:
// NEWOBJ of the class, then BUILD with its __dict__ (TensorProperties: BUILD with the tuple its
// __getstate__ returns). Nothing is called: allowed classes become kObject nodes whose state is
// read here field by field; any other class stays an opaque node and is refused where it matters.

#include "formats/dcp/dcp_metadata.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "ckpt/error.h"
#include "formats/dcp/dcp_planner_paths.h"
#include "formats/dcp/flat_index.h"
#include "pickle/builtin_calls.h"
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

// Reads the Metadata object in the unpickler's heap (pickle/heap.h) field by field: no Value tree
// is made of the pickle (for 400,000 keys that tree was most of the time and memory of opening
// the folder), only the Values the result keeps (planner_data's path steps) and, on an error, the
// Value of the offending object for its text. The unpickler made the checks the tree would have
// (cycles, depth, copies, object count), so what is read and refused is what the tree gave.
class Reader {
 public:
  Reader(const PickleHeap& heap, std::string source, const Limits& limits, uint64_t metadata_bytes)
      : h_(heap), source_(std::move(source)), limits_(limits), metadata_bytes_(metadata_bytes) {}

  [[noreturn]] void fail(ErrorCode code, const std::string& what,
                         const std::string& key = {}) const {
    throw Error(code, ".metadata: " + what, source_, key);
  }

  // The object's text as Value::repr(40) gives it, or `absent` for no object.
  std::string show(Ref r, const char* absent) const {
    if (r == kNoRef) return absent;
    CopyBudget budget(4 * metadata_bytes_ + (1u << 20));
    return h_.to_value(r, budget, limits_.max_pickle_depth)->repr(40);
  }

  bool is(Ref r, std::string_view name) const {
    return r != kNoRef && h_.kind(r) == Kind::kObject && h_.name(r) == name && !h_.foreign(r);
  }
  bool is_sequence(Ref r) const {
    return r != kNoRef && (h_.kind(r) == Kind::kList || h_.kind(r) == Kind::kTuple);
  }
  bool is_dict(Ref r) const { return r != kNoRef && h_.kind(r) == Kind::kDict; }
  bool is_string(Ref r) const { return r != kNoRef && h_.kind(r) == Kind::kString; }
  bool is_uint(Ref r) const { return r != kNoRef && h_.is_small_int(r) && h_.int_value(r) >= 0; }

  // A dict's value under a string key (the first such entry, as Value::get finds it).
  Ref get(Ref dict, std::string_view key) const {
    auto it = h_.items(dict);
    for (size_t i = 0; i + 1 < it.size(); i += 2)
      if (is_string(it[i]) && h_.text(it[i]) == key) return it[i + 1];
    return kNoRef;
  }

  // A dataclass field: the BUILD state's dict entry (or the first dict of a (dict, slots) state).
  Ref field(Ref obj, std::string_view name) const {
    const Ref st = h_.state(obj);
    if (st == kNoRef) return kNoRef;
    if (is_dict(st)) return get(st, name);
    if (h_.kind(st) == Kind::kTuple)
      for (Ref part : h_.items(st))
        if (is_dict(part))
          if (Ref v = get(part, name)) return v;
    return kNoRef;
  }

  // torch.Size(tuple) or a plain tuple/list of non-negative ints.
  std::vector<int64_t> ints(Ref v, const char* what, const std::string& key) const {
    Ref seq = v;
    if (v != kNoRef && h_.kind(v) == Kind::kObject && h_.module(v) == "torch" &&
        h_.name(v) == "Size") {
      if (h_.items(v).size() != 1)
        fail(ErrorCode::kCorrupt, std::string(what) + ": torch.Size takes one argument", key);
      seq = h_.items(v)[0];
    }
    if (!is_sequence(seq))
      fail(ErrorCode::kCorrupt,
           std::string(what) + " is " + show(seq, "missing") + ", not a sequence of ints", key);
    auto items = h_.items(seq);
    if (items.size() > limits_.max_dims)
      fail(ErrorCode::kLimitExceeded,
           std::string(what) + " has " + std::to_string(items.size()) + " dimensions (limit " +
               std::to_string(limits_.max_dims) + ")",
           key);
    std::vector<int64_t> out(items.size());
    for (size_t d = 0; d < items.size(); ++d) {
      if (!is_uint(items[d]))
        fail(ErrorCode::kCorrupt,
             std::string(what) + " holds " + show(items[d], "null") + ", not a non-negative int",
             key);
      out[d] = h_.int_value(items[d]);
    }
    return out;
  }

  uint64_t uint(Ref v, const char* what, const std::string& key) const {
    if (!is_uint(v))
      fail(ErrorCode::kCorrupt,
           std::string(what) + " is " + show(v, "missing") + ", not a non-negative int", key);
    return static_cast<uint64_t>(h_.int_value(v));
  }

  std::string text(Ref v, const char* what, const std::string& key) const {
    if (!is_string(v))
      fail(ErrorCode::kCorrupt, std::string(what) + " is " + show(v, "missing") + ", not a string",
           key);
    return std::string(h_.text(v));
  }

  // TensorProperties: its state is (dtype, layout, requires_grad, memory_format, pin_memory)
  // from its __getstate__, or a dict with those names (the dataclass default).
  void properties(Ref p, DcpEntry& e) const {
    if (!is(p, "TensorProperties"))
      fail(ErrorCode::kCorrupt, "properties are " + show(p, "missing") + ", not TensorProperties",
           e.fqn);
    Ref dtype = kNoRef, layout = kNoRef;
    const Ref st = h_.state(p);
    if (st != kNoRef && h_.kind(st) == Kind::kTuple && h_.items(st).size() >= 2) {
      dtype = h_.items(st)[0];
      layout = h_.items(st)[1];
    } else {
      dtype = field(p, "dtype");
      layout = field(p, "layout");
    }
    if (dtype == kNoRef || h_.kind(dtype) != Kind::kGlobal || h_.module(dtype) != "torch")
      fail(ErrorCode::kCorrupt, "dtype is " + show(dtype, "missing"), e.fqn);
    auto dt = dtype_from_name(std::string(h_.name(dtype)));
    if (!dt)
      fail(ErrorCode::kUnsupported, "dtype torch." + std::string(h_.name(dtype)) + " is not known",
           e.fqn);
    e.dtype = *dt;
    // The layout: torch.serialization._get_layout('torch.strided'), or the global itself.
    std::string lname = "torch.strided";
    if (layout != kNoRef && h_.kind(layout) == Kind::kObject && h_.name(layout) == "_get_layout" &&
        h_.items(layout).size() == 1 && h_.kind(h_.items(layout)[0]) == Kind::kString)
      lname = h_.text(h_.items(layout)[0]);
    else if (layout != kNoRef && h_.kind(layout) == Kind::kGlobal)
      lname = std::string(h_.module(layout)) + "." + std::string(h_.name(layout));
    else if (layout != kNoRef && h_.kind(layout) != Kind::kNone)
      fail(ErrorCode::kCorrupt, "layout is " + show(layout, ""), e.fqn);
    if (lname != "torch.strided")
      fail(ErrorCode::kUnsupported, "tensor layout " + lname + " (only torch.strided is read)",
           e.fqn);
  }

  DcpEntry entry(Ref key, Ref v) const {
    DcpEntry e;
    e.fqn = text(key, "a state_dict_metadata key", {});
    if (is(v, "BytesStorageMetadata")) {
      e.is_bytes = true;
      return e;
    }
    if (!is(v, "TensorStorageMetadata"))
      fail(
          ErrorCode::kUnsupported,
          "storage metadata " +
              (v == kNoRef            ? std::string("null")
               : h_.module(v).empty() ? show(v, "null")
                                      : std::string(h_.module(v)) + "." + std::string(h_.name(v))) +
              " is not TensorStorageMetadata or BytesStorageMetadata",
          e.fqn);
    properties(field(v, "properties"), e);
    e.size = ints(field(v, "size"), "size", e.fqn);
    const Ref chunks = field(v, "chunks");
    if (!is_sequence(chunks)) fail(ErrorCode::kCorrupt, "chunks are not a list", e.fqn);
    e.chunks.reserve(h_.items(chunks).size());
    for (Ref c : h_.items(chunks)) {
      if (!is(c, "ChunkStorageMetadata"))
        fail(ErrorCode::kCorrupt, "a chunk is " + show(c, "null"), e.fqn);
      DcpChunk ch;
      ch.offsets = ints(field(c, "offsets"), "chunk offsets", e.fqn);
      ch.sizes = ints(field(c, "sizes"), "chunk sizes", e.fqn);
      e.chunks.push_back(std::move(ch));
    }
    return e;
  }

  DcpStorage storage(Ref k, Ref v) const {
    DcpStorage s;
    if (!is(k, "MetadataIndex"))
      fail(ErrorCode::kUnsupported,
           "a storage_data key is " + show(k, "null") + ", not MetadataIndex");
    s.fqn = text(field(k, "fqn"), "MetadataIndex.fqn", {});
    const Ref off = field(k, "offset");
    if (off != kNoRef && h_.kind(off) != Kind::kNone)
      s.chunk_offsets = ints(off, "MetadataIndex.offset", s.fqn);
    if (!is(v, "_StorageInfo"))
      fail(ErrorCode::kUnsupported,
           "the storage of an item is " + show(v, "null") +
               ", not _StorageInfo (a storage layout this reader does not know)",
           s.fqn);
    s.relative_path = text(field(v, "relative_path"), "_StorageInfo.relative_path", s.fqn);
    s.offset = uint(field(v, "offset"), "_StorageInfo.offset", s.fqn);
    s.length = uint(field(v, "length"), "_StorageInfo.length", s.fqn);
    const Ref tr = field(v, "transform_descriptors");
    if (tr != kNoRef && h_.kind(tr) != Kind::kNone) {
      if (!is_sequence(tr))
        fail(ErrorCode::kCorrupt, "transform_descriptors are not a list", s.fqn);
      for (Ref t : h_.items(tr)) {
        s.transformed = true;
        s.transforms += (s.transforms.empty() ? "" : ", ") + show(t, "?");
      }
    }
    return s;
  }

  DcpMetadata read(Ref root) {
    if (!is(root, "Metadata"))
      fail(ErrorCode::kUnsupported, "the pickle holds " + show(root, "nothing") +
                                        ", not torch.distributed.checkpoint.metadata.Metadata");
    DcpMetadata md;
    read_entries(root, md);
    read_storage(root, md);
    if (Ref ver = field(root, "version"); is_string(ver)) md.version = h_.text(ver);
    if (Ref mc = field(root, "mcore_data"); is_dict(mc))  // Megatron-core before 0.14
      for (size_t i = 0; i < h_.dict_size(mc); ++i)
        if (is_string(h_.items(mc)[2 * i]))
          md.mcore_keys.emplace_back(h_.text(h_.items(mc)[2 * i]));
    return md;
  }

  void read_entries(Ref root, DcpMetadata& md) {
    const Ref sdm = field(root, "state_dict_metadata");
    if (!is_dict(sdm)) fail(ErrorCode::kCorrupt, "state_dict_metadata is not a dict");
    const size_t n = h_.dict_size(sdm);
    if (n > limits_.max_tensors)
      fail(ErrorCode::kLimitExceeded,
           std::to_string(n) + " entries (limit " + std::to_string(limits_.max_tensors) + ")");
    const auto planner = planner_paths(field(root, "planner_data"));
    PathTree tree(limits_.object_bytes_for(metadata_bytes_) / PickleHeap::kBytesPerObject);
    FlatIndex keys(n);
    md.entries.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const Ref k = h_.items(sdm)[2 * i];
      DcpEntry e = entry(k, h_.items(sdm)[2 * i + 1]);
      // Python's dict has each key once; a pickle can list one twice (SETITEMS appends).
      const std::string_view fqn = e.fqn;
      const size_t at = md.entries.size();
      if (keys.find_or_add(name_hash(fqn), at,
                           [&](uint32_t j) { return md.entries[j].fqn == fqn; }) != at)
        fail(ErrorCode::kCorrupt, "state_dict_metadata lists the key twice", e.fqn);
      if (const Ref p = planner.find(e.fqn); p != kNoRef) {
        path(p, e);
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
  }

  void read_storage(Ref root, DcpMetadata& md) const {
    const Ref sd = field(root, "storage_data");
    if (!is_dict(sd))
      fail(ErrorCode::kUnsupported,
           "storage_data is " + show(sd, "missing") +
               ", not a dict of _StorageInfo (a storage layout this reader does not know)");
    const size_t n = h_.dict_size(sd);
    if (n > limits_.max_tensors)
      fail(ErrorCode::kLimitExceeded, std::to_string(n) + " storage items (limit " +
                                          std::to_string(limits_.max_tensors) + ")");
    FlatIndex items(n);
    md.storage.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      md.storage.push_back(storage(h_.items(sd)[2 * i], h_.items(sd)[2 * i + 1]));
      const DcpStorage& s = md.storage.back();
      const DcpItemKey key{s.fqn, s.chunk_offsets};
      if (items.find_or_add(DcpItemKeyHash{}(key), i, [&](uint32_t j) {
            return DcpItemKey{md.storage[j].fqn, md.storage[j].chunk_offsets} == key;
          }) != i)
        fail(ErrorCode::kCorrupt,
             "storage_data lists the item at chunk offsets " + offsets_text(s.chunk_offsets) +
                 " twice",
             s.fqn);
    }
  }

  // planner_data: fqn -> its path, looked up once per key (a dict of 400,000 keys).
  struct PlannerPaths {
    std::vector<std::pair<std::string_view, Ref>> paths;  // (fqn, path)
    FlatIndex index;
    Ref find(std::string_view fqn) const {
      const uint32_t i =
          index.find(name_hash(fqn), [&](uint32_t j) { return paths[j].first == fqn; });
      return i == FlatIndex::kNone ? kNoRef : paths[i].second;
    }
  };
  PlannerPaths planner_paths(Ref planner) const {
    if (!is_dict(planner)) return {};
    const size_t n = h_.dict_size(planner);
    PlannerPaths out{{}, FlatIndex(n)};
    out.paths.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const Ref k = h_.items(planner)[2 * i], v = h_.items(planner)[2 * i + 1];
      if (!is_string(k) || !is_sequence(v) || h_.items(v).empty()) continue;
      const std::string_view fqn = h_.text(k);
      const size_t at = out.paths.size();
      if (out.index.find_or_add(name_hash(fqn), at,
                                [&](uint32_t j) { return out.paths[j].first == fqn; }) != at)
        fail(ErrorCode::kCorrupt, "planner_data lists the key twice", std::string(fqn));
      out.paths.emplace_back(fqn, v);
    }
    return out;
  }

  // A planner_data path: strings (dict keys) and non-negative ints (list positions), no longer
  // than the tree may nest. Its steps become Values, one per distinct string or int.
  void path(Ref p, DcpEntry& e) {
    auto steps = h_.items(p);
    if (steps.size() > limits_.max_pickle_depth)
      fail(ErrorCode::kLimitExceeded,
           "planner_data path has " + std::to_string(steps.size()) +
               " steps, deeper than Limits::max_pickle_depth (" +
               std::to_string(limits_.max_pickle_depth) + ")",
           e.fqn);
    for (Ref part : steps)
      if (!is_string(part) && !is_uint(part))
        fail(ErrorCode::kCorrupt, "planner_data path holds " + show(part, "null"), e.fqn);
    e.path.reserve(steps.size());
    for (Ref part : steps) e.path.push_back(step_value(part));
  }

  // The Value of a path step (a string or a non-negative int), made once per distinct value.
  const ValuePtr& step_value(Ref part) {
    return is_string(part) ? steps_.string(h_.text(part)) : steps_.integer(h_.int_value(part));
  }

  static std::string offsets_text(const std::vector<int64_t>& o) {
    std::string s = "[";
    for (size_t i = 0; i < o.size(); ++i) s += (i ? ", " : "") + std::to_string(o[i]);
    return s + "]";
  }

 private:
  using Kind = Value::Kind;
  const PickleHeap& h_;
  std::string source_;
  const Limits& limits_;
  uint64_t metadata_bytes_;
  PathSteps steps_;  // the path steps made so far: one Value per distinct string or int
};

}  // namespace

DcpMetadata read_dcp_metadata_generic(std::span<const std::byte> data, const std::string& source,
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
  DcpMetadata md;
  unpickle_heap(data, hooks, o, [&](const PickleHeap& heap, Ref root) {
    md = Reader(heap, source, limits, data.size()).read(root);
  });
  return md;
}

DcpMetadata read_dcp_metadata(std::span<const std::byte> data, const std::string& source,
                              const Limits& limits) {
  if (data.size() <= limits.max_metadata_bytes)
    if (std::optional<DcpMetadata> md = read_dcp_metadata_direct(data, limits))
      return *std::move(md);
  return read_dcp_metadata_generic(data, source, limits);
}

bool same_metadata(const DcpMetadata& a, const DcpMetadata& b) {
  if (a.version != b.version || a.mcore_keys != b.mcore_keys ||
      a.entries.size() != b.entries.size() || a.storage.size() != b.storage.size())
    return false;
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const auto &x = a.entries[i], &y = b.entries[i];
    if (x.fqn != y.fqn || x.is_bytes != y.is_bytes || x.dtype != y.dtype || x.size != y.size ||
        x.chunks.size() != y.chunks.size() || x.path.size() != y.path.size())
      return false;
    for (size_t c = 0; c < x.chunks.size(); ++c)
      if (x.chunks[c].offsets != y.chunks[c].offsets || x.chunks[c].sizes != y.chunks[c].sizes)
        return false;
    for (size_t p = 0; p < x.path.size(); ++p)
      if (x.path[p]->repr(80) != y.path[p]->repr(80)) return false;
  }
  for (size_t i = 0; i < a.storage.size(); ++i) {
    const auto &x = a.storage[i], &y = b.storage[i];
    if (x.fqn != y.fqn || x.chunk_offsets != y.chunk_offsets ||
        x.relative_path != y.relative_path || x.offset != y.offset || x.length != y.length ||
        x.transformed != y.transformed || x.transforms != y.transforms)
      return false;
  }
  return true;
}

}  // namespace ckpt::internal
