#pragma once
// The unpickler's VM, less its opcode loop: class Vm (its state: the input, the value stack, the
// mark stack, the memo, the PickleHeap) and the helpers the opcodes use (reading arguments, the
// stacks, the memo, making values, calls of globals, BUILD, persistent ids, the cycle check, the
// out-of-line failure paths), with RefVector, the stacks' vector. Vm::loop, the opcode dispatch,
// is in unpickler.cc.
//
// Included by unpickler.cc only, and in an unnamed namespace as it was when it lived in that
// file: the whole VM stays local to that one translation unit, so the compiler inlines, clones and
// calls its helpers from the hot loop exactly as before (external linkage would change that).

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ckpt/error.h"
#include "pickle/builtin_calls.h"
#include "pickle/compat_names.h"
#include "pickle/heap.h"
#include "pickle/opcodes.h"
#include "pickle/pickle_text.h"
#include "pickle/unpickler.h"
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
    const uint64_t file = opt.file_size ? opt.file_size : data.size();
    const uint64_t bytes = opt.limits.object_bytes_for(file);
    heap_.set_memory_limit(
        bytes, "a file of " + std::to_string(file) + " bytes may make " +
                   std::to_string(bytes >> 20) +
                   " MiB of objects (limits.max_object_bytes + limits.object_bytes_per_byte per "
                   "byte of the file)");
  }

  ValuePtr run(size_t* consumed) {
    return guarded([&] {
      Ref result = loop();
      check_acyclic();
      op_pos_ = pos_;
      ValuePtr v = heap_.to_value(result, budget_, opt_.limits.max_pickle_depth);
      if (consumed) *consumed = pos_;
      return v;
    });
  }

  // Runs to STOP and makes the checks run() makes (cycles; the depth and the copies of what the
  // result reaches) without making the Value tree: the result, to be read in heap().
  // The walk over what the result reaches finds any cycle among those nodes, so the cycle check
  // after it walks only the rest; the refusals and their order are run()'s (a cycle first, at
  // STOP's offset; then the tree's depth and copies, at the end's).
  Ref run_checked() {
    return guarded([&] {
      Ref result = loop();
      const size_t stop = op_pos_;
      op_pos_ = pos_;
      std::vector<uint8_t> reached;
      try {
        heap_.check_tree(result, budget_, opt_.limits.max_pickle_depth, &reached);
      } catch (const Error&) {
        op_pos_ = stop;
        check_acyclic();
        op_pos_ = pos_;
        throw;
      }
      op_pos_ = stop;
      check_acyclic(std::move(reached));
      op_pos_ = pos_;
      return result;
    });
  }
  const PickleHeap& heap() const { return heap_; }

 private:
  uint64_t abs(size_t pos) const { return opt_.base_offset + pos; }
  const char* op_name() const { return op::name(code_) ? op::name(code_) : "?"; }

  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (Error& e) {
      // Errors from hooks and helpers do not know where they happened.
      e.with_source(opt_.source).with_record(opt_.record).with_offset(abs(op_pos_));
      throw;
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::kLimitExceeded,
                  "out of memory making the pickle's objects (" +
                      std::to_string(heap_.node_count()) + " so far)",
                  opt_.source, opt_.record, abs(op_pos_));
    }
  }

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
    if (c >= mutated_seen_.size())
      mutated_seen_.resize(std::max<size_t>(c + 1, heap_.node_count()));
    if (!mutated_seen_[c]) {
      mutated_seen_[c] = 1;
      mutated_.push_back(c);
    }
  }
  void note_if_receives_container(size_t target, size_t first_item) {
    for (size_t i = first_item; i < stack_.size(); ++i)
      if (heap_.is_container(stack_[i])) {
        note_mutated(stack_[target]);
        return;
      }
  }
  void check_acyclic(std::vector<uint8_t> acyclic = {}) {
    if (!mutated_.empty() && heap_.has_cycle(mutated_, std::move(acyclic)))
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
  [[noreturn, gnu::noinline]] void underflow() const {
    fail(ErrorCode::kCorrupt, "stack underflow");
  }
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
  std::span<const Ref> above(size_t k) const { return stack_.span().subspan(k); }
  // For APPENDS/SETITEMS/ADDITEMS: pops the mark and returns the container just below it.
  Ref container_below_mark(size_t& k, Kind want) {
    k = pop_mark();
    if (k == 0 || k - 1 < fence()) fail(ErrorCode::kCorrupt, "stack underflow");
    if (want != Kind::kSet && heap_.kind(stack_[k - 1]) == Kind::kObject) return stack_[k - 1];
    return expect(stack_[k - 1], want);
  }
  Ref expect(Ref v, Kind want) const {
    if (heap_.kind(v) != want)
      fail(ErrorCode::kCorrupt,
           std::string("applied to a ") + kind_name(heap_.kind(v)) + ", not a " + kind_name(want));
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
        heap_.items(fargs).empty() || heap_.items(fargs)[0] != cls || heap_.kind(kw) != Kind::kDict)
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
  std::vector<Ref> mutated_;           // containers that received a container
  std::vector<uint8_t> mutated_seen_;  // by Ref: 1 once in mutated_ (grown with the heap)
  CopyBudget budget_;
  static constexpr int64_t kMinCachedInt = -5, kMaxCachedInt = 256;
  std::array<Ref, kMaxCachedInt - kMinCachedInt + 1> small_ints_{};
};

}  // namespace
}  // namespace ckpt::internal
