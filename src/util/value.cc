#include "ckpt/value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ckpt {
namespace {
ValuePtr make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}
}  // namespace

Value::~Value() {
  if (items.empty() && entries.empty() && !state) return;
  // Children with children of their own (and no other owner) are emptied here one by one, from
  // `pending`; every other child dies in place, where its destructor has nothing to recurse on. A
  // state dict of 20,000 leaves thus needs no stack, and a chain nested 1e6 deep needs one slot.
  std::vector<ValuePtr> pending;
  auto take = [&pending](ValuePtr& p) {
    if (!p) return;
    const Value& c = *p;
    if (p.use_count() == 1 && (!c.items.empty() || !c.entries.empty() || c.state))
      pending.push_back(std::move(p));
    else
      p.reset();  // a leaf, or shared: no recursion either way
  };
  auto drain = [&take](Value& v) {
    for (auto& it : v.items) take(it);
    for (auto& [k, val] : v.entries) {
      take(k);
      take(val);
    }
    take(v.state);
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
  v->b = b;
  return v;
}
ValuePtr Value::integer(int64_t i) {
  auto v = make(Kind::kInt);
  v->i = i;
  return v;
}
ValuePtr Value::real(double f) {
  auto v = make(Kind::kFloat);
  v->f = f;
  return v;
}
ValuePtr Value::complex(std::complex<double> c) {
  auto v = make(Kind::kComplex);
  v->c = c;
  return v;
}
ValuePtr Value::string(std::string s) {
  auto v = make(Kind::kString);
  v->s = std::move(s);
  return v;
}
ValuePtr Value::bytes(std::string s) {
  auto v = make(Kind::kBytes);
  v->s = std::move(s);
  return v;
}
ValuePtr Value::list(std::vector<ValuePtr> items) {
  auto v = make(Kind::kList);
  v->items = std::move(items);
  return v;
}
ValuePtr Value::tuple(std::vector<ValuePtr> items) {
  auto v = make(Kind::kTuple);
  v->items = std::move(items);
  return v;
}
ValuePtr Value::dict() { return make(Kind::kDict); }
ValuePtr Value::ordered_dict() {
  auto v = make(Kind::kDict);
  v->module = "collections";
  v->name = "OrderedDict";
  return v;
}
ValuePtr Value::tensor(size_t index) {
  auto v = make(Kind::kTensor);
  v->i = static_cast<int64_t>(index);
  return v;
}
ValuePtr Value::global(std::string module, std::string name) {
  auto v = make(Kind::kGlobal);
  v->module = std::move(module);
  v->name = std::move(name);
  return v;
}
ValuePtr Value::object(std::string module, std::string name, std::vector<ValuePtr> args,
                       ValuePtr state) {
  auto v = make(Kind::kObject);
  v->module = std::move(module);
  v->name = std::move(name);
  v->items = std::move(args);
  v->state = std::move(state);
  return v;
}

ValuePtr Value::get(std::string_view key) const {
  for (auto& [k, v] : entries)
    if (k && k->kind == Kind::kString && k->s == key) return v;
  return nullptr;
}
ValuePtr Value::get(int64_t key) const {
  for (auto& [k, v] : entries)
    if (k && k->kind == Kind::kInt && k->i == key) return v;
  return nullptr;
}

void Value::set(ValuePtr key, ValuePtr value) {
  for (auto& e : entries) {
    const Value& k = *e.first;
    if (k.kind == key->kind &&
        ((k.kind == Kind::kString && k.s == key->s) || (k.kind == Kind::kInt && k.i == key->i))) {
      e.second = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
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
}  // namespace

std::string Value::repr(size_t max_len) const {
  std::string s;
  switch (kind) {
    case Kind::kNone: s = "None"; break;
    case Kind::kBool: s = b ? "True" : "False"; break;
    case Kind::kInt: s = this->s.empty() ? std::to_string(i) : this->s; break;
    case Kind::kFloat: s = fmt_float(f); break;
    case Kind::kComplex: s = "(" + fmt_float(c.real()) + "+" + fmt_float(c.imag()) + "j)"; break;
    case Kind::kString: s = quote(this->s); break;
    case Kind::kBytes: s = (bytearray ? "bytearray(b" : "b") + quote(this->s) + (bytearray ? ")" : ""); break;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kSet: {
      const char* open = kind == Kind::kList ? "[" : kind == Kind::kTuple ? "(" : "{";
      const char* close = kind == Kind::kList ? "]" : kind == Kind::kTuple ? ")" : "}";
      s = open;
      for (size_t n = 0; n < items.size(); ++n) {
        if (n) s += ", ";
        s += items[n] ? items[n]->repr(max_len) : "?";
        if (s.size() > max_len) break;
      }
      if (kind == Kind::kTuple && items.size() == 1) s += ",";
      s += close;
      break;
    }
    case Kind::kDict:
      s = (name.empty() ? std::string("dict") : name) + "(" + std::to_string(entries.size()) +
          (entries.size() == 1 ? " item)" : " items)");
      break;
    case Kind::kTensor: s = "tensor#" + std::to_string(i); break;
    case Kind::kGlobal: s = module + "." + name; break;
    case Kind::kObject: s = module + "." + name + "(...)"; break;
  }
  if (s.size() > max_len && max_len > 3) s = s.substr(0, max_len - 3) + "...";
  return s;
}

std::string path_component(const Value& key) {
  switch (key.kind) {
    case Value::Kind::kString: return key.s;
    case Value::Kind::kInt: return key.s.empty() ? std::to_string(key.i) : key.s;
    case Value::Kind::kBool: return key.b ? "True" : "False";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kFloat: return key.repr();
    case Value::Kind::kTuple: {
      std::string s;
      for (auto& it : key.items) s += (s.empty() ? "" : ",") + (it ? path_component(*it) : "?");
      return "(" + s + ")";
    }
    default: return key.repr(40);
  }
}

}  // namespace ckpt
