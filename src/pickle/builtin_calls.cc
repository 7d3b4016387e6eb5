#include "pickle/builtin_calls.h"

#include <string_view>

#include "ckpt/error.h"
#include "pickle/pickle_text.h"

namespace ckpt::internal {
namespace {

using Kind = Value::Kind;

ValuePtr make_set(std::vector<ValuePtr> items) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::kSet;
  v->items = std::move(items);
  return v;
}

bool is_number(const Value& v) {
  return v.kind == Kind::kInt || v.kind == Kind::kFloat || v.kind == Kind::kBool;
}
double to_double(const Value& v) {
  if (v.kind == Kind::kFloat) return v.f;
  if (v.kind == Kind::kBool) return v.b ? 1.0 : 0.0;
  // A big int keeps only its text; strtod reads it as Python's float(int) would (to the nearest).
  return v.s.empty() ? static_cast<double>(v.i) : std::strtod(v.s.c_str(), nullptr);
}

// str.encode(encoding) for the encodings pickles use; nullopt-like false for others.
bool encode_str(const Value& str, const Value* encoding, std::string& out) {
  std::string_view enc = encoding ? std::string_view(encoding->s) : "utf-8";
  if (enc == "latin1" || enc == "latin-1" || enc == "iso-8859-1" || enc == "l1") {
    if (!pickle_text::utf8_to_latin1(str.s, out))
      throw Error(ErrorCode::kCorrupt, "str cannot be encoded as latin-1");
    return true;
  }
  if (enc == "utf-8" || enc == "utf8" || enc == "UTF-8") {
    out = str.s;
    return true;
  }
  return false;
}

// bytes(...) / bytearray(...): (), (bytes), (str, encoding), (list of ints 0..255).
ValuePtr make_bytes(const Value& args, bool bytearray, CopyBudget& budget) {
  const auto& a = args.items;
  std::string out;
  if (a.empty()) {
  } else if (a.size() == 1 && a[0]->kind == Kind::kBytes) {
    budget.spend(a[0]->s.size() / 8);
    out = a[0]->s;
  } else if (a.size() == 2 && a[0]->kind == Kind::kString && a[1]->kind == Kind::kString) {
    budget.spend(a[0]->s.size() / 8);
    if (!encode_str(*a[0], a[1].get(), out)) return nullptr;
  } else if (a.size() == 1 && a[0]->is_sequence()) {
    budget.spend(a[0]->items.size());
    for (const auto& it : a[0]->items) {
      if (it->kind != Kind::kInt || !it->s.empty() || it->i < 0 || it->i > 255) return nullptr;
      out.push_back(static_cast<char>(it->i));
    }
  } else {
    return nullptr;
  }
  auto v = Value::bytes(std::move(out));
  v->bytearray = bytearray;
  return v;
}

ValuePtr ordered_dict(const Value& args, CopyBudget& budget) {
  auto d = Value::ordered_dict();
  if (args.items.empty()) return d;
  if (args.items.size() != 1) return nullptr;
  const Value& src = *args.items[0];
  if (src.kind == Kind::kDict) {
    budget.spend(src.entries.size());
    d->entries = src.entries;
    return d;
  }
  // Python 2's OrderedDict.__reduce__ passes [[key, value], ...].
  if (!src.is_sequence()) return nullptr;
  budget.spend(src.items.size());
  d->entries.reserve(src.items.size());
  for (const auto& pair : src.items) {
    if (!pair->is_sequence() || pair->items.size() != 2) return nullptr;
    d->entries.emplace_back(pair->items[0], pair->items[1]);
  }
  return d;
}

ValuePtr set_of(const Value& args, CopyBudget& budget) {
  if (args.items.empty()) return make_set({});
  if (args.items.size() != 1) return nullptr;
  const Value& src = *args.items[0];
  if (src.is_sequence() || src.kind == Kind::kSet) {
    budget.spend(src.items.size());
    return make_set(src.items);
  }
  if (src.kind == Kind::kDict) {
    budget.spend(src.entries.size());
    std::vector<ValuePtr> keys;
    keys.reserve(src.entries.size());
    for (const auto& e : src.entries) keys.push_back(e.first);
    return make_set(std::move(keys));
  }
  return nullptr;
}

ValuePtr complex_of(const Value& args) {
  const auto& a = args.items;
  if (a.size() > 2) return nullptr;
  for (const auto& x : a)
    if (!is_number(*x)) return nullptr;
  double re = a.size() > 0 ? to_double(*a[0]) : 0.0;
  double im = a.size() > 1 ? to_double(*a[1]) : 0.0;
  return Value::complex({re, im});
}

}  // namespace

void CopyBudget::spend(uint64_t elements) {
  if (elements > left_)
    throw Error(ErrorCode::kLimitExceeded,
                "pickle copies shared containers too often (more element copies than the pickle "
                "has bytes)");
  left_ -= elements;
}

const char* kind_name(Value::Kind kind) noexcept {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kComplex:
      return "complex";
    case Kind::kString:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kSet:
      return "set";
    case Kind::kDict:
      return "dict";
    case Kind::kTensor:
      return "tensor";
    case Kind::kGlobal:
      return "global";
    case Kind::kObject:
      return "object";
  }
  return "?";
}

ValuePtr builtin_call(const Value& callable, const Value& args, CopyBudget& budget) {
  const std::string& m = callable.module;
  const std::string& n = callable.name;
  if (m == "collections" && n == "OrderedDict") return ordered_dict(args, budget);
  if (m == "_codecs" && n == "encode") {
    const auto& a = args.items;
    if (a.empty() || a.size() > 2 || a[0]->kind != Kind::kString) return nullptr;
    if (a.size() == 2 && a[1]->kind != Kind::kString) return nullptr;
    budget.spend(a[0]->s.size() / 8);
    std::string out;
    if (!encode_str(*a[0], a.size() == 2 ? a[1].get() : nullptr, out)) return nullptr;
    return Value::bytes(std::move(out));
  }
  if (m != "builtins") return nullptr;
  if (n == "set" || n == "frozenset") return set_of(args, budget);
  if (n == "complex") return complex_of(args);
  if (n == "bytearray") return make_bytes(args, true, budget);
  if (n == "bytes") return make_bytes(args, false, budget);
  return nullptr;
}

}  // namespace ckpt::internal
