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

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "formats/dcp/dcp_metadata.h"
#include "formats/dcp/dcp_planner_paths.h"
#include "formats/dcp/flat_index.h"
#include "pickle/heap.h"
#include "pickle/opcodes.h"
#include "util/text.h"

namespace ckpt::internal {
namespace {

struct GiveUp {};
[[noreturn, gnu::noinline]] void give_up() { throw GiveUp{}; }

// Kinds of values. Plain values may be memoized, fetched and put in tuples; records (kChunk to
// kMeta) are indexes into the reader's tables and live in one place only.
enum class K : uint8_t {
  kNone,
  kBool,
  kInt,
  kStr,     // payload: the offset of its opcode
  kGlobal,  // payload: Cls | extra << 8 (torch globals: dtype + 1, kStrided)
  kTuple,   // payload: start in pool_ | count << 32
  kSize,    // torch.Size of non-negative ints: as kTuple, its ints
  kLayout,  // _get_layout(str): payload 1 for 'torch.strided'
  kProps,   // TensorProperties: payload dtype
  kOpaque,  // anything not read (a call of another class, a float, bytes)
  kList,    // payload: index in conts_
  kDict,    // payload: index in conts_ (k0, v0, k1, v1...)
  kObj,     // an object before BUILD: payload Cls
  kChunk,   // payload: index in chunks_
  kTensor,  // payload: index in tensors_
  kBytes,   // BytesStorageMetadata: index in tensors_ (an entry with is_bytes)
  kIndex,   // MetadataIndex: index in indexes_
  kInfo,    // _StorageInfo: index in infos_
  kMeta,    // Metadata: index in conts_ of its state dict
};

// 5 bits of kind, 8 of height (the longest path below, an upper bound of the VM's), 51 of payload.
struct V {
  uint64_t bits = 0;
  K k() const { return static_cast<K>(bits & 31); }
  uint32_t h() const { return (bits >> 5) & 255; }
  uint64_t u() const { return bits >> 13; }
  int64_t i() const { return static_cast<int64_t>(bits) >> 13; }
  uint32_t start() const { return static_cast<uint32_t>(u()); }
  uint32_t count() const { return static_cast<uint32_t>(u() >> 32); }
  static V make(K k, uint64_t payload, uint32_t h = 0) {
    return V{static_cast<uint64_t>(k) | uint64_t{h} << 5 | payload << 13};
  }
};
constexpr uint32_t kMaxHeight = 200;
constexpr size_t kThreadedItems = 2 * 20000;  // storage_data's keys and values
constexpr int64_t kIntBound = int64_t{1} << 50;

enum Cls : uint8_t {
  kForeign,  // not on the generic reader's allow-list: an opaque class
  kAllowed,  // allowed, not read (_MEM_FORMAT_ENCODING)
  kTorch,    // torch.<name>: dtypes, torch.strided
  kTorchSize,
  kGetLayout,
  kMetadataCls,
  kTensorCls,
  kBytesCls,
  kChunkCls,
  kIndexCls,
  kInfoCls,
  kPropsCls,
  kStorageMetaCls,
};
constexpr uint64_t kStrided = 1u << 16;

// The generic reader's allow-list (known_global in dcp_metadata.cc), by class.
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

class Direct {
 public:
  Direct(std::span<const std::byte> data, const Limits& limits)
      : p_(reinterpret_cast<const uint8_t*>(data.data())), end_(data.size()), limits_(limits) {
    node_limit_ = std::min<uint64_t>(
        limits.object_bytes_for(data.size()) / PickleHeap::kBytesPerObject, UINT32_MAX);
    node_limit_ = node_limit_ > 64 ? node_limit_ - 64 : 0;
    args_left_ = 4 * static_cast<uint64_t>(data.size()) + (1u << 20);
    // Virtual memory only until used: a pickle of 220 MB fills about this much of each.
    memo_.reserve(std::min<size_t>(data.size() / 16, limits.max_pickle_memo));
    pool_.reserve(data.size() / 16);
  }

  DcpMetadata run() {
    if (end_ >= (uint64_t{1} << 32) || limits_.max_pickle_depth < 32) give_up();
    const V root = loop();
    if (root.k() != K::kMeta || root.h() + 2 > limits_.max_pickle_depth) give_up();
    return result(conts_[root.u()]);
  }

 private:
  // --- input -----------------------------------------------------------------------------------
  void need(uint64_t n) const {
    if (n > end_ - pos_) give_up();
  }
  template <typename T>
  T le() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view line() {
    const void* nl = std::memchr(p_ + pos_, '\n', end_ - pos_);
    if (!nl) give_up();
    const size_t n = static_cast<const uint8_t*>(nl) - (p_ + pos_);
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n + 1;
    return s;
  }
  // A string value's text, from its opcode.
  std::string_view str(V v) const {
    const uint8_t* at = p_ + v.u();
    uint64_t n = 0;
    size_t head = 0;
    if (*at == op::kShortBinUnicode) {
      n = at[1];
      head = 2;
    } else if (*at == op::kBinUnicode) {
      uint32_t n32;
      std::memcpy(&n32, at + 1, 4);
      n = n32;
      head = 5;
    } else {
      std::memcpy(&n, at + 1, 8);
      head = 9;
    }
    return {reinterpret_cast<const char*>(at + head), n};
  }
  void string(size_t op_at, uint64_t n) {
    need(n);
    if (!is_utf8({reinterpret_cast<const char*>(p_ + pos_), n}, Surrogates::kAllow)) give_up();
    pos_ += n;
    node();
    push(V::make(K::kStr, op_at));
  }

  // --- stack, memo, budgets
  // ------------------------------------------------------------------------
  void node() {
    if (++nodes_ > node_limit_) give_up();
  }
  void push(V v) {
    if (stack_.size() + marks_.size() + 1 >= limits_.max_pickle_stack) give_up();
    stack_.push_back(v);
  }
  size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  V pop() {
    if (stack_.size() <= fence()) give_up();
    const V v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t pop_mark() {
    if (marks_.empty()) give_up();
    const size_t k = marks_.back();
    marks_.pop_back();
    return k;
  }
  void memo_put(uint64_t id) {
    if (stack_.size() <= fence()) give_up();
    const V v = stack_.back();
    if (v.k() >= K::kChunk) give_up();  // a record lives in one place
    if (id == memo_.size()) {
      if (memo_.size() + 1 >= limits_.max_pickle_memo) give_up();
      memo_.push_back(v);
    } else if (id < memo_.size()) {
      memo_[id] = v;
    } else {
      give_up();
    }
  }
  void memo_get(uint64_t id) {
    if (id >= memo_.size()) give_up();
    const V v = memo_[id];
    if (v.k() >= K::kList) give_up();  // shared mutable objects: the generic reader's
    push(v);
  }
  uint32_t height(V v) const {
    return v.k() == K::kList || v.k() == K::kDict ? cont_h_[v.u()] : v.h();
  }
  static uint32_t above(uint32_t h) {
    if (h >= kMaxHeight) give_up();
    return h + 1;
  }

  // --- containers -------------------------------------------------------------------------------
  uint32_t new_container() {
    node();
    if (!free_.empty()) {
      const uint32_t c = free_.back();
      free_.pop_back();
      cont_h_[c] = 0;
      return c;
    }
    conts_.emplace_back();
    cont_h_.push_back(0);
    return static_cast<uint32_t>(conts_.size() - 1);
  }
  // A container that a BUILD read: its memo entry is never fetched, so it is reused.
  void release(V v) {
    conts_[v.u()].clear();
    free_.push_back(static_cast<uint32_t>(v.u()));
  }
  // Moves stack_[k...] into container c (a list, or a dict: pairs).
  void fill(uint32_t c, size_t k) {
    uint32_t h = cont_h_[c];
    for (size_t i = k; i < stack_.size(); ++i) h = std::max(h, above(height(stack_[i])));
    cont_h_[c] = h;
    conts_[c].insert(conts_[c].end(), stack_.begin() + k, stack_.end());
    stack_.resize(k);
  }
  V& container_below(size_t k, K want) {
    if (k == 0 || k - 1 < fence() || stack_[k - 1].k() != want) give_up();
    return stack_[k - 1];
  }
  void tuple(size_t k) {
    if (k > stack_.size() || k < fence()) give_up();
    const size_t n = stack_.size() - k;
    if (n >= (1u << 19) || pool_.size() + n >= (uint64_t{1} << 32)) give_up();
    uint32_t h = 0;
    for (size_t i = k; i < stack_.size(); ++i) {
      if (stack_[i].k() >= K::kList) give_up();  // only plain values are shared by tuples
      h = std::max(h, above(stack_[i].h()));
    }
    const uint64_t start = pool_.size();
    for (size_t i = k; i < stack_.size(); ++i) pool_.push_back(stack_[i]);
    stack_.resize(k);
    node();
    push(V::make(K::kTuple, start | uint64_t{n} << 32, h));
  }
  std::span<const V> items(V t) const { return {pool_.data() + t.start(), t.count()}; }

  // --- globals and calls
  // --------------------------------------------------------------------------
  void global(std::string_view m, std::string_view n) {
    const Cls c = class_of(m, n);
    uint64_t extra = 0;
    if (c == kTorch) {
      if (auto dt = dtype_from_name(n); dt && n.find('.') == std::string_view::npos)
        extra = 1 + static_cast<uint64_t>(*dt);
      if (n == "strided") extra |= kStrided;
    }
    node();
    push(V::make(K::kGlobal, c | extra << 8));
  }
  void call(bool new_obj) {
    const V args = pop(), callable = pop();
    if (callable.k() != K::kGlobal || args.k() != K::kTuple) give_up();
    const auto a = items(args);
    if (a.size() > args_left_) give_up();
    args_left_ -= a.size();
    node();
    const uint32_t h = above(args.h());
    const Cls c = static_cast<Cls>(callable.u() & 255);
    switch (c) {
      case kTorchSize:
        if (a.size() == 1 && a[0].k() == K::kTuple && all_uints(items(a[0])))
          return push(V::make(K::kSize, a[0].u(), h));
        return push(V::make(K::kOpaque, 0, h));
      case kGetLayout:
        if (a.size() == 1 && a[0].k() == K::kStr)
          return push(V::make(K::kLayout, str(a[0]) == "torch.strided", h));
        return push(V::make(K::kOpaque, 0, h));
      case kMetadataCls:
      case kTensorCls:
      case kBytesCls:
      case kChunkCls:
      case kIndexCls:
      case kInfoCls:
      case kPropsCls:
        if (!a.empty()) give_up();
        return push(V::make(K::kObj, c, h));
      default:
        return push(new_obj ? V::make(K::kObj, c, h) : V::make(K::kOpaque, 0, h));
    }
  }
  static bool all_uints(std::span<const V> s) {
    for (V v : s)
      if (v.k() != K::kInt || v.i() < 0) return false;
    return true;
  }

  // --- BUILD: the dataclasses
  // ---------------------------------------------------------------------
  void build() {
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
  const std::vector<V>& dict(V state) const {
    if (state.k() != K::kDict) give_up();
    return conts_[state.u()];
  }
  // The first entry under a string key (as the generic reader's field()); kNone kind if absent.
  V field(const std::vector<V>& d, std::string_view name, bool* found = nullptr) const {
    for (size_t i = 0; i + 1 < d.size(); i += 2)
      if (d[i].k() == K::kStr && str(d[i]) == name) {
        if (found) *found = true;
        return d[i + 1];
      }
    if (!found) give_up();
    *found = false;
    return V{};
  }
  void ints(V v, std::vector<int64_t>& out) const {
    if (v.k() == K::kTuple && !all_uints(items(v))) give_up();
    if ((v.k() != K::kSize && v.k() != K::kTuple) || v.count() > limits_.max_dims) give_up();
    out.reserve(v.count());
    for (V d : items(v)) out.push_back(d.i());
  }
  V props(V state, uint32_t h) const {
    if (state.k() != K::kTuple || state.count() < 2) give_up();
    const V dt = items(state)[0], layout = items(state)[1];
    if (dt.k() != K::kGlobal || (dt.u() & 255) != kTorch || ((dt.u() >> 8) & 0xffff) == 0)
      give_up();
    const bool strided = layout.k() == K::kNone || (layout.k() == K::kLayout && layout.u() == 1) ||
                         (layout.k() == K::kGlobal && (layout.u() & 255) == kTorch &&
                          ((layout.u() >> 8) & kStrided));
    if (!strided) give_up();
    return V::make(K::kProps, ((dt.u() >> 8) & 0xffff) - 1, h);
  }
  V tensor(V state, uint32_t h) {
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
  V index(V state, uint32_t h) {
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
  V info(V state, uint32_t h) {
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

  V loop();
  DcpMetadata result(const std::vector<V>& root);
  void entries(V sdm, V planner, DcpMetadata& md);
  void storage(V sd, DcpMetadata& md);

  struct Index {
    V fqn;
    std::vector<int64_t> offsets;
  };
  struct Info {
    V path;
    uint64_t offset = 0, length = 0;
  };

  const uint8_t* p_;
  uint64_t end_;
  uint64_t pos_ = 0;
  const Limits& limits_;
  uint64_t nodes_ = 8, node_limit_ = 0, args_left_ = 0;
  std::vector<V> stack_;
  std::vector<size_t> marks_;
  std::vector<V> memo_;
  std::vector<V> pool_;                // tuple elements
  std::vector<std::vector<V>> conts_;  // list and dict contents
  std::vector<uint32_t> cont_h_;       // their heights
  std::vector<uint32_t> free_;         // conts_ that a BUILD read, to reuse
  std::vector<DcpChunk> chunks_;
  std::vector<DcpEntry> tensors_;
  std::vector<Index> indexes_;
  std::vector<Info> infos_;
  PathSteps steps_;
};

V Direct::loop() {
  while (pos_ < end_) {
    const size_t at = pos_;
    switch (p_[pos_++]) {
      case op::kProto:
        if (le<uint8_t>() > 5) give_up();
        break;
      case op::kFrame:
        need(le<uint64_t>());
        break;
      case op::kStop: {
        const V v = pop();
        if (!stack_.empty() || !marks_.empty()) give_up();
        return v;
      }
      case op::kMark:
        if (stack_.size() + marks_.size() + 1 >= limits_.max_pickle_stack) give_up();
        marks_.push_back(stack_.size());
        break;
      case op::kNone:
        push(V::make(K::kNone, 0));
        break;
      case op::kNewTrue:
      case op::kNewFalse:
        push(V::make(K::kBool, p_[at] == op::kNewTrue));
        break;
      case op::kBinInt1:
        node();
        push(V::make(K::kInt, le<uint8_t>()));
        break;
      case op::kBinInt2:
        node();
        push(V::make(K::kInt, le<uint16_t>()));
        break;
      case op::kBinInt: {
        node();
        const int64_t v = le<int32_t>();
        push(V::make(K::kInt, static_cast<uint64_t>(v)));
        break;
      }
      case op::kLong1: {
        const uint8_t n = le<uint8_t>();
        need(n);
        if (n > 7) give_up();
        uint64_t v = 0;
        for (int b = n - 1; b >= 0; --b) v = v << 8 | p_[pos_ + b];
        if (n && (p_[pos_ + n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);  // negative
        pos_ += n;
        const int64_t s = static_cast<int64_t>(v);
        if (s >= kIntBound || s < -kIntBound) give_up();
        node();
        push(V::make(K::kInt, v));
        break;
      }
      case op::kBinFloat:
        need(8);
        pos_ += 8;
        node();
        push(V::make(K::kOpaque, 0));
        break;
      case op::kShortBinUnicode:
        string(at, le<uint8_t>());
        break;
      case op::kBinUnicode:
        string(at, le<uint32_t>());
        break;
      case op::kBinUnicode8:
        string(at, le<uint64_t>());
        break;
      case op::kEmptyTuple:
        push(V::make(K::kTuple, 0));
        break;
      case op::kTuple:
        tuple(pop_mark());
        break;
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3: {
        const size_t n = p_[at] - op::kTuple1 + 1;
        if (stack_.size() < fence() + n) give_up();
        tuple(stack_.size() - n);
        break;
      }
      case op::kEmptyList:
        push(V::make(K::kList, new_container()));
        break;
      case op::kEmptyDict:
        push(V::make(K::kDict, new_container()));
        break;
      case op::kList:
      case op::kDict: {
        const size_t k = pop_mark();
        const bool dict = p_[at] == op::kDict;
        if (dict && (stack_.size() - k) % 2) give_up();
        const uint32_t c = new_container();
        fill(c, k);
        push(V::make(dict ? K::kDict : K::kList, c));
        break;
      }
      case op::kAppend:
        if (stack_.size() < fence() + 2) give_up();
        fill(container_below(stack_.size() - 1, K::kList).u(), stack_.size() - 1);
        break;
      case op::kAppends: {
        const size_t k = pop_mark();
        fill(container_below(k, K::kList).u(), k);
        break;
      }
      case op::kSetItem:
        if (stack_.size() < fence() + 3) give_up();
        fill(container_below(stack_.size() - 2, K::kDict).u(), stack_.size() - 2);
        break;
      case op::kSetItems: {
        const size_t k = pop_mark();
        const uint32_t c = container_below(k, K::kDict).u();
        if ((stack_.size() - k) % 2) give_up();
        fill(c, k);
        break;
      }
      case op::kBinGet:
        memo_get(le<uint8_t>());
        break;
      case op::kLongBinGet:
        memo_get(le<uint32_t>());
        break;
      case op::kBinPut:
        memo_put(le<uint8_t>());
        break;
      case op::kLongBinPut:
        memo_put(le<uint32_t>());
        break;
      case op::kMemoize:
        memo_put(memo_.size());
        break;
      case op::kGlobal: {
        const std::string_view m = line(), n = line();
        global(m, n);
        break;
      }
      case op::kStackGlobal: {
        const V n = pop(), m = pop();
        if (m.k() != K::kStr || n.k() != K::kStr) give_up();
        global(str(m), str(n));
        break;
      }
      case op::kReduce:
      case op::kNewObj:
        call(p_[at] == op::kNewObj);
        break;
      case op::kBuild:
        build();
        break;
      default:
        give_up();  // an opcode this reader does not read: the generic reader's
    }
  }
  give_up();  // no STOP
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
    other = std::thread([&] {
      try {
        storage(sd, md);
      } catch (...) {  // GiveUp, or out of memory: the generic reader's
        storage_ok = false;
      }
    });
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
  for (size_t i = 0; i < n; ++i) {
    const V k = d[2 * i], v = d[2 * i + 1];
    if (k.k() != K::kStr) give_up();
    const std::string_view fqn = str(k);
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
    const uint64_t hash = name_hash(fqn);
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
      if (!tree.add(e.path)) give_up();
    }
  }
}

void Direct::storage(V sd, DcpMetadata& md) {
  const std::vector<V>& d = conts_[sd.u()];
  const size_t n = d.size() / 2;
  if (n > limits_.max_tensors) give_up();
  FlatIndex seen(n);
  md.storage.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const V k = d[2 * i], v = d[2 * i + 1];
    if (k.k() != K::kIndex || v.k() != K::kInfo) give_up();
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
    if (seen.find_or_add(DcpItemKeyHash{}(key), i, [&](uint32_t j) {
          return DcpItemKey{md.storage[j].fqn, md.storage[j].chunk_offsets} == key;
        }) != i)
      give_up();
  }
}

}  // namespace

std::optional<DcpMetadata> read_dcp_metadata_direct(std::span<const std::byte> data,
                                                    const Limits& limits) {
  try {
    return Direct(data, limits).run();
  } catch (const GiveUp&) {
    return std::nullopt;
  } catch (const std::bad_alloc&) {
    return std::nullopt;  // the generic reader reports it, naming the file
  }
}

}  // namespace ckpt::internal
