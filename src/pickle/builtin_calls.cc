#include "pickle/builtin_calls.h"

#include <string_view>
#include <vector>

#include "ckpt/error.h"
#include "pickle/pickle_text.h"

namespace ckpt::internal {
namespace {

using Kind = Value::Kind;

bool is_number(const PickleHeap& h, Ref r) {
  Kind k = h.kind(r);
  return k == Kind::kInt || k == Kind::kFloat || k == Kind::kBool;
}
double to_double(const PickleHeap& h, Ref r) {
  if (h.kind(r) == Kind::kFloat) return h.float_value(r);
  if (h.kind(r) == Kind::kBool) return h.truth(r) ? 1.0 : 0.0;
  // A big int keeps only its text; strtod reads it as Python's float(int) would (to the nearest).
  if (h.is_small_int(r)) return static_cast<double>(h.int_value(r));
  return std::strtod(std::string(h.text(r)).c_str(), nullptr);
}
bool is_sequence(const PickleHeap& h, Ref r) {
  return h.kind(r) == Kind::kList || h.kind(r) == Kind::kTuple;
}

// str.encode(encoding) for the encodings pickles use; false for others.
bool encode_str(std::string_view str, std::string_view enc, std::string& out) {
  if (enc == "latin1" || enc == "latin-1" || enc == "iso-8859-1" || enc == "l1") {
    if (!pickle_text::utf8_to_latin1(str, out))
      throw Error(ErrorCode::kCorrupt, "str cannot be encoded as latin-1");
    return true;
  }
  if (enc == "utf-8" || enc == "utf8" || enc == "UTF-8") {
    out = str;
    return true;
  }
  return false;
}

// bytes(...) / bytearray(...): (), (bytes), (str, encoding), (list of ints 0..255).
Ref make_bytes(PickleHeap& h, std::span<const Ref> a, bool bytearray, CopyBudget& budget) {
  std::string out;
  if (a.empty()) {
  } else if (a.size() == 1 && h.kind(a[0]) == Kind::kBytes) {
    budget.spend(h.text(a[0]).size() / 8);
    out = h.text(a[0]);
  } else if (a.size() == 2 && h.kind(a[0]) == Kind::kString && h.kind(a[1]) == Kind::kString) {
    budget.spend(h.text(a[0]).size() / 8);
    if (!encode_str(h.text(a[0]), h.text(a[1]), out)) return kNoRef;
  } else if (a.size() == 1 && is_sequence(h, a[0])) {
    auto items = h.items(a[0]);
    budget.spend(items.size());
    for (Ref it : items) {
      if (!h.is_small_int(it) || h.int_value(it) < 0 || h.int_value(it) > 255) return kNoRef;
      out.push_back(static_cast<char>(h.int_value(it)));
    }
  } else {
    return kNoRef;
  }
  return h.bytes(out, bytearray);
}

Ref ordered_dict(PickleHeap& h, Ref cls, std::span<const Ref> a, CopyBudget& budget) {
  if (a.size() > 1) return kNoRef;
  if (a.empty()) return h.dict(cls);
  const Ref src = a[0];
  if (h.kind(src) == Kind::kDict) {
    std::vector<Ref> entries(h.items(src).begin(), h.items(src).end());
    budget.spend(entries.size() / 2);
    Ref d = h.dict(cls);
    h.append(d, entries);
    return d;
  }
  // Python 2's OrderedDict.__reduce__ passes [[key, value], ...].
  if (!is_sequence(h, src)) return kNoRef;
  auto pairs = h.items(src);
  budget.spend(pairs.size());
  std::vector<Ref> entries;
  entries.reserve(2 * pairs.size());
  for (Ref pair : pairs) {
    if (!is_sequence(h, pair) || h.items(pair).size() != 2) return kNoRef;
    entries.push_back(h.items(pair)[0]);
    entries.push_back(h.items(pair)[1]);
  }
  Ref d = h.dict(cls);
  h.append(d, entries);
  return d;
}

Ref set_of(PickleHeap& h, std::span<const Ref> a, CopyBudget& budget, bool frozen) {
  if (a.empty()) return h.set({}, frozen);
  if (a.size() != 1) return kNoRef;
  const Ref src = a[0];
  if (is_sequence(h, src) || h.kind(src) == Kind::kSet) {
    std::vector<Ref> items(h.items(src).begin(), h.items(src).end());
    budget.spend(items.size());
    return h.set(items, frozen);
  }
  if (h.kind(src) == Kind::kDict) {
    auto entries = h.items(src);
    budget.spend(entries.size() / 2);
    std::vector<Ref> keys;
    keys.reserve(entries.size() / 2);
    for (size_t i = 0; i < entries.size(); i += 2) keys.push_back(entries[i]);
    return h.set(keys, frozen);
  }
  return kNoRef;
}

Ref complex_of(PickleHeap& h, std::span<const Ref> a) {
  if (a.size() > 2) return kNoRef;
  for (Ref x : a)
    if (!is_number(h, x)) return kNoRef;
  double re = a.size() > 0 ? to_double(h, a[0]) : 0.0;
  double im = a.size() > 1 ? to_double(h, a[1]) : 0.0;
  return h.complex({re, im});
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

Ref builtin_call(PickleHeap& h, Ref callable, std::span<const Ref> a, CopyBudget& budget) {
  const std::string_view m = h.module(callable), n = h.name(callable);
  if (m == "collections" && n == "OrderedDict") return ordered_dict(h, callable, a, budget);
  // Counter(dict): a dict of class Counter. defaultdict(factory): a dict of class defaultdict
  // whose argument (the factory, a global or None) is kept; its items follow as SETITEMS.
  if (m == "collections" && n == "Counter") {
    if (a.size() == 1 && h.kind(a[0]) != Kind::kDict) return kNoRef;
    return ordered_dict(h, callable, a, budget);
  }
  if (m == "collections" && n == "defaultdict") {
    if (a.size() > 1) return kNoRef;
    return h.dict(callable, a.empty() ? kNoRef : h.tuple(a));
  }
  if (m == "_codecs" && n == "encode") {
    if (a.empty() || a.size() > 2 || h.kind(a[0]) != Kind::kString) return kNoRef;
    if (a.size() == 2 && h.kind(a[1]) != Kind::kString) return kNoRef;
    budget.spend(h.text(a[0]).size() / 8);
    std::string out;
    if (!encode_str(h.text(a[0]), a.size() == 2 ? h.text(a[1]) : "utf-8", out)) return kNoRef;
    return h.bytes(out);
  }
  if (m != "builtins") return kNoRef;
  if (n == "set" || n == "frozenset") return set_of(h, a, budget, n == "frozenset");
  if (n == "complex") return complex_of(h, a);
  if (n == "bytearray") return make_bytes(h, a, true, budget);
  if (n == "bytes") return make_bytes(h, a, false, budget);
  return kNoRef;
}

}  // namespace ckpt::internal
