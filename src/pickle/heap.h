#pragma once
// PickleHeap: the objects of one unpickle run, as compact nodes in one vector.
//
// Why not Value: a torch data.pkl makes ~15 objects per tensor (persistent-id tuple, size and
// stride tuples, ints, the backward-hooks OrderedDict, the argument tuple...), and the memo keeps
// every one of them alive until STOP. As shared_ptr<Value> (~220 bytes and one malloc each) that
// was 70% of opening a 20,000-tensor checkpoint and ~70 MB of transient memory. Here an object is
// a 24-byte Node addressed by a 32-bit Ref; strings that the pickle holds verbatim are views into
// the pickle bytes; tuples (immutable) live in one shared pool; only lists, sets and dicts own a
// growable vector. Everything dies with the heap, so nothing is freed one by one and reference
// cycles cannot leak. The public Value tree is built at the end (to_value) for what the result
// reaches, and nothing else.
//
// Refs stay valid for the heap's life; spans returned by items() are invalidated by any make_*
// or mutation: copy what you need first.

#include <complex>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ckpt/value.h"

namespace ckpt::internal {

using Ref = uint32_t;
constexpr Ref kNoRef = 0;  // "none given" (a hook's "not handled"), never a node

class CopyBudget;

class PickleHeap {
 public:
  using Kind = Value::Kind;

  // `input`: the pickle bytes, which must outlive the heap (verbatim strings point into them).
  explicit PickleHeap(std::span<const std::byte> input);

  // --- reading -------------------------------------------------------------------------------
  Kind kind(Ref r) const { return nodes_[r].kind; }
  bool truth(Ref r) const { return nodes_[r].kind == Kind::kBool && nodes_[r].b != 0; }
  // kInt that fits int64 (big ints keep only their digits: text()).
  bool is_small_int(Ref r) const {
    return nodes_[r].kind == Kind::kInt && !(nodes_[r].flags & kBig);
  }
  // kInt (0 for a big int), kBool (0/1), kTensor (its index), kObject (its tag).
  int64_t int_value(Ref r) const { return static_cast<int64_t>(nodes_[r].b); }
  double float_value(Ref r) const;  // kFloat
  std::complex<double> complex_value(Ref r) const;
  // kString (UTF-8), kBytes (raw), big kInt (decimal digits); "" otherwise.
  std::string_view text(Ref r) const;
  bool bytearray(Ref r) const { return nodes_[r].flags & kByteArray; }
  bool frozen(Ref r) const { return nodes_[r].flags & kFrozen; }  // kSet: a frozenset
  // kTuple/kList/kSet: the elements; kObject: the constructor arguments; kDict: k0, v0, k1, v1...
  std::span<const Ref> items(Ref r) const {
    const Node& n = nodes_[r];
    switch (n.kind) {
      case Kind::kTuple:
        return std::span<const Ref>(pool_).subspan(n.b, n.c);
      case Kind::kList:
      case Kind::kSet:
      case Kind::kDict:
        return lists_[n.a];
      case Kind::kObject:
        return items(n.a);
      default:
        return {};
    }
  }
  size_t dict_size(Ref r) const { return items(r).size() / 2; }
  // kGlobal: its names; kObject, kDict: those of its class ("" for a plain dict).
  std::string_view module(Ref r) const;
  std::string_view name(Ref r) const;
  Ref cls(Ref r) const;        // kObject, kDict: the class (a kGlobal), or kNoRef
  Ref state(Ref r) const;      // kObject, kDict: the BUILD state, or kNoRef
  Ref dict_args(Ref r) const;  // kDict: the class's argument tuple, or kNoRef
  // kGlobal: not on the caller's allow-list (an opaque class); kObject: made from such a class.
  bool foreign(Ref r) const;
  bool new_obj(Ref r) const { return nodes_[r].flags & kNewObjFlag; }  // kObject: NEWOBJ
  // kObject: what APPEND(S) and SETITEM(S) put on it (k0, v0, k1, v1... for the latter).
  std::span<const Ref> appended(Ref r) const;
  std::span<const Ref> object_entries(Ref r) const;
  Ref origin(Ref r) const;  // the call a value was read from (set_origin), or kNoRef
  bool is_container(Ref r) const;
  size_t node_count() const { return nodes_.size(); }

  // Bounds the heap: past `bytes` of estimated memory (kBytesPerObject per object, which covers
  // the node and the Value that to_value() makes of it), making an object throws
  // Error{kLimitExceeded} with `why` (which names the limit to raise). Default: 2^32 objects.
  static constexpr uint64_t kBytesPerObject = 24 + sizeof(Value) + 48;
  void set_memory_limit(uint64_t bytes, std::string why);

  // --- making --------------------------------------------------------------------------------
  // Shared singletons, as CPython shares them.
  Ref none() const { return kNone; }
  Ref boolean(bool v) const { return v ? kTrue : kFalse; }
  Ref empty_tuple() const { return kEmptyTuple; }
  // A bool node of its own (not the shared singleton), for a value that gets an origin.
  Ref own_boolean(bool v) { return add(Node{Kind::kBool, 0, 0, v ? 1u : 0u}); }
  Ref integer(int64_t v) { return add(Node{Kind::kInt, 0, 0, static_cast<uint64_t>(v)}); }
  Ref big_integer(std::string_view digits);
  Ref real(double v);
  Ref complex(std::complex<double> v);
  Ref string(std::string_view utf8);                        // copied
  Ref bytes(std::string_view raw, bool bytearray = false);  // copied
  // A string or bytes object that is exactly input[offset, offset + size) (not copied).
  Ref input_text(Kind kind, uint64_t offset, uint64_t size, bool bytearray = false) {
    return add(
        Node{kind, static_cast<uint8_t>(kInInput | (bytearray ? kByteArray : 0)), 0, offset, size});
  }
  Ref tuple(std::span<const Ref> items);  // `items` may point into this heap
  Ref list(std::span<const Ref> items = {});
  Ref set(std::span<const Ref> items = {}, bool frozen = false);  // frozen: a frozenset
  // cls: e.g. the collections.OrderedDict global; args: a tuple of the class's arguments.
  Ref dict(Ref cls = kNoRef, Ref args = kNoRef);
  Ref tensor(size_t index) { return add(Node{Kind::kTensor, 0, 0, index}); }
  Ref global(std::string_view module, std::string_view name, bool foreign = false);
  // An instance of `cls` (a kGlobal) made from `args` (a kTuple, shared, not copied); `tag` is a
  // number for the caller's own markers (Value::i after to_value); `new_obj`: made by NEWOBJ.
  Ref object(Ref cls, Ref args, int64_t tag = 0, bool new_obj = false) {
    return add(Node{Kind::kObject, static_cast<uint8_t>(new_obj ? kNewObjFlag : 0), args,
                    static_cast<uint64_t>(tag), cls});
  }

  // --- changing (the VM's APPEND, SETITEM, BUILD) --------------------------------------------
  void append(Ref container, std::span<const Ref> items);  // kList, kSet; kDict: k, v pairs
  void set_state(Ref obj, Ref state);                      // kObject, kDict
  // APPEND(S) / SETITEM(S) onto a kObject: recorded, to be written back (k, v pairs for the
  // latter).
  void object_append(Ref obj, std::span<const Ref> items);
  void object_set_items(Ref obj, std::span<const Ref> pairs);
  // `value` was read from the call `origin` (a kObject): writers reproduce the call.
  void set_origin(Ref value, Ref origin);
  // Turns node `r` (a kObject that memo and stack may already hold) into a copy of node `value`,
  // whose origin is what `r` was.
  void become(Ref r, Ref value);

  // --- results -------------------------------------------------------------------------------
  // The Value tree that `root` reaches; shared objects stay shared. Refuses (kUnsupported) a
  // graph with a cycle through the containers it reaches. Object arguments are copied per
  // object, which `budget` bounds (a hostile pickle can share one huge tuple a million times).
  // Refuses (kLimitExceeded) a tree whose longest path from `root` has more than `max_depth`
  // edges, every path through a shared node counted (walks over the result recurse that deep).
  ValuePtr to_value(Ref root, CopyBudget& budget, uint32_t max_depth = UINT32_MAX) const;
  // The refusals to_value() makes (a cycle; a tree deeper than `max_depth`; arguments past
  // `budget`), with the same errors, without making the tree. Iterative. `reached`, when given:
  // set to 1 per node the walk reached (all of them, when it returns), 0 per other node.
  void check_tree(Ref root, CopyBudget& budget, uint32_t max_depth = UINT32_MAX,
                  std::vector<uint8_t>* reached = nullptr) const;
  // Is there a cycle among the containers reachable from `roots`? Iterative. `acyclic`, when
  // given: 1 per node known to reach no cycle (check_tree's `reached`), which the walk skips.
  bool has_cycle(std::span<const Ref> roots, std::vector<uint8_t> acyclic = {}) const;

 private:
  enum Flags : uint8_t {
    kBig = 1,
    kInInput = 2,
    kByteArray = 4,
    kForeign = 8,
    kNewObjFlag = 16,
    kFrozen = 32
  };
  // 24 bytes. Fields by kind:
  //   kBool, kInt, kTensor: b = value (two's complement); big kInt: c = chars_ offset, a = length
  //   kFloat: b = bits; kComplex: b, c = bits of re, im
  //   kString, kBytes: b = offset (into the input when kInInput, else chars_), c = length
  //   kTuple: b = start in pool_, c = length
  //   kList, kSet: a = index in lists_ (0: still empty)
  //   kDict: a = lists_ index (entries flattened), b = class Ref, c = state Ref | args Ref << 32
  //   kObject: a = args tuple Ref, b = tag, c = class Ref | state Ref << 32
  //   kGlobal: a = index in globals_
  struct Node {
    Kind kind = Kind::kNone;
    uint8_t flags = 0;
    uint32_t a = 0;
    uint64_t b = 0;
    uint64_t c = 0;
  };
  static constexpr Ref kNone = 1, kFalse = 2, kTrue = 3, kEmptyTuple = 4;

  [[gnu::always_inline]] Ref add(const Node& n) {
    // Refs are 32-bit; a pickle would need billions of opcodes to get here, and the metadata
    // limit stops far earlier, but a wrong Ref must never be handed out.
    if (nodes_.size() >= node_limit_) [[unlikely]]
      too_many_nodes();
    nodes_.push_back(n);
    return static_cast<Ref>(nodes_.size() - 1);
  }
  [[noreturn]] void too_many_nodes() const;
  std::vector<Ref>& list_of(Ref r);
  std::vector<Ref>& object_list(Ref obj, bool entries);
  // Children in a fixed order (items, state, dict args, appended, object entries, origin), for
  // the cycle check.
  size_t child_count(Ref r) const;
  Ref child_at(Ref r, size_t k) const;

  std::span<const std::byte> input_;
  uint64_t node_limit_ = UINT32_MAX;
  std::string limit_why_;
  std::vector<Node> nodes_;
  std::vector<Ref> pool_;                // tuple elements
  std::vector<std::vector<Ref>> lists_;  // list/set/dict contents ([0] unused)
  std::string chars_;                    // copied strings and big-int digits
  std::vector<std::pair<std::string, std::string>> globals_;
  // Rare, so kept beside the nodes: kObject -> lists_ indexes of its appended items and entries;
  // value -> origin.
  std::unordered_map<Ref, std::pair<uint32_t, uint32_t>> object_lists_;
  std::unordered_map<Ref, Ref> origins_;
  bool dict_args_used_ = false;
};

}  // namespace ckpt::internal
