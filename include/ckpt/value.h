#pragma once
// Value: the non-tensor part of a checkpoint as a tree (Python-like objects with identity).
// Tensors appear as references to the checkpoint's tensor table.

#include <complex>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {

class Value;
using ValuePtr = std::shared_ptr<Value>;
using ConstValuePtr = std::shared_ptr<const Value>;

// Thread-safety: a tree may be read from any number of threads at once (const access); changing
// it (the non-const accessors and setters) needs the caller's own synchronization. A checkpoint
// hands out its tree as ConstValuePtr: read-only, alive while any pointer to it lives.
class Value {
 public:
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kFloat,
    kComplex,
    kString,
    kBytes,
    kList,
    kTuple,
    kSet,
    kDict,
    kTensor,  // tensor_index() into the tensor table
    kGlobal,  // a class or function named module.name (e.g. torch.float32, a TorchScript class)
    kObject,  // an instance, or the result of calling a function: module()/name() = the
              // class or function, items() = its arguments, state() = BUILD state, appended() and
              // entries() = items the pickle appended / set on it afterwards (see "Opaque objects")
  };
  // kObject: how the pickle made it, which a writer repeats: cls(*args) (REDUCE, INST, OBJ with
  // arguments) or cls.__new__(cls, *args) (NEWOBJ, NEWOBJ_EX without keywords, INST/OBJ without).
  enum class Call : uint8_t { kReduce, kNewObj };

  Value() = default;
  Value(const Value& other);
  Value(Value&&) noexcept = default;
  Value& operator=(const Value& other);
  Value& operator=(Value&&) noexcept = default;
  // Frees children without recursion, so that a deeply nested tree (a hostile pickle can nest
  // 1e6 lists) cannot overflow the stack when it dies.
  ~Value();

  static ValuePtr none();
  static ValuePtr boolean(bool v);
  static ValuePtr integer(int64_t v);
  // An int that does not fit int64: its decimal digits (as Python prints it).
  static ValuePtr big_integer(std::string digits);
  static ValuePtr real(double v);
  static ValuePtr complex(std::complex<double> v);
  static ValuePtr string(std::string v);
  static ValuePtr bytes(std::string v, bool bytearray = false);
  static ValuePtr list(std::vector<ValuePtr> items = {});
  static ValuePtr tuple(std::vector<ValuePtr> items = {});
  static ValuePtr set(std::vector<ValuePtr> items = {});
  // A kSet whose class is builtins.frozenset (module()/name() say so; a set's are empty).
  static ValuePtr frozenset(std::vector<ValuePtr> items = {});
  static ValuePtr dict();          // plain dict
  static ValuePtr ordered_dict();  // collections.OrderedDict
  // A dict of class module.name (e.g. collections.OrderedDict); empty names: a plain dict.
  static ValuePtr dict_of(std::string module, std::string name);
  static ValuePtr tensor(size_t index);
  static ValuePtr global(std::string module, std::string name);
  // `tag`: an integer the creator attaches (as_int() returns it).
  static ValuePtr object(std::string module, std::string name, std::vector<ValuePtr> args = {},
                         ValuePtr state = nullptr, int64_t tag = 0);

  // A deep copy (sharing inside the tree is kept: a node reached twice is copied once). Throws
  // Error{kLimitExceeded} past `max_depth` levels.
  ValuePtr clone(uint32_t max_depth = 100000) const;

  Kind kind() const noexcept { return kind_; }
  bool is_none() const noexcept { return kind_ == Kind::kNone; }
  bool is_dict() const noexcept { return kind_ == Kind::kDict; }
  bool is_sequence() const noexcept { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_frozenset() const noexcept { return kind_ == Kind::kSet && rare().name == "frozenset"; }

  // Scalars: each is meaningful for its kind only (false / 0 / empty otherwise).
  bool as_bool() const noexcept { return b_; }    // kBool
  int64_t as_int() const noexcept { return i_; }  // kInt (when !is_big_int()); kObject: its tag
  bool is_big_int() const noexcept { return kind_ == Kind::kInt && !s_.empty(); }
  double as_float() const noexcept { return kind_ == Kind::kFloat ? f_ : 0; }  // kFloat
  std::complex<double> as_complex() const noexcept { return rare().c; }        // kComplex
  // kString: UTF-8 text; kBytes: the raw bytes; kInt: the decimal digits of a big int.
  const std::string& str() const noexcept { return s_; }
  bool is_bytearray() const noexcept { return bytearray_; }  // kBytes: was a bytearray
  size_t tensor_index() const noexcept { return static_cast<size_t>(i_); }  // kTensor
  void set_tensor_index(size_t index) noexcept { i_ = static_cast<int64_t>(index); }

  // kList, kTuple, kSet: the elements; kObject: the call's arguments; kDict of a class: the
  // class's arguments (collections.defaultdict's default factory), usually none.
  const std::vector<ValuePtr>& items() const noexcept { return items_; }
  std::vector<ValuePtr>& items() noexcept { return items_; }
  // kDict: (key, value) in insertion order; kObject: the keys and values set on it.
  const std::vector<std::pair<ValuePtr, ValuePtr>>& entries() const noexcept { return entries_; }
  std::vector<std::pair<ValuePtr, ValuePtr>>& entries() noexcept { return entries_; }
  // kGlobal: the name; kObject and kDict: the class (empty for a plain dict); kSet:
  // builtins.frozenset for a frozenset, empty for a set.
  const std::string& module() const noexcept { return rare().module; }
  const std::string& name() const noexcept { return rare().name; }
  // kObject/kDict: state from BUILD (e.g. OrderedDict's _metadata); may be null.
  const ValuePtr& state() const noexcept { return rare().state; }
  // May allocate (the rarely used fields live apart): throws std::bad_alloc.
  void set_state(ValuePtr state) {
    if (state || rare_) own_rare().state = std::move(state);
  }

  // --- Opaque objects ------------------------------------------------------------------------
  // A class or function a reader does not know is kept as it was pickled, never called: a
  // kObject (or kGlobal) with foreign() true. Its module/name, arguments (items()), call(),
  // appended(), entries() (kObject: keys and values set on it) and state() are what the pickle
  // applied, so a writer reproduces the same object.
  Call call() const noexcept { return call_; }
  void set_call(Call c) noexcept { call_ = c; }
  // kGlobal, kObject: the class or function is not one the reader knows (an opaque node).
  bool foreign() const noexcept { return foreign_; }
  void set_foreign(bool f) noexcept { foreign_ = f; }
  // kObject: the elements APPEND(S)ed onto it after construction (a list subclass, a deque).
  const std::vector<ValuePtr>& appended() const noexcept { return rare().appended; }
  // For adding to: may allocate (the rarely used fields live apart), so read through the const
  // overload.
  std::vector<ValuePtr>& appended() { return own_rare().appended; }
  // A value read from a call (a numpy scalar as kFloat/kInt/kBool/kComplex, a numpy array as
  // kTensor): the call as the pickle made it (a kObject), which writers pickle instead of the
  // value so that the output holds the same object. Null for values read as they are.
  const ValuePtr& origin() const noexcept { return rare().origin; }
  // May allocate, as set_state.
  void set_origin(ValuePtr origin) {
    if (origin || rare_) own_rare().origin = std::move(origin);
  }

  // kDict: the value under a string or int key, or null.
  ValuePtr get(std::string_view key) const;
  ValuePtr get(int64_t key) const;
  // kDict: appends (or replaces) an entry.
  void set(ValuePtr key, ValuePtr value);
  void set(std::string key, ValuePtr value) { set(string(std::move(key)), std::move(value)); }

  // Short one-line Python-like text ("OrderedDict(3 items)", "'abc'", "1.5"). Tensors print as
  // "tensor#N".
  std::string repr(size_t max_len = 80) const;

 private:
  static ValuePtr make(Kind kind);
  static ValuePtr with_items(Kind kind, std::vector<ValuePtr> items);
  static ValuePtr with_names(Kind kind, std::string module, std::string name);
  // The fields few values use (a class's names, BUILD state, an origin, a complex value) live
  // apart, made when first set: a plain value (an int, a string, an empty list) takes 104 bytes,
  // not 240, which is most of what a pickle's object costs (docs/security.md).
  struct Rare {
    std::complex<double> c;
    std::string module, name;
    ValuePtr state;
    ValuePtr origin;
    std::vector<ValuePtr> appended;
  };
  const Rare& rare() const noexcept { return rare_ ? *rare_ : kNoRare; }
  Rare& own_rare() {
    if (!rare_) rare_ = std::make_unique<Rare>();
    return *rare_;
  }
  static const Rare kNoRare;

  Kind kind_ = Kind::kNone;
  bool b_ = false;
  bool bytearray_ = false;
  bool foreign_ = false;
  Call call_ = Call::kReduce;
  union {
    int64_t i_ = 0;  // kInt, kBool's twin, kTensor, kObject's tag
    double f_;       // kFloat
  };
  std::string s_;
  std::vector<ValuePtr> items_;
  std::vector<std::pair<ValuePtr, ValuePtr>> entries_;
  std::unique_ptr<Rare> rare_;
};

// The name a dict key or list index contributes to a dotted tensor path ("0", "exp_avg").
std::string path_component(const Value& key);

}  // namespace ckpt
