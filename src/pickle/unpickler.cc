// A restricted pickle VM (the protocol is documented in CPython's Lib/pickletools.py).
//
// Opcode set, by what it does:
//   framing     PROTO (0..5), FRAME (length bounds-checked, otherwise ignored), STOP
//   stack       MARK, POP, POP_MARK, DUP
//   atoms       NONE, NEWTRUE, NEWFALSE, INT ("01"/"00" are bools), BININT, BININT1, BININT2,
//               LONG, LONG1, LONG4 (beyond int64: decimal text in Value::s), FLOAT, BINFLOAT
//   text        UNICODE, BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 -> kString (UTF-8 checked);
//               STRING, BINSTRING, SHORT_BINSTRING (Python 2 str) -> kString, as UTF-8 when the
//               bytes are valid UTF-8 (torch.load's encoding='utf-8'), else read as latin-1
//   bytes       BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8 -> kBytes
//   containers  EMPTY_LIST, APPEND, APPENDS, LIST, EMPTY_TUPLE, TUPLE, TUPLE1/2/3, EMPTY_DICT,
//               DICT, SETITEM, SETITEMS, EMPTY_SET, ADDITEMS, FROZENSET
//   memo        GET, BINGET, LONG_BINGET, PUT, BINPUT, LONG_BINPUT, MEMOIZE
//   objects     GLOBAL, STACK_GLOBAL, INST, OBJ (class names checked against hooks.allow_global);
//               REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ (hooks.call, built-ins, else kObject);
//               BUILD (hooks.build, else Value::state); PERSID, BINPERSID (hooks.persistent_load)
//   refused     EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER -> kUnsupported; other bytes -> kCorrupt
//
// The VM is a loop over a value stack and a mark stack (positions into the value stack, as in
// CPython's C unpickler), so nesting never recurses. Objects are nodes of a PickleHeap (heap.h):
// the stacks and the memo hold 32-bit Refs, nothing is freed one by one, and the Value tree is
// made at STOP for what the result reaches.

#include "pickle/unpickler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/error.h"
#include "pickle/builtin_calls.h"
#include "pickle/compat_names.h"
#include "pickle/opcodes.h"
#include "pickle/pickle_text.h"
#include "util/text.h"

namespace ckpt::internal {
namespace {

using Kind = Value::Kind;

// A vector of Refs (the value stack, the memo) with std::vector's interface as the VM uses it,
// whose push_back is always inline: GCC left std::vector<Ref>::push_back out of line in the
// large dispatch function, a call per pushed object.
class RefVector {
 public:
  size_t size() const noexcept { return size_; }
  Ref operator[](size_t i) const noexcept { return data_[i]; }
  Ref& operator[](size_t i) noexcept { return data_[i]; }
  Ref back() const noexcept { return data_[size_ - 1]; }
  void pop_back() noexcept { --size_; }
  [[gnu::always_inline]] void push_back(Ref v) {
    if (size_ == cap_) [[unlikely]]
      grow(size_ + 1);
    data_[size_++] = v;
  }
  void resize(size_t n, Ref fill = kNoRef) {
    if (n > cap_) grow(n);
    for (size_t i = size_; i < n; ++i) data_[i] = fill;
    size_ = n;
  }
  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  std::span<const Ref> span() const noexcept { return {data_.get(), size_}; }

 private:
  [[gnu::noinline]] void grow(size_t need) {
    const size_t cap = std::max<size_t>({need, 2 * cap_, 16});
    std::unique_ptr<Ref[]> d(new Ref[cap]);
    if (size_) std::memcpy(d.get(), data_.get(), size_ * sizeof(Ref));
    data_ = std::move(d);
    cap_ = cap;
  }
  std::unique_ptr<Ref[]> data_;
  size_t size_ = 0, cap_ = 0;
};

class Vm {
 public:
  Vm(std::span<const std::byte> data, const UnpicklerHooks& hooks, const UnpickleOptions& opt)
      : p_(reinterpret_cast<const uint8_t*>(data.data())),
        size_(data.size()),
        end_(std::min<uint64_t>(data.size(), opt.limits.max_metadata_bytes)),
        hooks_(hooks),
        opt_(opt),
        heap_(data),
        budget_(4 * static_cast<uint64_t>(data.size()) + (1u << 20)) {
    memo_.reserve(std::min<size_t>(data.size() / 16, opt.limits.max_pickle_memo));
    stack_.reserve(64);
  }

  ValuePtr run(size_t* consumed) {
    try {
      Ref result = loop();
      check_acyclic();
      op_pos_ = pos_;
      ValuePtr v = heap_.to_value(result, budget_);
      if (consumed) *consumed = pos_;
      return v;
    } catch (Error& e) {
      // Errors from hooks and helpers do not know where they happened.
      e.with_source(opt_.source).with_record(opt_.record).with_offset(abs(op_pos_));
      throw;
    }
  }

 private:
  uint64_t abs(size_t pos) const { return opt_.base_offset + pos; }
  const char* op_name() const { return op::name(code_) ? op::name(code_) : "?"; }

  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const {
    throw Error(code, std::string(op_name()) + ": " + msg, opt_.source, opt_.record, abs(op_pos_));
  }

  // --- cycles -------------------------------------------------------------------------------
  // A reference cycle can only close when an existing container receives a container (APPEND,
  // APPENDS, ADDITEMS, SETITEM(S), BUILD): every other edge points at something older. Such
  // containers are recorded, and at STOP one iterative DFS from them finds any cycle.
  // Checkpoints never hold cycles, and the Value tree (shared_ptr) would leak one, so such a
  // pickle is refused.
  void note_mutated(Ref c) {
    if (mutated_seen_.insert(c).second) mutated_.push_back(c);
  }
  void note_if_receives_container(size_t target, size_t first_item) {
    for (size_t i = first_item; i < stack_.size(); ++i)
      if (heap_.is_container(stack_[i])) {
        note_mutated(stack_[target]);
        return;
      }
  }
  void check_acyclic() {
    if (!mutated_.empty() && heap_.has_cycle(mutated_))
      fail(ErrorCode::kUnsupported,
           "the object graph contains a cycle (a container that contains itself); checkpoints "
           "never do");
  }

  // --- reading -----------------------------------------------------------------------------

  void need(uint64_t n) const {
    if (n <= end_ - pos_) [[likely]]
      return;
    need_failed(n);
  }
  [[noreturn, gnu::noinline]] void need_failed(uint64_t n) const {
    if (end_ < size_ && n <= size_ - pos_)
      fail(ErrorCode::kLimitExceeded, "pickle is larger than limits.max_metadata_bytes (" +
                                          std::to_string(opt_.limits.max_metadata_bytes) + ")");
    fail(ErrorCode::kTruncated, "needs " + std::to_string(n) + " bytes but only " +
                                    std::to_string(size_ - pos_) + " remain");
  }
  std::string_view take(uint64_t n) {
    need(n);
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  T le() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A protocol-0 argument: the bytes up to '\n' (consumed, not returned).
  std::string_view line() {
    const void* nl = std::memchr(p_ + pos_, '\n', end_ - pos_);
    if (!nl) {
      if (end_ < size_) need(size_ - pos_ + 1);  // names the metadata limit
      fail(ErrorCode::kTruncated, "argument line has no end");
    }
    size_t n = static_cast<const uint8_t*>(nl) - (p_ + pos_);
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n + 1;
    return s;
  }
  uint64_t offset_of(std::string_view s) const {
    return reinterpret_cast<const uint8_t*>(s.data()) - p_;
  }

  // --- stacks ------------------------------------------------------------------------------

  size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  [[gnu::always_inline]] void check_depth() const {
    if (stack_.size() + marks_.size() >= opt_.limits.max_pickle_stack) [[unlikely]]
      depth_failed();
  }
  [[noreturn, gnu::noinline]] void depth_failed() const {
    fail(ErrorCode::kLimitExceeded, "stack and marks exceed limits.max_pickle_stack (" +
                                        std::to_string(opt_.limits.max_pickle_stack) + ")");
  }
  [[gnu::always_inline]] void push(Ref v) {
    check_depth();
    stack_.push_back(v);
  }
  // The value stack below the innermost mark belongs to an outer level: ops must not reach it.
  void need_items(size_t n) const {
    if (stack_.size() - fence() < n) [[unlikely]]
      underflow();
  }
  [[noreturn, gnu::noinline]] void underflow() const { fail(ErrorCode::kCorrupt, "stack underflow"); }
  Ref pop() {
    need_items(1);
    Ref v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Ref top() const {
    need_items(1);
    return stack_.back();
  }
  size_t pop_mark() {
    if (marks_.empty()) fail(ErrorCode::kCorrupt, "no MARK on the stack");
    size_t k = marks_.back();
    marks_.pop_back();
    return k;
  }
  std::span<const Ref> above(size_t k) const {
    return stack_.span().subspan(k);
  }
  // For APPENDS/SETITEMS/ADDITEMS: pops the mark and returns the container just below it.
  Ref container_below_mark(size_t& k, Kind want) {
    k = pop_mark();
    if (k == 0 || k - 1 < fence()) fail(ErrorCode::kCorrupt, "stack underflow");
    if (want != Kind::kSet && heap_.kind(stack_[k - 1]) == Kind::kObject) return stack_[k - 1];
    return expect(stack_[k - 1], want);
  }
  Ref expect(Ref v, Kind want) const {
    if (heap_.kind(v) != want)
      fail(ErrorCode::kCorrupt, std::string("applied to a ") + kind_name(heap_.kind(v)) +
                                    ", not a " + kind_name(want));
    return v;
  }

  // --- memo --------------------------------------------------------------------------------

  // Ids are dense in every pickler we know, so the memo is a vector; ids far beyond the number
  // of entries (hostile, or hand-made) go to a map so that one PUT cannot allocate gigabytes.
  void memo_put(uint64_t id, Ref v) {
    if (id == memo_.size() && memo_map_.empty() && memo_count_ < opt_.limits.max_pickle_memo)
        [[likely]] {  // the next dense id: every pickler's case
      ++memo_count_;
      memo_.push_back(v);
      return;
    }
    memo_put_slow(id, v);
  }
  [[gnu::noinline]] void memo_put_slow(uint64_t id, Ref v) {
    if (id == memo_.size() && memo_map_.empty()) {
      count_memo_entry();
      memo_.push_back(v);
      return;
    }
    if (id < memo_.size() || id <= 2 * memo_count_ + 1024) {
      if (id >= memo_.size()) memo_.resize(id + 1, kNoRef);
      bool fresh = memo_[id] == kNoRef;
      if (!memo_map_.empty() && memo_map_.erase(id)) fresh = false;
      if (fresh) count_memo_entry();
      memo_[id] = v;
      return;
    }
    auto [it, inserted] = memo_map_.try_emplace(id, v);
    if (inserted) count_memo_entry();
    it->second = v;
  }
  void count_memo_entry() {
    if (memo_count_ >= opt_.limits.max_pickle_memo)
      fail(ErrorCode::kLimitExceeded, "memo exceeds limits.max_pickle_memo (" +
                                          std::to_string(opt_.limits.max_pickle_memo) + ")");
    ++memo_count_;
  }
  Ref memo_get(uint64_t id) const {
    if (id < memo_.size() && memo_[id] != kNoRef) [[likely]]
      return memo_[id];
    return memo_get_slow(id);
  }
  [[gnu::noinline]] Ref memo_get_slow(uint64_t id) const {
    if (!memo_map_.empty()) {
      auto it = memo_map_.find(id);
      if (it != memo_map_.end()) return it->second;
    }
    fail(ErrorCode::kCorrupt, "memo has no entry " + std::to_string(id));
  }

  // --- values ------------------------------------------------------------------------------

  // Small ints are shared within one pickle, as CPython shares them (None, booleans and () are
  // the heap's singletons): a torch tensor's offset 0 and stride 1 cost no node. The VM never
  // mutates them (APPEND/SETITEM/BUILD refuse those kinds).
  [[gnu::always_inline]] Ref integer(int64_t v) {
    if (v < kMinCachedInt || v > kMaxCachedInt) return heap_.integer(v);
    Ref& slot = small_ints_[v - kMinCachedInt];
    if (slot == kNoRef) slot = heap_.integer(v);
    return slot;
  }
  Ref make_string(std::string_view s) {
    if (!is_utf8(s, Surrogates::kAllow)) fail(ErrorCode::kCorrupt, "string is not valid UTF-8");
    return heap_.input_text(Kind::kString, offset_of(s), s.size());
  }
  Ref make_py2_string(std::string_view s) {
    if (is_utf8(s, Surrogates::kAllow))
      return heap_.input_text(Kind::kString, offset_of(s), s.size());
    return heap_.string(pickle_text::py2_str_to_utf8(s));
  }
  Ref make_int_text(std::string_view text, bool long_suffix) {
    // The same bound as LONG1/LONG4's bytes (2048 bytes hold ~4933 digits): writing a longer
    // decimal int back as binary would cost quadratic time.
    if (text.size() > pickle_text::kMaxBigIntBytes * 5 / 2)
      fail(ErrorCode::kUnsupported,
           "integer of " + std::to_string(text.size()) + " digits is too large");
    int64_t small = 0;
    std::string big;
    bool fits = true;
    if (!pickle_text::parse_int_text(text, long_suffix, small, big, fits))
      fail(ErrorCode::kCorrupt, "'" + std::string(text.substr(0, 40)) + "' is not an integer");
    return fits ? integer(small) : heap_.big_integer(big);
  }
  Ref make_long(std::string_view le) {
    if (le.size() > pickle_text::kMaxBigIntBytes)
      fail(ErrorCode::kUnsupported,
           "integer of " + std::to_string(le.size()) + " bytes is too large");
    int64_t small = 0;
    std::string big;
    bool fits = pickle_text::decode_long_bytes(le, small, big);
    return fits ? integer(small) : heap_.big_integer(big);
  }
  Ref make_float_text(std::string_view text) {
    std::string_view t = text;
    if (!t.empty() && t[0] == '+') t.remove_prefix(1);
    double d = 0;
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
    if (t.empty() || ptr != t.data() + t.size() || ec == std::errc::invalid_argument)
      fail(ErrorCode::kCorrupt, "'" + std::string(text.substr(0, 40)) + "' is not a float");
    // Out of range: Python's float() gives inf or 0; strtod does the same.
    if (ec == std::errc::result_out_of_range) d = std::strtod(std::string(t).c_str(), nullptr);
    return heap_.real(d);
  }
  Ref make_bytes(std::string_view s, bool bytearray) {
    return heap_.input_text(Kind::kBytes, offset_of(s), s.size(), bytearray);
  }

  // GLOBAL/INST read module and name as text lines; STACK_GLOBAL takes them from the stack.
  Ref resolve_global(std::string module, std::string name) {
    if (protocol_ < 3) rename_py2_to_py3(module, name);
    if (!hooks_.allow_global || !hooks_.allow_global(module, name)) {
      // An opaque class: recorded by name, never looked up or called.
      if (hooks_.admit_foreign && hooks_.admit_foreign(module, name))
        return heap_.global(module, name, true);
      throw Error(ErrorCode::kUnsupported, "global '" + module + "." + name + "' is not allowed",
                  opt_.source, opt_.record, abs(op_pos_));
    }
    return heap_.global(module, name);
  }

  // `args` must be a tuple node. `new_obj`: cls.__new__(cls, *args) rather than cls(*args).
  // CPython's pickler writes cls.__new__(cls, *args, **kwargs) below protocol 4 as a call of
  // functools.partial(getattr(cls, '__new__')) whose BUILD state is (that getattr, (cls, *args),
  // kwargs, None). Recognised by shape (nothing is called) and recorded as
  // copyreg.__newobj_ex__(cls, args, kwargs), which unpickles to the same object; kNoRef if the
  // call is anything else.
  Ref newobj_ex_from_partial(Ref callable, Ref args) {
    auto is_global = [&](Ref r, std::string_view m, std::string_view n) {
      return heap_.kind(r) == Kind::kGlobal && heap_.module(r) == m && heap_.name(r) == n;
    };
    if (heap_.kind(callable) != Kind::kObject || heap_.kind(args) != Kind::kTuple ||
        !heap_.items(args).empty())
      return kNoRef;
    const Ref cls_of_partial = heap_.cls(callable);
    if (cls_of_partial == kNoRef || !is_global(cls_of_partial, "functools", "partial"))
      return kNoRef;
    const Ref st = heap_.state(callable);
    if (st == kNoRef || heap_.kind(st) != Kind::kTuple || heap_.items(st).size() != 4)
      return kNoRef;
    const Ref f = heap_.items(st)[0], fargs = heap_.items(st)[1], kw = heap_.items(st)[2];
    if (heap_.kind(f) != Kind::kObject || heap_.cls(f) == kNoRef ||
        !is_global(heap_.cls(f), "builtins", "getattr") || heap_.items(f).size() != 2)
      return kNoRef;
    const Ref cls = heap_.items(f)[0], attr = heap_.items(f)[1];
    if (heap_.kind(cls) != Kind::kGlobal || heap_.kind(attr) != Kind::kString ||
        heap_.text(attr) != "__new__" || heap_.kind(fargs) != Kind::kTuple ||
        heap_.items(fargs).empty() || heap_.items(fargs)[0] != cls ||
        heap_.kind(kw) != Kind::kDict)
      return kNoRef;
    std::vector<Ref> rest(heap_.items(fargs).begin() + 1, heap_.items(fargs).end());
    const Ref parts[3] = {cls, heap_.tuple(rest), kw};
    Ref fn = heap_.global("copyreg", "__newobj_ex__", true);
    return heap_.object(fn, heap_.tuple(std::span<const Ref>(parts, 3)));
  }

  Ref call(Ref callable, Ref args, bool new_obj = false) {
    if (Ref r = newobj_ex_from_partial(callable, args); r != kNoRef) return r;
    if (heap_.kind(callable) != Kind::kGlobal)
      fail(ErrorCode::kCorrupt,
           std::string("calls a ") + kind_name(heap_.kind(callable)) + ", not a global");
    if (heap_.kind(args) != Kind::kTuple)
      fail(ErrorCode::kCorrupt,
           std::string("arguments are a ") + kind_name(heap_.kind(args)) + ", not a tuple");
    // A stable copy of the arguments: the heap's tuple pool moves when hooks make tuples.
    std::array<Ref, 16> small;
    std::vector<Ref> large;
    auto items = heap_.items(args);
    std::span<const Ref> a;
    if (items.size() <= small.size()) {
      std::copy(items.begin(), items.end(), small.begin());
      a = std::span<const Ref>(small.data(), items.size());
    } else {
      large.assign(items.begin(), items.end());
      a = large;
    }
    // A foreign (opaque) callable is recorded with its arguments: nothing interprets it.
    if (heap_.foreign(callable)) return heap_.object(callable, args, 0, new_obj);
    Ref result = kNoRef;
    if (hooks_.call) result = hooks_.call(heap_, callable, a);
    if (result == kNoRef) result = builtin_call(heap_, callable, a, budget_);
    if (result == kNoRef) result = heap_.object(callable, args, 0, new_obj);
    return result;
  }

  void build() {
    Ref state = pop();
    Ref obj = top();
    if (hooks_.build && hooks_.build(heap_, obj, state)) return;
    if (heap_.kind(state) == Kind::kNone) return;
    Kind k = heap_.kind(obj);
    if (k != Kind::kDict && k != Kind::kObject)
      fail(ErrorCode::kCorrupt, std::string("sets state on a ") + kind_name(k));
    if (heap_.is_container(state)) note_mutated(obj);
    heap_.set_state(obj, state);
  }

  void persistent(Ref pid) {
    if (!hooks_.persistent_load)
      fail(ErrorCode::kUnsupported,
           "persistent id " + heap_.to_value(pid, budget_)->repr(60) + " but no persistent_load");
    Ref v = hooks_.persistent_load(heap_, pid);
    push(v != kNoRef ? v : heap_.none());
  }

  void set_items(Ref dict, size_t k) {
    if ((stack_.size() - k) % 2) fail(ErrorCode::kCorrupt, "odd number of items");
    // Keys are appended, not looked up: a duplicate key (which no pickler writes) stays a
    // second entry instead of costing a quadratic search on every dict.
    if (heap_.kind(dict) == Kind::kObject) {
      heap_.object_set_items(dict, above(k));  // obj[k] = v on an object: recorded
    } else {
      heap_.append(dict, above(k));
    }
    stack_.resize(k);
  }

  Ref tuple_from(size_t k) {
    Ref t = heap_.tuple(above(k));
    stack_.resize(k);
    return t;
  }
  Ref tuple_of_top(size_t n) {
    need_items(n);
    return tuple_from(stack_.size() - n);
  }

  Ref loop();

  const uint8_t* p_;
  size_t size_;
  size_t end_;  // min(size, max_metadata_bytes)
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t code_ = 0;
  int protocol_ = 0;
  const UnpicklerHooks& hooks_;
  const UnpickleOptions& opt_;
  PickleHeap heap_;
  RefVector stack_;
  std::vector<size_t> marks_;
  RefVector memo_;
  std::unordered_map<uint64_t, Ref> memo_map_;
  uint64_t memo_count_ = 0;
  std::vector<Ref> mutated_;  // containers that received a container
  std::unordered_set<Ref> mutated_seen_;
  CopyBudget budget_;
  static constexpr int64_t kMinCachedInt = -5, kMaxCachedInt = 256;
  std::array<Ref, kMaxCachedInt - kMinCachedInt + 1> small_ints_{};
};

// Each opcode's code ends with its own jump to the next opcode's code (CKPT_NEXT_OP, GNU C's
// labels as values) instead of all of them returning to the one indirect jump of the switch: the
// processor then predicts each jump from the opcode it follows (a BINPUT after a BINUNICODE, a
// REDUCE after a TUPLE...), which the single shared jump mispredicted. The switch remains the
// way in, and the code of each case is what it was. A case that has a local with a destructor
// in scope ends with `break` instead (back through the switch): an indirect goto must not leave
// such a scope (clang refuses it; GCC would not run the destructor).
#define CKPT_NEXT_OP()                      \
  do {                                      \
    if (pos_ >= end_) [[unlikely]]          \
      goto out_of_input;                    \
    op_pos_ = pos_;                         \
    code_ = p_[pos_++];                     \
    goto* dispatch[code_];                  \
  } while (0)

Ref Vm::loop() {
  void* dispatch[256];
  for (void*& d : dispatch) d = &&L_default;
  dispatch[op::kProto] = &&L_kProto;
  dispatch[op::kFrame] = &&L_kFrame;
  dispatch[op::kStop] = &&L_kStop;
  dispatch[op::kMark] = &&L_kMark;
  dispatch[op::kPop] = &&L_kPop;
  dispatch[op::kPopMark] = &&L_kPopMark;
  dispatch[op::kDup] = &&L_kDup;
  dispatch[op::kNone] = &&L_kNone;
  dispatch[op::kNewTrue] = &&L_kNewTrue;
  dispatch[op::kNewFalse] = &&L_kNewFalse;
  dispatch[op::kInt] = &&L_kInt;
  dispatch[op::kBinInt] = &&L_kBinInt;
  dispatch[op::kBinInt1] = &&L_kBinInt1;
  dispatch[op::kBinInt2] = &&L_kBinInt2;
  dispatch[op::kLong] = &&L_kLong;
  dispatch[op::kLong1] = &&L_kLong1;
  dispatch[op::kLong4] = &&L_kLong4;
  dispatch[op::kFloat] = &&L_kFloat;
  dispatch[op::kBinFloat] = &&L_kBinFloat;
  dispatch[op::kString] = &&L_kString;
  dispatch[op::kBinString] = &&L_kBinString;
  dispatch[op::kShortBinString] = &&L_kShortBinString;
  dispatch[op::kUnicode] = &&L_kUnicode;
  dispatch[op::kShortBinUnicode] = &&L_kShortBinUnicode;
  dispatch[op::kBinUnicode] = &&L_kBinUnicode;
  dispatch[op::kBinUnicode8] = &&L_kBinUnicode8;
  dispatch[op::kShortBinBytes] = &&L_kShortBinBytes;
  dispatch[op::kBinBytes] = &&L_kBinBytes;
  dispatch[op::kBinBytes8] = &&L_kBinBytes8;
  dispatch[op::kByteArray8] = &&L_kByteArray8;
  dispatch[op::kEmptyList] = &&L_kEmptyList;
  dispatch[op::kEmptyTuple] = &&L_kEmptyTuple;
  dispatch[op::kEmptyDict] = &&L_kEmptyDict;
  dispatch[op::kEmptySet] = &&L_kEmptySet;
  dispatch[op::kList] = &&L_kList;
  dispatch[op::kTuple] = &&L_kTuple;
  dispatch[op::kTuple1] = &&L_kTuple1;
  dispatch[op::kTuple2] = &&L_kTuple2;
  dispatch[op::kTuple3] = &&L_kTuple3;
  dispatch[op::kFrozenSet] = &&L_kFrozenSet;
  dispatch[op::kDict] = &&L_kDict;
  dispatch[op::kAppend] = &&L_kAppend;
  dispatch[op::kAppends] = &&L_kAppends;
  dispatch[op::kAddItems] = &&L_kAddItems;
  dispatch[op::kSetItem] = &&L_kSetItem;
  dispatch[op::kSetItems] = &&L_kSetItems;
  dispatch[op::kGet] = &&L_kGet;
  dispatch[op::kBinGet] = &&L_kBinGet;
  dispatch[op::kLongBinGet] = &&L_kLongBinGet;
  dispatch[op::kPut] = &&L_kPut;
  dispatch[op::kBinPut] = &&L_kBinPut;
  dispatch[op::kLongBinPut] = &&L_kLongBinPut;
  dispatch[op::kMemoize] = &&L_kMemoize;
  dispatch[op::kGlobal] = &&L_kGlobal;
  dispatch[op::kStackGlobal] = &&L_kStackGlobal;
  dispatch[op::kInst] = &&L_kInst;
  dispatch[op::kObj] = &&L_kObj;
  dispatch[op::kReduce] = &&L_kReduce;
  dispatch[op::kNewObj] = &&L_kNewObj;
  dispatch[op::kNewObjEx] = &&L_kNewObjEx;
  dispatch[op::kBuild] = &&L_kBuild;
  dispatch[op::kPersId] = &&L_kPersId;
  dispatch[op::kBinPersId] = &&L_kBinPersId;
  dispatch[op::kExt1] = &&L_kExt1;
  dispatch[op::kExt2] = &&L_kExt2;
  dispatch[op::kExt4] = &&L_kExt4;
  dispatch[op::kNextBuffer] = &&L_kNextBuffer;
  dispatch[op::kReadonlyBuffer] = &&L_kReadonlyBuffer;
  while (pos_ < end_) {
    op_pos_ = pos_;
    code_ = p_[pos_++];
    switch (code_) {
      case op::kProto: L_kProto: {
        protocol_ = le<uint8_t>();
        if (protocol_ > 5) fail(ErrorCode::kUnsupported, "protocol " + std::to_string(protocol_));
        CKPT_NEXT_OP();
      }
      case op::kFrame: L_kFrame:
        need(le<uint64_t>());
        CKPT_NEXT_OP();
      case op::kStop: L_kStop:
        return pop();
      case op::kMark: L_kMark:
        check_depth();
        marks_.push_back(stack_.size());
        CKPT_NEXT_OP();
      case op::kPop: L_kPop:
        // CPython pops a MARK that sits on top of the stack (pickle.py keeps both in one stack).
        if (!marks_.empty() && marks_.back() == stack_.size()) {
          marks_.pop_back();
        } else {
          pop();
        }
        CKPT_NEXT_OP();
      case op::kPopMark: L_kPopMark:
        stack_.resize(pop_mark());
        CKPT_NEXT_OP();
      case op::kDup: L_kDup:
        push(top());
        CKPT_NEXT_OP();
      case op::kNone: L_kNone:
        push(heap_.none());
        CKPT_NEXT_OP();
      case op::kNewTrue: L_kNewTrue:
        push(heap_.boolean(true));
        CKPT_NEXT_OP();
      case op::kNewFalse: L_kNewFalse:
        push(heap_.boolean(false));
        CKPT_NEXT_OP();
      case op::kInt: L_kInt: {
        std::string_view t = line();
        if (t == "01" || t == "00") {
          push(heap_.boolean(t == "01"));
        } else {
          push(make_int_text(t, false));
        }
        CKPT_NEXT_OP();
      }
      case op::kBinInt: L_kBinInt:
        push(integer(le<int32_t>()));
        CKPT_NEXT_OP();
      case op::kBinInt1: L_kBinInt1:
        push(integer(le<uint8_t>()));
        CKPT_NEXT_OP();
      case op::kBinInt2: L_kBinInt2:
        push(integer(le<uint16_t>()));
        CKPT_NEXT_OP();
      case op::kLong: L_kLong:
        push(make_int_text(line(), true));
        CKPT_NEXT_OP();
      case op::kLong1: L_kLong1:
        push(make_long(take(le<uint8_t>())));
        CKPT_NEXT_OP();
      case op::kLong4: L_kLong4: {
        int32_t n = le<int32_t>();
        if (n < 0) fail(ErrorCode::kCorrupt, "negative byte count");
        push(make_long(take(static_cast<uint32_t>(n))));
        CKPT_NEXT_OP();
      }
      case op::kFloat: L_kFloat:
        push(make_float_text(line()));
        CKPT_NEXT_OP();
      case op::kBinFloat: L_kBinFloat: {
        uint64_t bits = __builtin_bswap64(le<uint64_t>());  // the only big-endian field in pickle
        push(heap_.real(std::bit_cast<double>(bits)));
        CKPT_NEXT_OP();
      }
      case op::kString: L_kString: {
        std::string raw;
        if (!pickle_text::decode_string_literal(line(), raw))
          fail(ErrorCode::kCorrupt, "argument is not a quoted string literal");
        push(heap_.string(pickle_text::py2_str_to_utf8(raw)));
        break;  // not CKPT_NEXT_OP: a local with a destructor is in scope
      }
      case op::kBinString: L_kBinString: {
        int32_t n = le<int32_t>();
        if (n < 0) fail(ErrorCode::kCorrupt, "negative length");
        push(make_py2_string(take(static_cast<uint32_t>(n))));
        CKPT_NEXT_OP();
      }
      case op::kShortBinString: L_kShortBinString:
        push(make_py2_string(take(le<uint8_t>())));
        CKPT_NEXT_OP();
      case op::kUnicode: L_kUnicode: {
        std::string s;
        if (!pickle_text::decode_raw_unicode_escape(line(), s))
          fail(ErrorCode::kCorrupt, "bad \\u escape");
        push(heap_.string(s));
        break;  // not CKPT_NEXT_OP: a local with a destructor is in scope
      }
      case op::kShortBinUnicode: L_kShortBinUnicode:
        push(make_string(take(le<uint8_t>())));
        CKPT_NEXT_OP();
      case op::kBinUnicode: L_kBinUnicode:
        push(make_string(take(le<uint32_t>())));
        CKPT_NEXT_OP();
      case op::kBinUnicode8: L_kBinUnicode8:
        push(make_string(take(le<uint64_t>())));
        CKPT_NEXT_OP();
      case op::kShortBinBytes: L_kShortBinBytes:
        push(make_bytes(take(le<uint8_t>()), false));
        CKPT_NEXT_OP();
      case op::kBinBytes: L_kBinBytes:
        push(make_bytes(take(le<uint32_t>()), false));
        CKPT_NEXT_OP();
      case op::kBinBytes8: L_kBinBytes8:
        push(make_bytes(take(le<uint64_t>()), false));
        CKPT_NEXT_OP();
      case op::kByteArray8: L_kByteArray8:
        push(make_bytes(take(le<uint64_t>()), true));
        CKPT_NEXT_OP();
      case op::kEmptyList: L_kEmptyList:
        push(heap_.list());
        CKPT_NEXT_OP();
      case op::kEmptyTuple: L_kEmptyTuple:
        push(heap_.empty_tuple());
        CKPT_NEXT_OP();
      case op::kEmptyDict: L_kEmptyDict:
        push(heap_.dict());
        CKPT_NEXT_OP();
      case op::kEmptySet: L_kEmptySet:
        push(heap_.set());
        CKPT_NEXT_OP();
      case op::kList: L_kList: {
        size_t k = pop_mark();
        Ref l = heap_.list(above(k));
        stack_.resize(k);
        push(l);
        CKPT_NEXT_OP();
      }
      case op::kTuple: L_kTuple:
        push(tuple_from(pop_mark()));
        CKPT_NEXT_OP();
      case op::kTuple1: L_kTuple1:
        push(tuple_of_top(1));
        CKPT_NEXT_OP();
      case op::kTuple2: L_kTuple2:
        push(tuple_of_top(2));
        CKPT_NEXT_OP();
      case op::kTuple3: L_kTuple3:
        push(tuple_of_top(3));
        CKPT_NEXT_OP();
      case op::kFrozenSet: L_kFrozenSet: {
        size_t k = pop_mark();
        Ref s = heap_.set(above(k), /*frozen=*/true);
        stack_.resize(k);
        push(s);
        CKPT_NEXT_OP();
      }
      case op::kDict: L_kDict: {
        size_t k = pop_mark();
        Ref d = heap_.dict();
        set_items(d, k);
        push(d);
        CKPT_NEXT_OP();
      }
      case op::kAppend: L_kAppend: {
        Ref v = pop();
        Ref l = top();
        if (heap_.kind(l) != Kind::kObject) expect(l, Kind::kList);
        if (heap_.is_container(v)) note_mutated(l);
        if (heap_.kind(l) == Kind::kObject) {
          heap_.object_append(l, std::span<const Ref>(&v, 1));  // obj.append(v): recorded
        } else {
          heap_.append(l, std::span<const Ref>(&v, 1));
        }
        CKPT_NEXT_OP();
      }
      case op::kAppends: L_kAppends:
      case op::kAddItems: L_kAddItems: {
        size_t k;
        Ref c = container_below_mark(k, code_ == op::kAppends ? Kind::kList : Kind::kSet);
        note_if_receives_container(k - 1, k);
        if (heap_.kind(c) == Kind::kObject) {
          heap_.object_append(c, above(k));
        } else {
          heap_.append(c, above(k));
        }
        stack_.resize(k);
        CKPT_NEXT_OP();
      }
      case op::kSetItem: L_kSetItem: {
        need_items(3);
        Ref d = stack_[stack_.size() - 3];
        if (heap_.kind(d) != Kind::kObject) expect(d, Kind::kDict);
        note_if_receives_container(stack_.size() - 3, stack_.size() - 2);
        set_items(d, stack_.size() - 2);
        CKPT_NEXT_OP();
      }
      case op::kSetItems: L_kSetItems: {
        size_t k;
        Ref d = container_below_mark(k, Kind::kDict);
        note_if_receives_container(k - 1, k);
        set_items(d, k);
        CKPT_NEXT_OP();
      }
      case op::kGet: L_kGet: {
        uint64_t id;
        if (!pickle_text::parse_index(line(), id)) fail(ErrorCode::kCorrupt, "bad memo index");
        push(memo_get(id));
        CKPT_NEXT_OP();
      }
      case op::kBinGet: L_kBinGet:
        push(memo_get(le<uint8_t>()));
        CKPT_NEXT_OP();
      case op::kLongBinGet: L_kLongBinGet:
        push(memo_get(le<uint32_t>()));
        CKPT_NEXT_OP();
      case op::kPut: L_kPut: {
        uint64_t id;
        if (!pickle_text::parse_index(line(), id)) fail(ErrorCode::kCorrupt, "bad memo index");
        memo_put(id, top());
        CKPT_NEXT_OP();
      }
      case op::kBinPut: L_kBinPut: {
        uint8_t id = le<uint8_t>();
        memo_put(id, top());
        CKPT_NEXT_OP();
      }
      case op::kLongBinPut: L_kLongBinPut: {
        uint32_t id = le<uint32_t>();
        memo_put(id, top());
        CKPT_NEXT_OP();
      }
      case op::kMemoize: L_kMemoize:
        memo_put(memo_count_, top());
        CKPT_NEXT_OP();
      case op::kGlobal: L_kGlobal: {
        std::string module(line());
        std::string name(line());
        push(resolve_global(std::move(module), std::move(name)));
        break;  // not CKPT_NEXT_OP: a local with a destructor is in scope
      }
      case op::kStackGlobal: L_kStackGlobal: {
        Ref name = pop(), module = pop();
        if (heap_.kind(module) != Kind::kString || heap_.kind(name) != Kind::kString)
          fail(ErrorCode::kCorrupt, "module and name must be strings");
        push(resolve_global(std::string(heap_.text(module)), std::string(heap_.text(name))));
        CKPT_NEXT_OP();
      }
      case op::kInst: L_kInst: {
        std::string module(line());
        std::string name(line());
        Ref cls = resolve_global(std::move(module), std::move(name));
        Ref args = tuple_from(pop_mark());
        push(call(cls, args, heap_.items(args).empty()));
        break;  // not CKPT_NEXT_OP: a local with a destructor is in scope
      }
      case op::kObj: L_kObj: {
        size_t k = pop_mark();
        if (stack_.size() == k) fail(ErrorCode::kCorrupt, "stack underflow");
        Ref cls = stack_[k];
        Ref args = tuple_from(k + 1);
        stack_.pop_back();  // cls
        push(call(cls, args, heap_.items(args).empty()));
        CKPT_NEXT_OP();
      }
      case op::kReduce: L_kReduce:
      case op::kNewObj: L_kNewObj: {
        Ref args = pop();
        Ref callable = pop();
        push(call(callable, args, code_ == op::kNewObj));
        CKPT_NEXT_OP();
      }
      case op::kNewObjEx: L_kNewObjEx: {
        Ref kwargs = pop(), args = pop(), cls = pop();
        if (heap_.kind(kwargs) != Kind::kDict)
          fail(ErrorCode::kCorrupt, "keyword arguments are not a dict");
        if (!heap_.items(kwargs).empty()) {
          // cls.__new__(cls, *args, **kwargs): recorded (never called) as the protocol-2 form
          // CPython's pickler writes for it, copyreg.__newobj_ex__(cls, args, kwargs), so that a
          // writer reproduces an object that unpickles the same.
          if (heap_.kind(cls) != Kind::kGlobal)
            fail(ErrorCode::kCorrupt, std::string("NEWOBJ_EX of a ") +
                                          kind_name(heap_.kind(cls)) + ", not a class");
          if (heap_.kind(args) != Kind::kTuple)
            fail(ErrorCode::kCorrupt, "NEWOBJ_EX arguments are not a tuple");
          if (!hooks_.admit_foreign || !hooks_.admit_foreign("copyreg", "__newobj_ex__"))
            fail(ErrorCode::kUnsupported, "keyword arguments are not supported");
          const Ref parts[3] = {cls, args, kwargs};
          Ref fn = heap_.global("copyreg", "__newobj_ex__", true);
          push(heap_.object(fn, heap_.tuple(std::span<const Ref>(parts, 3))));
          CKPT_NEXT_OP();
        }
        push(call(cls, args, true));
        CKPT_NEXT_OP();
      }
      case op::kBuild: L_kBuild:
        build();
        CKPT_NEXT_OP();
      case op::kPersId: L_kPersId: {
        std::string_view t = line();
        for (char c : t)
          if (static_cast<uint8_t>(c) > 0x7F) fail(ErrorCode::kCorrupt, "id is not ASCII");
        persistent(heap_.input_text(Kind::kString, offset_of(t), t.size()));
        CKPT_NEXT_OP();
      }
      case op::kBinPersId: L_kBinPersId:
        persistent(pop());
        CKPT_NEXT_OP();
      case op::kExt1: L_kExt1:
      case op::kExt2: L_kExt2:
      case op::kExt4: L_kExt4:
        fail(ErrorCode::kUnsupported, "the extension registry is not supported");
      case op::kNextBuffer: L_kNextBuffer:
      case op::kReadonlyBuffer: L_kReadonlyBuffer:
        fail(ErrorCode::kUnsupported, "out-of-band buffers are not supported");
      default:
      L_default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", code_);
        throw Error(ErrorCode::kCorrupt, std::string("unknown opcode ") + hex, opt_.source,
                    opt_.record, abs(op_pos_));
      }
    }
  }
out_of_input:
  op_pos_ = pos_;
  if (end_ < size_)
    throw Error(ErrorCode::kLimitExceeded, "pickle is larger than limits.max_metadata_bytes",
                opt_.source, opt_.record, abs(pos_));
  throw Error(ErrorCode::kTruncated, "pickle ends without STOP", opt_.source, opt_.record,
              abs(pos_));
}
#undef CKPT_NEXT_OP

}  // namespace

ValuePtr unpickle(std::span<const std::byte> data, const UnpicklerHooks& hooks,
                  const UnpickleOptions& options, size_t* consumed) {
  Vm vm(data, hooks, options);
  return vm.run(consumed);
}

}  // namespace ckpt::internal
