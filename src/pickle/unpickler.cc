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
// CPython's C unpickler), so nesting never recurses. Values the VM drops are released
// iteratively at the end (value_release.h), because ~Value of a deep tree recurses.

#include "pickle/unpickler.h"

#include <array>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/error.h"
#include "pickle/builtin_calls.h"
#include "pickle/compat_names.h"
#include "pickle/opcodes.h"
#include "pickle/pickle_text.h"
#include "pickle/value_release.h"

namespace ckpt::internal {
namespace {

using Kind = Value::Kind;

class Vm {
 public:
  Vm(std::span<const std::byte> data, const UnpicklerHooks& hooks, const UnpickleOptions& opt)
      : p_(reinterpret_cast<const uint8_t*>(data.data())),
        size_(data.size()),
        end_(std::min<uint64_t>(data.size(), opt.limits.max_metadata_bytes)),
        hooks_(hooks),
        opt_(opt),
        budget_(4 * static_cast<uint64_t>(data.size()) + (1u << 20)) {}

  // --- cycles -------------------------------------------------------------------------------
  // A reference cycle can only close when an existing container receives a container (APPEND,
  // APPENDS, ADDITEMS, SETITEM(S), BUILD): every other edge points at something older. Such
  // containers are recorded, and at STOP one iterative DFS from them finds any cycle. Checkpoints
  // never hold cycles; one would leak (shared_ptr) every time such a file is opened, so the
  // pickle is refused, after draining those containers so that everything is freed.
  static bool is_container(const Value& v) {
    return !v.items.empty() || !v.entries.empty() || v.state || v.kind == Kind::kList ||
           v.kind == Kind::kTuple || v.kind == Kind::kSet || v.kind == Kind::kDict ||
           v.kind == Kind::kObject;
  }
  void note_mutated(const ValuePtr& c) {
    if (mutated_seen_.insert(c.get()).second) mutated_.push_back(c);
  }
  void note_if_receives_container(size_t target, size_t first_item) {
    for (size_t i = first_item; i < stack_.size(); ++i)
      if (stack_[i] && is_container(*stack_[i])) {
        note_mutated(stack_[target]);
        return;
      }
  }
  void check_acyclic() {
    std::vector<ValuePtr> roots;
    for (auto& w : mutated_)
      if (auto p = w.lock()) roots.push_back(std::move(p));
    if (roots.empty()) return;
    std::unordered_map<const Value*, uint8_t> color;  // 1: on the DFS path, 2: done
    struct Frame {
      const Value* v;
      size_t next;
    };
    std::vector<Frame> path;
    bool cycle = false;
    for (const auto& r : roots) {
      if (cycle || color.count(r.get())) continue;
      color[r.get()] = 1;
      path.push_back({r.get(), 0});
      while (!path.empty() && !cycle) {
        Frame& f = path.back();
        const Value* v = f.v;
        const size_t n_items = v->items.size(), n_ent = 2 * v->entries.size();
        const size_t total = n_items + n_ent + (v->state ? 1 : 0);
        if (f.next == total) {
          color[v] = 2;
          path.pop_back();
          continue;
        }
        const size_t k = f.next++;
        const Value* c = k < n_items ? v->items[k].get()
                         : k < n_items + n_ent
                             ? ((k - n_items) % 2 == 0 ? v->entries[(k - n_items) / 2].first.get()
                                                       : v->entries[(k - n_items) / 2].second.get())
                             : v->state.get();
        if (!c || !is_container(*c)) continue;
        auto [it, fresh] = color.emplace(c, 1);
        if (fresh) {
          path.push_back({c, 0});
        } else if (it->second == 1) {
          cycle = true;
        }
      }
      path.clear();
    }
    if (!cycle) return;
    for (auto& r : roots) {
      for (auto& it : r->items) garbage_.push_back(std::move(it));
      r->items.clear();
      for (auto& [k, v] : r->entries) {
        garbage_.push_back(std::move(k));
        garbage_.push_back(std::move(v));
      }
      r->entries.clear();
      if (r->state) garbage_.push_back(std::move(r->state));
    }
    fail(ErrorCode::kUnsupported,
         "the object graph contains a cycle (a container that contains itself); checkpoints "
         "never do");
  }

  ~Vm() {
    for (auto& v : stack_) garbage_.push_back(std::move(v));
    for (auto& v : memo_) garbage_.push_back(std::move(v));
    for (auto& [k, v] : memo_map_) garbage_.push_back(std::move(v));
    release_values(garbage_);
  }

  ValuePtr run(size_t* consumed) {
    try {
      ValuePtr result = loop();
      check_acyclic();
      if (consumed) *consumed = pos_;
      return result;
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

  // --- reading -----------------------------------------------------------------------------

  void need(uint64_t n) const {
    if (n <= end_ - pos_) return;
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

  // --- stacks ------------------------------------------------------------------------------

  size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  void check_depth() const {
    if (stack_.size() + marks_.size() >= opt_.limits.max_pickle_stack)
      fail(ErrorCode::kLimitExceeded, "stack and marks exceed limits.max_pickle_stack (" +
                                          std::to_string(opt_.limits.max_pickle_stack) + ")");
  }
  void push(ValuePtr v) {
    check_depth();
    stack_.push_back(std::move(v));
  }
  // The value stack below the innermost mark belongs to an outer level: ops must not reach it.
  void need_items(size_t n) const {
    if (stack_.size() - fence() < n) fail(ErrorCode::kCorrupt, "stack underflow");
  }
  ValuePtr pop() {
    need_items(1);
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  ValuePtr& top() {
    need_items(1);
    return stack_.back();
  }
  size_t pop_mark() {
    if (marks_.empty()) fail(ErrorCode::kCorrupt, "no MARK on the stack");
    size_t k = marks_.back();
    marks_.pop_back();
    return k;
  }
  // The items above the innermost mark, which is popped.
  std::vector<ValuePtr> pop_to_mark() {
    size_t k = pop_mark();
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.begin() + k),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(k);
    return items;
  }
  // For APPENDS/SETITEMS/ADDITEMS: pops the mark and returns the container just below it.
  Value& container_below_mark(size_t& k, Kind want) {
    k = pop_mark();
    if (k == 0 || k - 1 < fence()) fail(ErrorCode::kCorrupt, "stack underflow");
    return expect(*stack_[k - 1], want);
  }
  Value& expect(Value& v, Kind want) {
    if (v.kind != want)
      fail(ErrorCode::kCorrupt,
           std::string("applied to a ") + kind_name(v.kind) + ", not a " + kind_name(want));
    return v;
  }

  // --- memo --------------------------------------------------------------------------------

  // Ids are dense in every pickler we know, so the memo is a vector; ids far beyond the number
  // of entries (hostile, or hand-made) go to a map so that one PUT cannot allocate gigabytes.
  void memo_put(uint64_t id, ValuePtr v) {
    if (id < memo_.size() || id <= 2 * memo_count_ + 1024) {
      if (id >= memo_.size()) memo_.resize(id + 1);
      bool fresh = !memo_[id];
      if (!memo_map_.empty()) {
        auto it = memo_map_.find(id);
        if (it != memo_map_.end()) {
          drop(std::move(it->second));
          memo_map_.erase(it);
          fresh = false;
        }
      }
      if (fresh) count_memo_entry();
      if (memo_[id]) drop(std::move(memo_[id]));
      memo_[id] = std::move(v);
      return;
    }
    auto [it, inserted] = memo_map_.try_emplace(id);
    if (inserted) count_memo_entry();
    if (it->second) drop(std::move(it->second));
    it->second = std::move(v);
  }
  void count_memo_entry() {
    if (memo_count_ >= opt_.limits.max_pickle_memo)
      fail(ErrorCode::kLimitExceeded, "memo exceeds limits.max_pickle_memo (" +
                                          std::to_string(opt_.limits.max_pickle_memo) + ")");
    ++memo_count_;
  }
  const ValuePtr& memo_get(uint64_t id) {
    if (id < memo_.size() && memo_[id]) return memo_[id];
    if (!memo_map_.empty()) {
      auto it = memo_map_.find(id);
      if (it != memo_map_.end()) return it->second;
    }
    fail(ErrorCode::kCorrupt, "memo has no entry " + std::to_string(id));
  }

  // --- values ------------------------------------------------------------------------------

  // None, booleans, () and the small ints are shared within one pickle, as CPython shares
  // them: a torch tensor's offset 0, stride 1, requires_grad False and hooks () cost no
  // allocation. The VM never mutates them (APPEND/SETITEM/BUILD refuse those kinds).
  ValuePtr none() {
    if (!none_) none_ = Value::none();
    return none_;
  }
  ValuePtr boolean(bool b) {
    ValuePtr& slot = b ? true_ : false_;
    if (!slot) slot = Value::boolean(b);
    return slot;
  }
  ValuePtr integer(int64_t v) {
    if (v < kMinCachedInt || v > kMaxCachedInt) return Value::integer(v);
    ValuePtr& slot = small_ints_[v - kMinCachedInt];
    if (!slot) slot = Value::integer(v);
    return slot;
  }
  void drop(ValuePtr v) {
    garbage_.push_back(std::move(v));
    // Free as we go (memory stays warm); iteratively, since garbage may be a deep tree.
    if (garbage_.size() >= 4096) release_values(garbage_);
  }

  ValuePtr make_string(std::string_view s) {
    if (!pickle_text::is_utf8(s)) fail(ErrorCode::kCorrupt, "string is not valid UTF-8");
    return Value::string(std::string(s));
  }
  ValuePtr make_int_text(std::string_view text, bool long_suffix) {
    int64_t small = 0;
    std::string big;
    bool fits = true;
    if (!pickle_text::parse_int_text(text, long_suffix, small, big, fits))
      fail(ErrorCode::kCorrupt, "'" + std::string(text.substr(0, 40)) + "' is not an integer");
    auto v = Value::integer(fits ? small : 0);
    if (!fits) v->s = std::move(big);
    return v;
  }
  ValuePtr make_long(std::string_view le) {
    if (le.size() > pickle_text::kMaxBigIntBytes)
      fail(ErrorCode::kUnsupported,
           "integer of " + std::to_string(le.size()) + " bytes is too large");
    int64_t small = 0;
    std::string big;
    bool fits = pickle_text::decode_long_bytes(le, small, big);
    auto v = Value::integer(fits ? small : 0);
    if (!fits) v->s = std::move(big);
    return v;
  }
  ValuePtr make_float_text(std::string_view text) {
    std::string_view t = text;
    if (!t.empty() && t[0] == '+') t.remove_prefix(1);
    double d = 0;
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
    if (t.empty() || ptr != t.data() + t.size() || ec == std::errc::invalid_argument)
      fail(ErrorCode::kCorrupt, "'" + std::string(text.substr(0, 40)) + "' is not a float");
    // Out of range: Python's float() gives inf or 0; strtod does the same.
    if (ec == std::errc::result_out_of_range) d = std::strtod(std::string(t).c_str(), nullptr);
    return Value::real(d);
  }
  ValuePtr make_bytes(std::string_view s, bool bytearray) {
    auto v = Value::bytes(std::string(s));
    v->bytearray = bytearray;
    return v;
  }

  // GLOBAL/INST read module and name as text lines; STACK_GLOBAL takes them from the stack.
  ValuePtr resolve_global(std::string module, std::string name) {
    if (protocol_ < 3) rename_py2_to_py3(module, name);
    if (!hooks_.allow_global || !hooks_.allow_global(module, name))
      throw Error(ErrorCode::kUnsupported, "global '" + module + "." + name + "' is not allowed",
                  opt_.source, opt_.record, abs(op_pos_));
    return Value::global(std::move(module), std::move(name));
  }

  ValuePtr call(ValuePtr callable, ValuePtr args) {
    if (callable->kind != Kind::kGlobal)
      fail(ErrorCode::kCorrupt,
           std::string("calls a ") + kind_name(callable->kind) + ", not a global");
    if (args->kind != Kind::kTuple)
      fail(ErrorCode::kCorrupt,
           std::string("arguments are a ") + kind_name(args->kind) + ", not a tuple");
    ValuePtr result;
    if (hooks_.call) result = hooks_.call(*callable, args);
    if (!result) result = builtin_call(*callable, *args, budget_);
    if (!result) {
      std::vector<ValuePtr> items;
      if (args.use_count() == 1) {
        items = std::move(args->items);
      } else {
        budget_.spend(args->items.size());
        items = args->items;
      }
      result = Value::object(callable->module, callable->name, std::move(items));
    }
    drop(std::move(args));
    return result;
  }

  void build() {
    ValuePtr state = pop();
    ValuePtr& obj = top();
    if (!(hooks_.build && hooks_.build(obj, state)) && state->kind != Kind::kNone) {
      if (obj->kind != Kind::kDict && obj->kind != Kind::kObject)
        fail(ErrorCode::kCorrupt, std::string("sets state on a ") + kind_name(obj->kind));
      if (obj->state) drop(std::move(obj->state));
      if (is_container(*state)) note_mutated(obj);
      obj->state = state;
    }
    drop(std::move(state));
  }

  void persistent(ValuePtr pid) {
    if (!hooks_.persistent_load)
      fail(ErrorCode::kUnsupported, "persistent id " + pid->repr(60) + " but no persistent_load");
    ValuePtr v = hooks_.persistent_load(pid);
    drop(std::move(pid));
    push(v ? std::move(v) : none());
  }

  void set_items(Value& dict, std::vector<ValuePtr>::iterator begin,
                 std::vector<ValuePtr>::iterator end) {
    if ((end - begin) % 2) fail(ErrorCode::kCorrupt, "odd number of items");
    dict.entries.reserve(dict.entries.size() + (end - begin) / 2);
    // Keys are appended, not looked up: a duplicate key (which no pickler writes) stays a
    // second entry instead of costing a quadratic search on every dict.
    for (auto it = begin; it != end; it += 2)
      dict.entries.emplace_back(std::move(it[0]), std::move(it[1]));
  }

  ValuePtr tuple_of_top(size_t n) {
    need_items(n);
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.end() - n),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return Value::tuple(std::move(items));
  }

  ValuePtr loop();

  const uint8_t* p_;
  size_t size_;
  size_t end_;  // min(size, max_metadata_bytes)
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t code_ = 0;
  int protocol_ = 0;
  const UnpicklerHooks& hooks_;
  const UnpickleOptions& opt_;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::vector<ValuePtr> memo_;
  std::unordered_map<uint64_t, ValuePtr> memo_map_;
  uint64_t memo_count_ = 0;
  std::vector<ValuePtr> garbage_;
  std::vector<std::weak_ptr<Value>> mutated_;       // containers that received a container
  std::unordered_set<const Value*> mutated_seen_;
  CopyBudget budget_;
  static constexpr int64_t kMinCachedInt = -5, kMaxCachedInt = 256;
  ValuePtr none_, true_, false_, empty_tuple_;
  std::array<ValuePtr, kMaxCachedInt - kMinCachedInt + 1> small_ints_;
};

ValuePtr Vm::loop() {
  while (pos_ < end_) {
    op_pos_ = pos_;
    code_ = p_[pos_++];
    switch (code_) {
      case op::kProto: {
        protocol_ = le<uint8_t>();
        if (protocol_ > 5) fail(ErrorCode::kUnsupported, "protocol " + std::to_string(protocol_));
        break;
      }
      case op::kFrame:
        need(le<uint64_t>());
        break;
      case op::kStop:
        return pop();
      case op::kMark:
        check_depth();
        marks_.push_back(stack_.size());
        break;
      case op::kPop:
        // CPython pops a MARK that sits on top of the stack (pickle.py keeps both in one stack).
        if (!marks_.empty() && marks_.back() == stack_.size()) {
          marks_.pop_back();
        } else {
          drop(pop());
        }
        break;
      case op::kPopMark: {
        size_t k = pop_mark();
        for (size_t i = k; i < stack_.size(); ++i) drop(std::move(stack_[i]));
        stack_.resize(k);
        break;
      }
      case op::kDup:
        push(ValuePtr(top()));
        break;
      case op::kNone:
        push(none());
        break;
      case op::kNewTrue:
        push(boolean(true));
        break;
      case op::kNewFalse:
        push(boolean(false));
        break;
      case op::kInt: {
        std::string_view t = line();
        if (t == "01" || t == "00") {
          push(boolean(t == "01"));
        } else {
          push(make_int_text(t, false));
        }
        break;
      }
      case op::kBinInt:
        push(integer(le<int32_t>()));
        break;
      case op::kBinInt1:
        push(integer(le<uint8_t>()));
        break;
      case op::kBinInt2:
        push(integer(le<uint16_t>()));
        break;
      case op::kLong:
        push(make_int_text(line(), true));
        break;
      case op::kLong1:
        push(make_long(take(le<uint8_t>())));
        break;
      case op::kLong4: {
        int32_t n = le<int32_t>();
        if (n < 0) fail(ErrorCode::kCorrupt, "negative byte count");
        push(make_long(take(static_cast<uint32_t>(n))));
        break;
      }
      case op::kFloat:
        push(make_float_text(line()));
        break;
      case op::kBinFloat: {
        uint64_t bits = __builtin_bswap64(le<uint64_t>());  // the only big-endian field in pickle
        push(Value::real(std::bit_cast<double>(bits)));
        break;
      }
      case op::kString: {
        std::string raw;
        if (!pickle_text::decode_string_literal(line(), raw))
          fail(ErrorCode::kCorrupt, "argument is not a quoted string literal");
        push(Value::string(pickle_text::py2_str_to_utf8(raw)));
        break;
      }
      case op::kBinString: {
        int32_t n = le<int32_t>();
        if (n < 0) fail(ErrorCode::kCorrupt, "negative length");
        push(Value::string(pickle_text::py2_str_to_utf8(take(static_cast<uint32_t>(n)))));
        break;
      }
      case op::kShortBinString:
        push(Value::string(pickle_text::py2_str_to_utf8(take(le<uint8_t>()))));
        break;
      case op::kUnicode: {
        std::string s;
        if (!pickle_text::decode_raw_unicode_escape(line(), s))
          fail(ErrorCode::kCorrupt, "bad \\u escape");
        push(Value::string(std::move(s)));
        break;
      }
      case op::kShortBinUnicode:
        push(make_string(take(le<uint8_t>())));
        break;
      case op::kBinUnicode:
        push(make_string(take(le<uint32_t>())));
        break;
      case op::kBinUnicode8:
        push(make_string(take(le<uint64_t>())));
        break;
      case op::kShortBinBytes:
        push(make_bytes(take(le<uint8_t>()), false));
        break;
      case op::kBinBytes:
        push(make_bytes(take(le<uint32_t>()), false));
        break;
      case op::kBinBytes8:
        push(make_bytes(take(le<uint64_t>()), false));
        break;
      case op::kByteArray8:
        push(make_bytes(take(le<uint64_t>()), true));
        break;
      case op::kEmptyList:
        push(Value::list());
        break;
      case op::kEmptyTuple:
        if (!empty_tuple_) empty_tuple_ = Value::tuple();
        push(empty_tuple_);
        break;
      case op::kEmptyDict:
        push(Value::dict());
        break;
      case op::kEmptySet: {
        auto v = std::make_shared<Value>();
        v->kind = Kind::kSet;
        push(std::move(v));
        break;
      }
      case op::kList:
        push(Value::list(pop_to_mark()));
        break;
      case op::kTuple:
        push(Value::tuple(pop_to_mark()));
        break;
      case op::kTuple1:
        push(tuple_of_top(1));
        break;
      case op::kTuple2:
        push(tuple_of_top(2));
        break;
      case op::kTuple3:
        push(tuple_of_top(3));
        break;
      case op::kFrozenSet: {
        auto v = std::make_shared<Value>();
        v->kind = Kind::kSet;
        v->items = pop_to_mark();
        push(std::move(v));
        break;
      }
      case op::kDict: {
        size_t k = pop_mark();
        auto d = Value::dict();
        set_items(*d, stack_.begin() + k, stack_.end());
        stack_.resize(k);
        push(std::move(d));
        break;
      }
      case op::kAppend: {
        ValuePtr v = pop();
        if (is_container(*v)) note_mutated(top());
        expect(*top(), Kind::kList).items.push_back(std::move(v));
        break;
      }
      case op::kAppends:
      case op::kAddItems: {
        size_t k;
        Value& c = container_below_mark(k, code_ == op::kAppends ? Kind::kList : Kind::kSet);
        note_if_receives_container(k - 1, k);
        c.items.insert(c.items.end(), std::make_move_iterator(stack_.begin() + k),
                       std::make_move_iterator(stack_.end()));
        stack_.resize(k);
        break;
      }
      case op::kSetItem: {
        need_items(3);
        Value& d = expect(*stack_[stack_.size() - 3], Kind::kDict);
        note_if_receives_container(stack_.size() - 3, stack_.size() - 2);
        set_items(d, stack_.end() - 2, stack_.end());
        stack_.resize(stack_.size() - 2);
        break;
      }
      case op::kSetItems: {
        size_t k;
        Value& d = container_below_mark(k, Kind::kDict);
        note_if_receives_container(k - 1, k);
        set_items(d, stack_.begin() + k, stack_.end());
        stack_.resize(k);
        break;
      }
      case op::kGet: {
        uint64_t id;
        if (!pickle_text::parse_index(line(), id)) fail(ErrorCode::kCorrupt, "bad memo index");
        push(memo_get(id));
        break;
      }
      case op::kBinGet:
        push(memo_get(le<uint8_t>()));
        break;
      case op::kLongBinGet:
        push(memo_get(le<uint32_t>()));
        break;
      case op::kPut: {
        uint64_t id;
        if (!pickle_text::parse_index(line(), id)) fail(ErrorCode::kCorrupt, "bad memo index");
        memo_put(id, top());
        break;
      }
      case op::kBinPut: {
        uint8_t id = le<uint8_t>();
        memo_put(id, top());
        break;
      }
      case op::kLongBinPut: {
        uint32_t id = le<uint32_t>();
        memo_put(id, top());
        break;
      }
      case op::kMemoize:
        memo_put(memo_count_, top());
        break;
      case op::kGlobal: {
        std::string module(line());
        std::string name(line());
        push(resolve_global(std::move(module), std::move(name)));
        break;
      }
      case op::kStackGlobal: {
        ValuePtr name = pop(), module = pop();
        if (module->kind != Kind::kString || name->kind != Kind::kString)
          fail(ErrorCode::kCorrupt, "module and name must be strings");
        push(resolve_global(module->s, name->s));
        break;
      }
      case op::kInst: {
        std::string module(line());
        std::string name(line());
        ValuePtr cls = resolve_global(std::move(module), std::move(name));
        push(call(std::move(cls), Value::tuple(pop_to_mark())));
        break;
      }
      case op::kObj: {
        std::vector<ValuePtr> items = pop_to_mark();
        if (items.empty()) fail(ErrorCode::kCorrupt, "stack underflow");
        ValuePtr cls = std::move(items.front());
        items.erase(items.begin());
        push(call(std::move(cls), Value::tuple(std::move(items))));
        break;
      }
      case op::kReduce:
      case op::kNewObj: {
        ValuePtr args = pop();
        ValuePtr callable = pop();
        push(call(std::move(callable), std::move(args)));
        break;
      }
      case op::kNewObjEx: {
        ValuePtr kwargs = pop(), args = pop(), cls = pop();
        if (kwargs->kind != Kind::kDict)
          fail(ErrorCode::kCorrupt, "keyword arguments are not a dict");
        if (!kwargs->entries.empty())
          fail(ErrorCode::kUnsupported, "keyword arguments are not supported");
        push(call(std::move(cls), std::move(args)));
        break;
      }
      case op::kBuild:
        build();
        break;
      case op::kPersId: {
        std::string_view t = line();
        for (char c : t)
          if (static_cast<uint8_t>(c) > 0x7F) fail(ErrorCode::kCorrupt, "id is not ASCII");
        persistent(Value::string(std::string(t)));
        break;
      }
      case op::kBinPersId:
        persistent(pop());
        break;
      case op::kExt1:
      case op::kExt2:
      case op::kExt4:
        fail(ErrorCode::kUnsupported, "the extension registry is not supported");
      case op::kNextBuffer:
      case op::kReadonlyBuffer:
        fail(ErrorCode::kUnsupported, "out-of-band buffers are not supported");
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", code_);
        throw Error(ErrorCode::kCorrupt, std::string("unknown opcode ") + hex, opt_.source,
                    opt_.record, abs(op_pos_));
      }
    }
  }
  op_pos_ = pos_;
  if (end_ < size_)
    throw Error(ErrorCode::kLimitExceeded, "pickle is larger than limits.max_metadata_bytes",
                opt_.source, opt_.record, abs(pos_));
  throw Error(ErrorCode::kTruncated, "pickle ends without STOP", opt_.source, opt_.record,
              abs(pos_));
}

}  // namespace

ValuePtr unpickle(std::span<const std::byte> data, const UnpicklerHooks& hooks,
                  const UnpickleOptions& options, size_t* consumed) {
  Vm vm(data, hooks, options);
  return vm.run(consumed);
}

}  // namespace ckpt::internal
