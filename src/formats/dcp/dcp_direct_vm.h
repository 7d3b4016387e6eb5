#pragma once
// The direct `.metadata` reader's machine (dcp_metadata_direct.cc has what it reads and why it is
// safe): its 8-byte values, the classes it knows, and class Direct, whose opcode loop is in
// dcp_direct_ops.cc and whose dataclass records and result are in dcp_metadata_direct.cc.
// Internal to those two files.
//
// Layer: formats. Thread-safety: one Direct per reading; result() runs two threads of its own.

#include <algorithm>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "ckpt/options.h"
#include "formats/dcp/dcp_metadata.h"
#include "formats/dcp/dcp_planner_paths.h"
#include "pickle/heap.h"
#include "pickle/opcodes.h"
#include "util/text.h"

namespace ckpt::internal::dcp_direct {

struct GiveUp {};
[[noreturn, gnu::noinline]] inline void give_up() { throw GiveUp{}; }

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
constexpr size_t kAhead = 8;  // hash-index lookups prefetched this many keys ahead

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
Cls class_of(std::string_view m, std::string_view n);

class Direct {
 public:
  Direct(std::span<const std::byte> data, const Limits& limits)
      : p_(reinterpret_cast<const uint8_t*>(data.data())), end_(data.size()), limits_(limits) {
    node_limit_ = std::min<uint64_t>(
        limits.object_bytes_for(data.size()) / PickleHeap::kBytesPerObject, UINT32_MAX);
    node_limit_ = node_limit_ > 64 ? node_limit_ - 64 : 0;
    args_left_ = 4 * static_cast<uint64_t>(data.size()) + (1u << 20);
    // Virtual memory until used. ckpt's 220 MB pickle of 400,000 keys fills 15.7 million memo
    // entries and 6.2 million tuple elements; growing past the reservation copied them all.
    memo_.reserve(std::min<size_t>(data.size() / 10, limits.max_pickle_memo));
    pool_.reserve(data.size() / 24);
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

  // --- stack, memo, budgets ---------------------------------------------------------------------
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

  // --- globals and calls -----------------------------------------------------------------------
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

  // --- BUILD: each dataclass made a record (dcp_metadata_direct.cc) -------------------------
  void build();
  const std::vector<V>& dict(V state) const;
  // The first entry under a string key (as the generic reader's field()); without `found`, giving
  // up when there is none.
  V field(const std::vector<V>& d, std::string_view name, bool* found = nullptr) const;
  void ints(V v, std::vector<int64_t>& out) const;
  V props(V state, uint32_t h) const;
  V tensor(V state, uint32_t h);
  V index(V state, uint32_t h);
  V info(V state, uint32_t h);
  V loop();
  bool value_op(uint8_t code, size_t at);
  bool structure_op(uint8_t code, size_t at);
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

}  // namespace ckpt::internal::dcp_direct
