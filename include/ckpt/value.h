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

struct Value;
using ValuePtr = std::shared_ptr<Value>;
using ConstValuePtr = std::shared_ptr<const Value>;

struct Value {
  enum class Kind : uint8_t {
    kNone, kBool, kInt, kFloat, kComplex, kString, kBytes,
    kList, kTuple, kSet, kDict,
    kTensor,  // `index` into the tensor table
    kGlobal,  // a class or function named module.name (e.g. torch.float32, a TorchScript class)
    kObject,  // an instance: `type` = its class, `args` = constructor args, `state` = BUILD state
  };
  Kind kind = Kind::kNone;
  bool b = false;
  bool bytearray = false;    // kBytes: was a bytearray
  int64_t i = 0;          // kInt; kTensor: index
  double f = 0;
  std::complex<double> c;
  std::string s;          // kString (UTF-8), kBytes (raw); kInt: decimal digits when it does not fit i64
  std::vector<ValuePtr> items;                          // kList, kTuple, kSet; kObject: args
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;   // kDict, in insertion order
  std::string module, name;  // kGlobal; kObject and kDict: class (empty for a plain dict)
  ValuePtr state;            // kObject/kDict: state from BUILD (e.g. OrderedDict's _metadata), may be null

  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) = default;
  // Frees children without recursion, so that a deeply nested tree (a hostile pickle can nest
  // 1e6 lists) cannot overflow the stack when it dies.
  ~Value();

  static ValuePtr none();
  static ValuePtr boolean(bool v);
  static ValuePtr integer(int64_t v);
  static ValuePtr real(double v);
  static ValuePtr complex(std::complex<double> v);
  static ValuePtr string(std::string v);
  static ValuePtr bytes(std::string v);
  static ValuePtr list(std::vector<ValuePtr> items = {});
  static ValuePtr tuple(std::vector<ValuePtr> items = {});
  static ValuePtr dict();  // plain dict
  static ValuePtr ordered_dict();  // collections.OrderedDict
  static ValuePtr tensor(size_t index);
  static ValuePtr global(std::string module, std::string name);
  static ValuePtr object(std::string module, std::string name, std::vector<ValuePtr> args = {},
                         ValuePtr state = nullptr);

  bool is_none() const noexcept { return kind == Kind::kNone; }
  bool is_dict() const noexcept { return kind == Kind::kDict; }
  bool is_sequence() const noexcept { return kind == Kind::kList || kind == Kind::kTuple; }
  // kDict: the value under a string or int key, or null.
  ValuePtr get(std::string_view key) const;
  ValuePtr get(int64_t key) const;
  // kDict: appends (or replaces) an entry.
  void set(ValuePtr key, ValuePtr value);
  void set(std::string key, ValuePtr value) { set(string(std::move(key)), std::move(value)); }

  // Short one-line Python-like text ("OrderedDict(3 items)", "'abc'", "1.5"). Tensors print as
  // "tensor#N".
  std::string repr(size_t max_len = 80) const;
};

// The name a dict key or list index contributes to a dotted tensor path ("0", "exp_avg").
std::string path_component(const Value& key);

}  // namespace ckpt
