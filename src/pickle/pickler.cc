// Protocol-2 pickler that mirrors CPython 3.11's C pickler (Modules/_pickle.c) byte for byte:
// which objects get a memo id and in which order, the int opcode per range, batching of list and
// dict items (the exact-type and the iterator variants differ), the Python 2 names of globals
// (fix_imports), and the reduce forms CPython uses for bytes, bytearray, set and complex.
//
// Identity: a ValuePtr is one Python object (the same pointer twice -> BINGET). Globals are
// memoized by name, since a module.name resolves to one object in Python. Objects CPython
// creates on the fly (reduce argument tuples, the latin-1 str of a bytes) get memo ids but are
// never shared, except the 'latin1' encoding name, which CPython interns.

#include "pickle/pickler.h"

#include <bit>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/options.h"
#include "pickle/compat_names.h"
#include "pickle/opcodes.h"
#include "pickle/pickle_text.h"
#include "util/text.h"

namespace ckpt::internal {
namespace {

using Kind = Value::Kind;
constexpr size_t kBatch = 1000;  // CPython's BATCHSIZE for APPENDS/SETITEMS

// Value address -> memo id, open addressing: a pickle of a large state dict looks up about a
// million addresses, and std::unordered_map's node per entry made that a cache miss each.
class IdentityMemo {
 public:
  IdentityMemo() : slots_(1024) {}
  const uint32_t* find(const Value* key) const {
    for (size_t i = hash(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i].id;
      if (!slots_[i].key) return nullptr;
    }
  }
  void insert(const Value* key, uint32_t id) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    place(key, id);
    ++size_;
  }

 private:
  struct Slot {
    const Value* key = nullptr;
    uint32_t id = 0;
  };
  size_t hash(const Value* key) const {
    uint64_t h = reinterpret_cast<uintptr_t>(key) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h >> 32) & (slots_.size() - 1);
  }
  void place(const Value* key, uint32_t id) {
    size_t i = hash(key);
    while (slots_[i].key && slots_[i].key != key) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = {key, id};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.key) place(s.key, s.id);
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

[[noreturn]] void invalid(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "pickle: " + msg);
}

class Pickler {
 public:
  Pickler(std::string& out, const PicklerHooks& hooks) : out_(out), hooks_(hooks) {}

  void run(const ValuePtr& root) {
    out_.push_back(static_cast<char>(op::kProto));
    out_.push_back(2);
    save(root, true);
    out_.push_back(static_cast<char>(op::kStop));
  }

 private:
  void put(uint8_t code) { out_.push_back(static_cast<char>(code)); }
  template <typename T>
  void put_le(T v) {
    char buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    out_.append(buf, sizeof(T));
  }

  // --- memo --------------------------------------------------------------------------------

  uint32_t next_id() {
    if (next_id_ == UINT32_MAX) invalid("more than 2^32 memo entries");
    return next_id_++;
  }
  void write_put(uint32_t id) {
    if (id < 256) {
      put(op::kBinPut);
      put(static_cast<uint8_t>(id));
    } else {
      put(op::kLongBinPut);
      put_le<uint32_t>(id);
    }
  }
  void write_get(uint32_t id) {
    if (id < 256) {
      put(op::kBinGet);
      put(static_cast<uint8_t>(id));
    } else {
      put(op::kLongBinGet);
      put_le<uint32_t>(id);
    }
  }
  // Memoizes `v` (null: an object CPython creates on the fly, which only consumes an id).
  void memoize(const Value* v) {
    uint32_t id = next_id();
    if (v) memo_.insert(v, id);
    write_put(id);
  }
  bool memo_has(const Value* v) const { return memo_.find(v) != nullptr; }

  // --- atoms -------------------------------------------------------------------------------

  void save_int(const Value& v) {
    int64_t i = v.as_int();
    if (!v.str().empty()) {
      std::string big;
      bool fits = true;
      if (!pickle_text::parse_int_text(v.str(), false, i, big, fits))
        invalid("int text '" + v.str().substr(0, 40) + "' is not decimal");
      if (!fits) {
        std::string le;
        pickle_text::encode_long_decimal(v.str(), le);
        return write_long(le);
      }
    }
    if (i >= 0 && i <= 0xFF) {
      put(op::kBinInt1);
      put(static_cast<uint8_t>(i));
    } else if (i >= 0 && i <= 0xFFFF) {
      put(op::kBinInt2);
      put_le<uint16_t>(static_cast<uint16_t>(i));
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      put(op::kBinInt);
      put_le<int32_t>(static_cast<int32_t>(i));
    } else {
      write_long(pickle_text::encode_long(i));
    }
  }
  void write_long(const std::string& le) {
    if (le.size() < 256) {
      put(op::kLong1);
      put(static_cast<uint8_t>(le.size()));
    } else {
      if (le.size() > INT32_MAX) invalid("int too large");
      put(op::kLong4);
      put_le<int32_t>(static_cast<int32_t>(le.size()));
    }
    out_ += le;
  }
  void save_float(double f) {
    put(op::kBinFloat);
    put_le<uint64_t>(__builtin_bswap64(std::bit_cast<uint64_t>(f)));
  }
  void write_unicode(std::string_view s) {
    if (s.size() > UINT32_MAX) invalid("str larger than 4 GiB needs protocol 4");
    put(op::kBinUnicode);
    put_le<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }

  // GLOBAL "module\nname\n" with CPython's Python 3 -> 2 renames; memoized by name.
  void save_global(const std::string& module, const std::string& name) {
    auto& ids = global_memo_[module];
    if (auto it = ids.find(std::string_view(name)); it != ids.end()) return write_get(it->second);
    std::string m = module, n = name;
    rename_py3_to_py2(m, n);
    for (const std::string* part : {&m, &n}) {
      if (part->empty() || part->find('\n') != std::string::npos)
        invalid("global name '" + module + "." + name + "' cannot be written");
      for (char c : *part)
        if (static_cast<uint8_t>(c) > 0x7F)
          invalid("global '" + module + "." + name + "' is not ASCII (protocol 2)");
    }
    put(op::kGlobal);
    out_ += m;
    out_ += '\n';
    out_ += n;
    out_ += '\n';
    uint32_t id = next_id();
    ids.emplace(name, id);
    write_put(id);
  }

  // --- containers --------------------------------------------------------------------------

  // Lists and dicts of the exact type: one item -> APPEND/SETITEM, else MARK ... APPENDS batches
  // (for dicts CPython even writes an empty last batch when the size is a multiple of 1000).
  void batch_list_exact(const std::vector<ValuePtr>& items) {
    if (items.empty()) return;
    if (items.size() == 1) {
      save(items[0], true);
      return put(op::kAppend);
    }
    size_t total = 0;
    do {
      put(op::kMark);
      for (size_t n = 0; total < items.size() && n < kBatch; ++n) save(items[total++], true);
      put(op::kAppends);
    } while (total < items.size());
  }
  void batch_dict_exact(const std::vector<std::pair<ValuePtr, ValuePtr>>& entries) {
    if (entries.empty()) return;
    if (entries.size() == 1) {
      save(entries[0].first, true);
      save(entries[0].second, true);
      return put(op::kSetItem);
    }
    size_t total = 0, n;
    do {
      put(op::kMark);
      for (n = 0; total < entries.size() && n < kBatch; ++n, ++total) {
        save(entries[total].first, true);
        save(entries[total].second, true);
      }
      put(op::kSetItems);
    } while (n == kBatch);
  }
  // Dict items from a reduce (an iterator in CPython): a last batch of one is a SETITEM.
  void batch_dict_iter(const std::vector<std::pair<ValuePtr, ValuePtr>>& entries) {
    for (size_t i = 0; i < entries.size();) {
      size_t n = std::min(kBatch, entries.size() - i);
      if (n == 1) {
        save(entries[i].first, true);
        save(entries[i].second, true);
        put(op::kSetItem);
      } else {
        put(op::kMark);
        for (size_t k = 0; k < n; ++k) {
          save(entries[i + k].first, true);
          save(entries[i + k].second, true);
        }
        put(op::kSetItems);
      }
      i += n;
    }
  }

  // Items appended by a reduce (an iterator in CPython): a last batch of one is an APPEND.
  void batch_list_iter(const std::vector<ValuePtr>& items) {
    for (size_t i = 0; i < items.size();) {
      size_t n = std::min(kBatch, items.size() - i);
      if (n == 1) {
        save(items[i], true);
        put(op::kAppend);
      } else {
        put(op::kMark);
        for (size_t k = 0; k < n; ++k) save(items[i + k], true);
        put(op::kAppends);
      }
      i += n;
    }
  }

  // A tuple of `items`; `self` is the tuple Value, or null for an argument tuple made up here.
  void save_tuple(const std::vector<ValuePtr>& items, const Value* self) {
    size_t n = items.size();
    if (n == 0) return put(op::kEmptyTuple);
    if (n > 3) put(op::kMark);
    for (const auto& item : items) save(item, true);
    // An element that (through a list or dict) contains the tuple has memoized it meanwhile:
    // drop what was pushed and fetch that one, as CPython does.
    if (self && memo_has(self)) {
      if (n > 3) {
        put(op::kPopMark);
      } else {
        for (size_t k = 0; k < n; ++k) put(op::kPop);
      }
      return write_get(*memo_.find(self));
    }
    put(n == 1 ? op::kTuple1 : n == 2 ? op::kTuple2 : n == 3 ? op::kTuple3 : op::kTuple);
    memoize(self);
  }

  // After `callable args REDUCE`: memoize the result (or, if its arguments contained it,
  // replace it with the memoized one).
  bool reduce_done(const Value* self) {
    if (self && memo_has(self)) {
      put(op::kPop);
      write_get(*memo_.find(self));
      return false;
    }
    memoize(self);
    return true;
  }

  // bytes in protocol 2: _codecs.encode(latin-1 text, 'latin1'), or bytes() when empty.
  void save_bytes(std::string_view s, const Value* self) {
    if (s.empty()) {
      save_global("builtins", "bytes");
      put(op::kEmptyTuple);
    } else {
      save_global("_codecs", "encode");
      write_unicode(pickle_text::latin1_to_utf8(s));
      memoize(nullptr);
      if (!latin1_) {
        latin1_ = Value::string("latin1");
        write_unicode("latin1");
        memoize(latin1_.get());
      } else {
        write_get(*memo_.find(latin1_.get()));
      }
      put(op::kTuple2);
      memoize(nullptr);
    }
    put(op::kReduce);
    reduce_done(self);
  }
  void save_bytearray(const Value& v) {
    save_global("builtins", "bytearray");
    if (v.str().empty()) {
      put(op::kEmptyTuple);
    } else {
      save_bytes(v.str(), nullptr);  // bytearray.__reduce_ex__ passes a fresh bytes copy
      put(op::kTuple1);
      memoize(nullptr);
    }
    put(op::kReduce);
    reduce_done(&v);
  }

  void save(const ValuePtr& vp, bool persistent_ok);

  std::string& out_;
  const PicklerHooks& hooks_;
  IdentityMemo memo_;
  // module -> name -> memo id; looked up without building a key string (torch pickles name a
  // rebuild function per tensor).
  struct StrHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  template <typename V>
  using StrMap = std::unordered_map<std::string, V, StrHash, std::equal_to<>>;
  StrMap<StrMap<uint32_t>> global_memo_;
  uint32_t next_id_ = 0;
  ValuePtr latin1_;
  // Persistent ids the hook returned: memoized by address, so they must outlive the pickling
  // (a freed pid's address reused by the next one would turn into a false BINGET).
  std::vector<ValuePtr> pids_;
  uint32_t depth_ = 0;
};

void Pickler::save(const ValuePtr& vp, bool persistent_ok) {
  if (!vp) invalid("null ValuePtr");
  const Value& v = *vp;
  if (persistent_ok && hooks_.persistent_id) {
    if (ValuePtr pid = hooks_.persistent_id(v)) {
      pids_.push_back(pid);
      save(pid, false);
      return put(op::kBinPersId);
    }
  }
  // A value read from a call (a numpy scalar) is written as that call.
  if (v.origin()) return save(v.origin(), persistent_ok);
  switch (v.kind()) {
    case Kind::kNone:
      return put(op::kNone);
    case Kind::kBool:
      return put(v.as_bool() ? op::kNewTrue : op::kNewFalse);
    case Kind::kInt:
      return save_int(v);
    case Kind::kFloat:
      return save_float(v.as_float());
    case Kind::kGlobal:
      return save_global(v.module(), v.name());
    case Kind::kTensor:
      invalid("a tensor reference must be replaced by its reduce form before pickling");
    default:
      break;
  }
  if (const uint32_t* id = memo_.find(&v)) return write_get(*id);
  if (v.kind() == Kind::kString) {
    if (!is_utf8(v.str(), Surrogates::kAllow)) invalid("str is not valid UTF-8");
    write_unicode(v.str());
    return memoize(&v);
  }
  if (v.kind() == Kind::kBytes)
    return v.is_bytearray() ? save_bytearray(v) : save_bytes(v.str(), &v);

  // Containers recurse; CPython stops at its recursion limit too.
  if (++depth_ > Limits{}.max_pickle_depth)
    throw Error(ErrorCode::kLimitExceeded,
                "pickle: values nested deeper than " + std::to_string(Limits{}.max_pickle_depth));
  switch (v.kind()) {
    case Kind::kTuple:
      save_tuple(v.items(), &v);
      break;
    case Kind::kList:
      put(op::kEmptyList);
      memoize(&v);
      batch_list_exact(v.items());
      break;
    case Kind::kDict:
      if (v.module().empty()) {
        if (v.state()) invalid("a plain dict cannot carry BUILD state");
        put(op::kEmptyDict);
        memoize(&v);
        batch_dict_exact(v.entries());
        break;
      }
      // A dict subclass (OrderedDict): cls.__reduce__ -> (cls, args, state, None, items); args
      // are empty but for a defaultdict's factory.
      save_global(v.module(), v.name());
      save_tuple(v.items(), nullptr);
      put(op::kReduce);
      if (!reduce_done(&v)) break;
      batch_dict_iter(v.entries());
      if (v.state() && !v.state()->is_none()) {
        save(v.state(), true);
        put(op::kBuild);
      }
      break;
    case Kind::kSet:
      // set.__reduce__ -> (set, (list(self),), None); frozenset's likewise
      save_global("builtins", v.is_frozenset() ? "frozenset" : "set");
      put(op::kEmptyList);
      memoize(nullptr);
      batch_list_exact(v.items());
      put(op::kTuple1);
      memoize(nullptr);
      put(op::kReduce);
      reduce_done(&v);
      break;
    case Kind::kComplex:
      save_global("builtins", "complex");
      save_float(v.as_complex().real());
      save_float(v.as_complex().imag());
      put(op::kTuple2);
      memoize(nullptr);
      put(op::kReduce);
      reduce_done(&v);
      break;
    case Kind::kObject:
      // As the pickle made it: cls args REDUCE (or NEWOBJ), then what it applied afterwards.
      save_global(v.module(), v.name());
      save_tuple(v.items(), nullptr);
      put(v.call() == Value::Call::kNewObj ? op::kNewObj : op::kReduce);
      if (!reduce_done(&v)) break;
      batch_list_iter(v.appended());
      batch_dict_iter(v.entries());
      if (v.state() && !v.state()->is_none()) {
        save(v.state(), true);
        put(op::kBuild);
      }
      break;
    default:
      invalid("unexpected value kind");
  }
  --depth_;
}

}  // namespace

void pickle(const ValuePtr& root, std::string& out, const PicklerHooks& hooks) {
  size_t start = out.size();
  try {
    Pickler p(out, hooks);
    p.run(root);
  } catch (...) {
    out.resize(start);  // no half-written pickle left behind
    throw;
  }
}

}  // namespace ckpt::internal
