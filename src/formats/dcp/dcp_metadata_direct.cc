// The direct `.metadata` reader (dcp_metadata.h): DCP's structures made as the pickle's opcodes
// run, without the generic heap. For 400,000 keys the heap held 16.5 million nodes (396 MB) that
// were made, checked and copied out once more; here a value is 8 bytes, each dataclass becomes
// its DcpChunk / DcpEntry / storage item at its BUILD, and the state dicts that BUILD consumed are
// reused for the next ones.
//
// Safety by construction: the reader gives up (nullopt) on anything outside what it reads, and
// the generic reader then runs. It never refuses with its own error, so every error is the
// generic reader's. What it accepts, the generic reader would accept with the same result:
//  - values are None, bools, ints that fit 51 bits, UTF-8 strings (views of the input), globals,
//    tuples, lists, dicts, and objects of the classes below; other opcodes give up;
//  - a list, a dict, or an object before its BUILD is never fetched from the memo (giving up), so
//    nothing mutable is shared and no cycle can form; dataclass records never enter the memo or
//    a tuple, so each is used once;
//  - the limits: memo entries and stack depth as the VM counts them; every node the VM would make
//    (counted per opcode, an upper bound) against the object budget; objects' argument copies;
//    the result's height (an upper bound) against max_pickle_depth; tensors, dimensions and
//    planner paths as the generic reader bounds them. Near a limit it gives up rather than decide.

#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "formats/dcp/dcp_direct_vm.h"
#include "formats/dcp/flat_index.h"

namespace ckpt::internal {
namespace dcp_direct {

Cls class_of(std::string_view m, std::string_view n) {
  constexpr std::string_view kMd = "torch.distributed.checkpoint.metadata";
  constexpr std::string_view kSharded = "torch.distributed._shard.sharded_tensor.metadata";
  if (m == "torch") return n == "Size" ? kTorchSize : kTorch;
  if (m == "torch.serialization" && n == "_get_layout") return kGetLayout;
  if (m == kMd || m == kSharded) {
    if (n == "TensorProperties") return kPropsCls;
    if (n == "_MEM_FORMAT_ENCODING") return kAllowed;
  }
  if (m == kMd) {
    if (n == "Metadata") return kMetadataCls;
    if (n == "TensorStorageMetadata") return kTensorCls;
    if (n == "BytesStorageMetadata") return kBytesCls;
    if (n == "ChunkStorageMetadata") return kChunkCls;
    if (n == "MetadataIndex") return kIndexCls;
    if (n == "StorageMeta") return kStorageMetaCls;
  }
  if (m == "torch.distributed.checkpoint.filesystem" && n == "_StorageInfo") return kInfoCls;
  return kForeign;
}

void Direct::build() {
  const V state = pop();
  if (stack_.size() <= fence()) give_up();
  V& obj = stack_.back();
  if (obj.k() != K::kObj || state.k() == K::kNone) give_up();
  const uint32_t h = above(std::max(obj.h(), height(state)));
  switch (static_cast<Cls>(obj.u())) {
    case kPropsCls:
      obj = props(state, h);
      return;
    case kChunkCls: {
      const auto& d = dict(state);
      DcpChunk ch;
      ints(field(d, "offsets"), ch.offsets);
      ints(field(d, "sizes"), ch.sizes);
      chunks_.push_back(std::move(ch));
      release(state);
      obj = V::make(K::kChunk, chunks_.size() - 1, h);
      return;
    }
    case kTensorCls:
      obj = tensor(state, h);
      return;
    case kBytesCls: {
      DcpEntry e;
      e.is_bytes = true;
      tensors_.push_back(std::move(e));
      obj = V::make(K::kBytes, tensors_.size() - 1, h);
      return;
    }
    case kIndexCls:
      obj = index(state, h);
      return;
    case kInfoCls:
      obj = info(state, h);
      return;
    case kMetadataCls:
      if (state.k() != K::kDict) give_up();
      obj = V::make(K::kMeta, state.u(), h);
      return;
    default:
      obj = V::make(K::kOpaque, 0, h);
  }
}
const std::vector<V>& Direct::dict(V state) const {
  if (state.k() != K::kDict) give_up();
  return conts_[state.u()];
}
// The first entry under a string key (as the generic reader's field()); kNone kind if absent.
V Direct::field(const std::vector<V>& d, std::string_view name, bool* found) const {
  for (size_t i = 0; i + 1 < d.size(); i += 2)
    if (d[i].k() == K::kStr && str(d[i]) == name) {
      if (found) *found = true;
      return d[i + 1];
    }
  if (!found) give_up();
  *found = false;
  return V{};
}
void Direct::ints(V v, std::vector<int64_t>& out) const {
  if (v.k() == K::kTuple && !all_uints(items(v))) give_up();
  if ((v.k() != K::kSize && v.k() != K::kTuple) || v.count() > limits_.max_dims) give_up();
  out.reserve(v.count());
  for (V d : items(v)) out.push_back(d.i());
}
V Direct::props(V state, uint32_t h) const {
  if (state.k() != K::kTuple || state.count() < 2) give_up();
  const V dt = items(state)[0], layout = items(state)[1];
  if (dt.k() != K::kGlobal || (dt.u() & 255) != kTorch || ((dt.u() >> 8) & 0xffff) == 0) give_up();
  const bool strided =
      layout.k() == K::kNone || (layout.k() == K::kLayout && layout.u() == 1) ||
      (layout.k() == K::kGlobal && (layout.u() & 255) == kTorch && ((layout.u() >> 8) & kStrided));
  if (!strided) give_up();
  return V::make(K::kProps, ((dt.u() >> 8) & 0xffff) - 1, h);
}
V Direct::tensor(V state, uint32_t h) {
  const auto& d = dict(state);
  const V p = field(d, "properties"), chunks = field(d, "chunks");
  if (p.k() != K::kProps) give_up();
  DcpEntry e;
  e.dtype = static_cast<DType>(p.u());
  ints(field(d, "size"), e.size);
  std::span<const V> cs;
  if (chunks.k() == K::kList)
    cs = conts_[chunks.u()];
  else if (chunks.k() != K::kTuple || chunks.count() != 0)
    give_up();  // a tuple holds no records
  e.chunks.reserve(cs.size());
  for (V c : cs) {
    if (c.k() != K::kChunk) give_up();
    e.chunks.push_back(std::move(chunks_[c.u()]));
  }
  if (chunks.k() == K::kList) release(chunks);
  release(state);
  tensors_.push_back(std::move(e));
  return V::make(K::kTensor, tensors_.size() - 1, h);
}
V Direct::index(V state, uint32_t h) {
  const auto& d = dict(state);
  Index ix;
  ix.fqn = field(d, "fqn");
  if (ix.fqn.k() != K::kStr) give_up();
  bool found = false;
  const V off = field(d, "offset", &found);
  if (found && off.k() != K::kNone) ints(off, ix.offsets);
  release(state);
  indexes_.push_back(std::move(ix));
  return V::make(K::kIndex, indexes_.size() - 1, h);
}
V Direct::info(V state, uint32_t h) {
  const auto& d = dict(state);
  Info in;
  in.path = field(d, "relative_path");
  const V off = field(d, "offset"), len = field(d, "length");
  if (in.path.k() != K::kStr || off.k() != K::kInt || off.i() < 0 || len.k() != K::kInt ||
      len.i() < 0)
    give_up();
  in.offset = off.u();
  in.length = len.u();
  bool found = false;
  const V tr = field(d, "transform_descriptors", &found);
  if (found && tr.k() != K::kNone && !(tr.k() == K::kTuple && tr.count() == 0) &&
      !(tr.k() == K::kList && conts_[tr.u()].empty()))
    give_up();  // transforms: the generic reader names them
  release(state);
  infos_.push_back(in);
  return V::make(K::kInfo, infos_.size() - 1, h);
}

DcpMetadata Direct::result(const std::vector<V>& root) {
  V sdm, planner, sd;
  bool seen[4] = {};
  DcpMetadata md;
  for (size_t i = 0; i + 1 < root.size(); i += 2) {
    if (root[i].k() != K::kStr) continue;
    const std::string_view key = str(root[i]);
    const V v = root[i + 1];
    auto first = [&](int n, V& out) {
      if (!seen[n]) out = v;
      seen[n] = true;
    };
    if (key == "state_dict_metadata") first(0, sdm);
    if (key == "planner_data") first(1, planner);
    if (key == "storage_data") first(2, sd);
    if (key == "version" && !seen[3]) {
      seen[3] = true;
      if (v.k() == K::kStr) md.version = str(v);
    }
    if (key == "mcore_data") give_up();  // Megatron-core: the generic reader's
  }
  if (sdm.k() != K::kDict || sd.k() != K::kDict) give_up();
  // The storage items on a second thread, beside the entries: they share no data (each record
  // is read by one of them), and each is a few hundred thousand allocations.
  bool storage_ok = true;
  std::thread other;
  if (conts_[sd.u()].size() >= kThreadedItems) {
    try {
      other = std::thread([&] {
        try {
          storage(sd, md);
        } catch (...) {  // GiveUp, or out of memory: the generic reader's
          storage_ok = false;
        }
      });
    } catch (const std::system_error&) {  // no thread to be had: both on this one
    }
  }
  try {
    entries(sdm, planner, md);
  } catch (...) {
    if (other.joinable()) other.join();
    throw;
  }
  if (other.joinable()) {
    other.join();
    if (!storage_ok) give_up();
  } else {
    storage(sd, md);
  }
  return md;
}

void Direct::entries(V sdm, V planner, DcpMetadata& md) {
  const std::vector<V>& d = conts_[sdm.u()];
  const size_t n = d.size() / 2;
  if (n > limits_.max_tensors) give_up();
  // planner_data: fqn -> path (a non-empty tuple); entries of other shapes are skipped, as the
  // generic reader skips them.
  std::vector<std::pair<std::string_view, V>> paths;
  FlatIndex path_index;
  if (planner.k() == K::kDict) {
    const std::vector<V>& pd = conts_[planner.u()];
    path_index = FlatIndex(pd.size() / 2);
    paths.reserve(pd.size() / 2);
    for (size_t i = 0; i + 1 < pd.size(); i += 2) {
      const V k = pd[i], v = pd[i + 1];
      if (v.k() == K::kList || v.k() == K::kSize) give_up();  // sequences read elsewhere
      if (k.k() != K::kStr || v.k() != K::kTuple || v.count() == 0) continue;
      const std::string_view fqn = str(k);
      const size_t at = paths.size();
      if (path_index.find_or_add(name_hash(fqn), at,
                                 [&](uint32_t j) { return paths[j].first == fqn; }) != at)
        give_up();
      paths.emplace_back(fqn, v);
    }
  }
  PathTree tree(limits_.object_bytes_for(end_) / PickleHeap::kBytesPerObject);
  FlatIndex keys(n);
  // The entries, as their BUILDs made them: in place when the dict lists them in that order
  // (every writer's case), else moved.
  bool in_place = tensors_.size() == n;
  for (size_t i = 0; i < n && in_place; ++i)
    in_place =
        (d[2 * i + 1].k() == K::kTensor || d[2 * i + 1].k() == K::kBytes) && d[2 * i + 1].u() == i;
  if (in_place) md.entries = std::move(tensors_);
  md.entries.reserve(n);
  // The keys hashed kAhead entries ahead, their slots prefetched.
  auto hash_of = [&](size_t j) { return d[2 * j].k() == K::kStr ? name_hash(str(d[2 * j])) : 0; };
  uint64_t ahead[kAhead];
  for (size_t j = 0; j < std::min(n, kAhead); ++j) ahead[j] = hash_of(j);
  for (size_t i = 0; i < n; ++i) {
    const V k = d[2 * i], v = d[2 * i + 1];
    if (k.k() != K::kStr) give_up();
    const std::string_view fqn = str(k);
    const uint64_t hash = ahead[i % kAhead];
    if (i + kAhead < n) {
      ahead[i % kAhead] = hash_of(i + kAhead);
      keys.prefetch(ahead[i % kAhead]);
      path_index.prefetch(ahead[i % kAhead]);
    }
    if (!in_place) {
      DcpEntry e;
      if (v.k() == K::kTensor || v.k() == K::kBytes)
        e = std::move(tensors_[v.u()]);
      else if (v.k() == K::kObj && v.u() == kBytesCls)
        e.is_bytes = true;
      else
        give_up();
      md.entries.push_back(std::move(e));
    }
    DcpEntry& e = md.entries[i];
    e.fqn = fqn;
    if (keys.find_or_add(hash, i, [&](uint32_t j) { return md.entries[j].fqn == fqn; }) != i)
      give_up();
    const uint32_t p = path_index.find(hash, [&](uint32_t j) { return paths[j].first == fqn; });
    if (p != FlatIndex::kNone) {
      const auto steps = items(paths[p].second);
      if (steps.size() > limits_.max_pickle_depth) give_up();
      e.path.reserve(steps.size());
      for (V s : steps) {
        if (s.k() == K::kStr)
          e.path.push_back(steps_.string(str(s)));
        else if (s.k() == K::kInt && s.i() >= 0)
          e.path.push_back(steps_.integer(s.i()));
        else
          give_up();
      }
    }
  }
  // The trie after the paths: each add() probes a slot of a megabytes index, prefetched here
  // two paths ahead.
  for (size_t i = 0; i < n; ++i) {
    if (i + 2 < n) tree.prefetch(md.entries[i + 2].path);
    if (!md.entries[i].path.empty() && !tree.add(md.entries[i].path)) give_up();
  }
}

void Direct::storage(V sd, DcpMetadata& md) {
  const std::vector<V>& d = conts_[sd.u()];
  const size_t n = d.size() / 2;
  if (n > limits_.max_tensors) give_up();
  FlatIndex seen(n);
  md.storage.reserve(n);
  auto hash_of = [&](size_t j) {
    if (d[2 * j].k() != K::kIndex) return uint64_t{0};
    const Index& ix = indexes_[d[2 * j].u()];
    return static_cast<uint64_t>(DcpItemKeyHash{}(DcpItemKey{str(ix.fqn), ix.offsets}));
  };
  uint64_t ahead[kAhead];
  for (size_t j = 0; j < std::min(n, kAhead); ++j) ahead[j] = hash_of(j);
  for (size_t i = 0; i < n; ++i) {
    const V k = d[2 * i], v = d[2 * i + 1];
    if (k.k() != K::kIndex || v.k() != K::kInfo) give_up();
    const uint64_t hash = ahead[i % kAhead];
    if (i + kAhead < n) {
      ahead[i % kAhead] = hash_of(i + kAhead);
      seen.prefetch(ahead[i % kAhead]);
    }
    Index& ix = indexes_[k.u()];  // each used once: a record is in one place
    const Info& in = infos_[v.u()];
    DcpStorage s;
    s.fqn = str(ix.fqn);
    s.chunk_offsets = std::move(ix.offsets);
    s.relative_path = str(in.path);
    s.offset = in.offset;
    s.length = in.length;
    md.storage.push_back(std::move(s));
    const DcpStorage& b = md.storage.back();
    const DcpItemKey key{b.fqn, b.chunk_offsets};
    if (seen.find_or_add(hash, i, [&](uint32_t j) {
          return DcpItemKey{md.storage[j].fqn, md.storage[j].chunk_offsets} == key;
        }) != i)
      give_up();
  }
}

}  // namespace dcp_direct

std::optional<DcpMetadata> read_dcp_metadata_direct(std::span<const std::byte> data,
                                                    const Limits& limits) {
  try {
    return dcp_direct::Direct(data, limits).run();
  } catch (const dcp_direct::GiveUp&) {
    return std::nullopt;
  } catch (const std::bad_alloc&) {
    return std::nullopt;  // the generic reader reports it, naming the file
  }
}

}  // namespace ckpt::internal
