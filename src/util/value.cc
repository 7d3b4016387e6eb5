#include "ckpt/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "ckpt/error.h"

namespace ckpt {
const Value::Rare Value::kNoRare{};

Value::Value(const Value& o)
    : kind_(o.kind_),
      b_(o.b_),
      bytearray_(o.bytearray_),
      foreign_(o.foreign_),
      call_(o.call_),
      i_(o.i_),
      s_(o.s_),
      items_(o.items_),
      entries_(o.entries_),
      rare_(o.rare_ ? std::make_unique<Rare>(*o.rare_) : nullptr) {}

Value& Value::operator=(const Value& o) {
  if (this != &o) {
    Value copy(o);
    *this = std::move(copy);
  }
  return *this;
}

ValuePtr Value::make(Kind k) {
  auto v = std::make_shared<Value>();
  v->kind_ = k;
  return v;
}
ValuePtr Value::with_items(Kind k, std::vector<ValuePtr> items) {
  auto v = make(k);
  v->items_ = std::move(items);
  return v;
}
ValuePtr Value::with_names(Kind k, std::string module, std::string name) {
  auto v = make(k);
  if (!module.empty() || !name.empty()) {
    v->own_rare().module = std::move(module);
    v->own_rare().name = std::move(name);
  }
  return v;
}

Value::~Value() {
  if (items_.empty() && entries_.empty() &&
      !(rare_ && (rare_->state || rare_->origin || !rare_->appended.empty())))
    return;
  // Children with children of their own (and no other owner) are emptied here one by one, from
  // `pending`; every other child dies in place, where its destructor has nothing to recurse on. A
  // state_ dict of 20,000 leaves thus needs no stack, and a chain nested 1e6 deep needs one slot.
  std::vector<ValuePtr> pending;
  auto take = [&pending](ValuePtr& p) {
    if (!p) return;
    const Value& c = *p;
    if (p.use_count() == 1 && (!c.items_.empty() || !c.entries_.empty() || c.state() ||
                               !c.rare().appended.empty() || c.origin()))
      pending.push_back(std::move(p));
    else
      p.reset();  // a leaf, or shared: no recursion either way
  };
  auto drain = [&take](Value& v) {
    for (auto& it : v.items_) take(it);
    for (auto& [k, val] : v.entries_) {
      take(k);
      take(val);
    }
    if (v.rare_) {
      take(v.rare_->state);
      for (auto& it : v.rare_->appended) take(it);
      take(v.rare_->origin);
    }
  };
  drain(*this);
  while (!pending.empty()) {
    ValuePtr v = std::move(pending.back());
    pending.pop_back();
    if (v.use_count() == 1) drain(*v);
  }
}

ValuePtr Value::none() { return make(Kind::kNone); }
ValuePtr Value::boolean(bool b) {
  auto v = make(Kind::kBool);
  v->b_ = b;
  return v;
}
ValuePtr Value::integer(int64_t i) {
  auto v = make(Kind::kInt);
  v->i_ = i;
  return v;
}
ValuePtr Value::real(double f) {
  auto v = make(Kind::kFloat);
  v->f_ = f;
  return v;
}
ValuePtr Value::complex(std::complex<double> c) {
  auto v = make(Kind::kComplex);
  if (c != std::complex<double>{}) v->own_rare().c = c;
  return v;
}
ValuePtr Value::string(std::string s) {
  auto v = make(Kind::kString);
  v->s_ = std::move(s);
  return v;
}
ValuePtr Value::bytes(std::string s, bool bytearray) {
  auto v = make(Kind::kBytes);
  v->s_ = std::move(s);
  v->bytearray_ = bytearray;
  return v;
}
ValuePtr Value::big_integer(std::string digits) {
  auto v = make(Kind::kInt);
  v->s_ = std::move(digits);
  return v;
}
ValuePtr Value::set(std::vector<ValuePtr> items) {
  return with_items(Kind::kSet, std::move(items));
}
ValuePtr Value::frozenset(std::vector<ValuePtr> items) {
  auto v = with_items(Kind::kSet, std::move(items));
  v->own_rare().module = "builtins";
  v->own_rare().name = "frozenset";
  return v;
}
ValuePtr Value::dict_of(std::string module, std::string name) {
  return with_names(Kind::kDict, std::move(module), std::move(name));
}
ValuePtr Value::list(std::vector<ValuePtr> items) {
  return with_items(Kind::kList, std::move(items));
}
ValuePtr Value::tuple(std::vector<ValuePtr> items) {
  return with_items(Kind::kTuple, std::move(items));
}
ValuePtr Value::dict() { return make(Kind::kDict); }
ValuePtr Value::ordered_dict() { return with_names(Kind::kDict, "collections", "OrderedDict"); }
ValuePtr Value::tensor(size_t index) {
  auto v = make(Kind::kTensor);
  v->i_ = static_cast<int64_t>(index);
  return v;
}
ValuePtr Value::global(std::string module, std::string name) {
  return with_names(Kind::kGlobal, std::move(module), std::move(name));
}
ValuePtr Value::object(std::string module, std::string name, std::vector<ValuePtr> args,
                       ValuePtr state, int64_t tag) {
  auto v = with_names(Kind::kObject, std::move(module), std::move(name));
  v->items_ = std::move(args);
  v->set_state(std::move(state));
  v->i_ = tag;
  return v;
}

ValuePtr Value::get(std::string_view key) const {
  for (auto& [k, v] : entries_)
    if (k && k->kind_ == Kind::kString && k->s_ == key) return v;
  return nullptr;
}
ValuePtr Value::get(int64_t key) const {
  for (auto& [k, v] : entries_)
    if (k && k->kind_ == Kind::kInt && k->i_ == key) return v;
  return nullptr;
}

void Value::set(ValuePtr key, ValuePtr value) {
  for (auto& e : entries_) {
    const Value& k = *e.first;
    if (k.kind_ == key->kind_ && ((k.kind_ == Kind::kString && k.s_ == key->s_) ||
                                  (k.kind_ == Kind::kInt && k.i_ == key->i_))) {
      e.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

namespace {
std::string quote(const std::string& s) {
  std::string out = "'";
  for (unsigned char c : s) {
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}
std::string fmt_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", f);
  // Shortest representation that round-trips.
  for (int p = 1; p <= 17; ++p) {
    char b2[32];
    std::snprintf(b2, sizeof b2, "%.*g", p, f);
    if (std::strtod(b2, nullptr) == f) {
      std::string s = b2;
      if (s.find_first_of(".en") == std::string::npos) s += ".0";
      return s;
    }
  }
  return buf;
}

// repr and path_component recurse into containers: past this depth they print "..." (a file can
// nest 1e6 deep, and every level of a repr takes a stack frame).
constexpr uint32_t kMaxTextDepth = 1000;

std::string path_component(const Value& key, uint32_t depth);

// Value::repr of `v`, nested `depth` deep in the text being made.
std::string repr_text(const Value& v, size_t max_len, uint32_t depth) {
  using Kind = Value::Kind;
  // Each level adds at least one character before its children's text: a level deeper than
  // max_len is cut off anyway.
  if (depth > std::min<size_t>(max_len, kMaxTextDepth)) return "...";
  std::string s;
  switch (v.kind()) {
    case Kind::kNone:
      s = "None";
      break;
    case Kind::kBool:
      s = v.as_bool() ? "True" : "False";
      break;
    case Kind::kInt:
      s = v.is_big_int() ? v.str() : std::to_string(v.as_int());
      break;
    case Kind::kFloat:
      s = fmt_float(v.as_float());
      break;
    case Kind::kComplex:
      s = "(" + fmt_float(v.as_complex().real()) + "+" + fmt_float(v.as_complex().imag()) + "j)";
      break;
    case Kind::kString:
      s = quote(v.str());
      break;
    case Kind::kBytes:
      s = (v.is_bytearray() ? "bytearray(b" : "b") + quote(v.str()) + (v.is_bytearray() ? ")" : "");
      break;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kSet: {
      const char* open = v.kind() == Kind::kList ? "[" : v.kind() == Kind::kTuple ? "(" : "{";
      const char* close = v.kind() == Kind::kList ? "]" : v.kind() == Kind::kTuple ? ")" : "}";
      s = open;
      const auto& items = v.items();
      for (size_t n = 0; n < items.size(); ++n) {
        if (n) s += ", ";
        s += items[n] ? repr_text(*items[n], max_len, depth + 1) : "?";
        if (s.size() > max_len) break;
      }
      if (v.kind() == Kind::kTuple && items.size() == 1) s += ",";
      s += close;
      if (v.is_frozenset()) s = "frozenset(" + s + ")";
      break;
    }
    case Kind::kDict:
      s = (v.name().empty() ? std::string("dict") : v.name()) + "(" +
          std::to_string(v.entries().size()) + (v.entries().size() == 1 ? " item)" : " items)");
      break;
    case Kind::kTensor:
      s = "tensor#" + std::to_string(v.as_int());
      break;
    case Kind::kGlobal:
      s = v.module() + "." + v.name();
      break;
    case Kind::kObject: {
      // torch.Size((3, 4)) prints as torch does: torch.Size([3, 4]).
      const auto& args = v.items();
      if (v.module() == "torch" && v.name() == "Size" && args.size() == 1 && args[0] &&
          args[0]->is_sequence()) {
        const auto& dims = args[0]->items();
        s = "torch.Size([";
        for (size_t n = 0; n < dims.size(); ++n) {
          if (n) s += ", ";
          s += dims[n] ? repr_text(*dims[n], max_len, depth + 2) : "?";
          if (s.size() > max_len) break;
        }
        s += "])";
        break;
      }
      // module.name(args, attr=value...): the call as the pickle made it, and a dict state as
      // keyword-like attributes (argparse.Namespace(lr=0.1)).
      s = v.module() + "." + v.name() + "(";
      bool first = true;
      auto sep = [&] {
        if (!first) s += ", ";
        first = false;
      };
      for (auto& it : args) {
        if (s.size() > max_len) break;
        sep();
        s += it ? repr_text(*it, max_len, depth + 1) : "?";
      }
      const ValuePtr& state = v.state();
      if (state && state->kind() == Kind::kDict) {
        for (auto& [k, val] : state->entries()) {
          if (s.size() > max_len) break;
          sep();
          s += (k ? path_component(*k, depth + 2) : "?") + "=" +
               (val ? repr_text(*val, max_len, depth + 2) : "?");
        }
      } else if (state && !state->is_none() && s.size() <= max_len) {
        sep();
        s += "state=" + repr_text(*state, max_len, depth + 1);
      }
      s += ")";
      break;
    }
  }
  if (s.size() > max_len && max_len > 3) s = s.substr(0, max_len - 3) + "...";
  return s;
}

std::string path_component(const Value& key, uint32_t depth) {
  if (depth > kMaxTextDepth) return "...";
  switch (key.kind()) {
    case Value::Kind::kString:
      return key.str();
    case Value::Kind::kInt:
      return key.str().empty() ? std::to_string(key.as_int()) : key.str();
    case Value::Kind::kBool:
      return key.as_bool() ? "True" : "False";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kFloat:
      return repr_text(key, 80, depth);
    case Value::Kind::kTuple: {
      std::string s;
      for (auto& it : key.items())
        s += (s.empty() ? "" : ",") + (it ? path_component(*it, depth + 1) : "?");
      return "(" + s + ")";
    }
    default:
      return repr_text(key, 40, depth);
  }
}
}  // namespace

std::string Value::repr(size_t max_len) const { return repr_text(*this, max_len, 0); }

ValuePtr Value::clone(uint32_t max_depth) const {
  // Iterative: a copy of each container is made first, its children are then replaced by their
  // copies, so neither depth nor width recurses.
  std::unordered_map<const Value*, ValuePtr> copies;
  struct Item {
    ValuePtr* slot;  // where the copy of `from` goes
    const Value* from;
    uint32_t depth;
  };
  ValuePtr root;
  std::vector<Item> work{{&root, this, 0}};
  while (!work.empty()) {
    Item it = work.back();
    work.pop_back();
    if (!it.from) continue;
    auto found = copies.find(it.from);
    if (found != copies.end()) {
      *it.slot = found->second;
      continue;
    }
    if (it.depth > max_depth)
      throw Error(ErrorCode::kLimitExceeded,
                  "object tree deeper than " + std::to_string(max_depth) + " levels");
    auto copy = std::make_shared<Value>(*it.from);  // children still point at the originals
    copies.emplace(it.from, copy);
    *it.slot = copy;
    for (auto& c : copy->items_) work.push_back({&c, c.get(), it.depth + 1});
    for (auto& [k, v] : copy->entries_) {
      work.push_back({&k, k.get(), it.depth + 1});
      work.push_back({&v, v.get(), it.depth + 1});
    }
    if (copy->rare_ && copy->rare_->state)
      work.push_back({&copy->rare_->state, copy->rare_->state.get(), it.depth + 1});
    if (copy->rare_)
      for (auto& c : copy->rare_->appended) work.push_back({&c, c.get(), it.depth + 1});
    if (copy->rare_ && copy->rare_->origin)
      work.push_back({&copy->rare_->origin, copy->rare_->origin.get(), it.depth + 1});
  }
  return root;
}

std::string path_component(const Value& key) { return path_component(key, 0); }

}  // namespace ckpt
