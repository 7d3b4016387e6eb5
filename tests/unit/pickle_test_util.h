#pragma once
// Helpers shared by the pickle tests: hex decoding, Value builders, and a canonical text form of
// a Value tree to compare against.

#include <cstdio>
#include <string>
#include <string_view>

#include "ckpt/value.h"

namespace ckpt::test {

inline std::string from_hex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}
inline std::string to_hex(std::string_view bytes) {
  std::string out;
  char buf[3];
  for (unsigned char c : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

inline ValuePtr I(int64_t v) { return Value::integer(v); }
inline ValuePtr S(std::string s) { return Value::string(std::move(s)); }
inline ValuePtr big_int(std::string digits) { return Value::big_integer(std::move(digits)); }
inline ValuePtr dict_of(std::vector<std::pair<ValuePtr, ValuePtr>> entries,
                        ValuePtr base = nullptr) {
  auto d = base ? base : Value::dict();
  d->entries() = std::move(entries);
  return d;
}
inline ValuePtr set_of(std::vector<ValuePtr> items) { return Value::set(std::move(items)); }

// Python-like text of a tree: dict classes and BUILD state show, objects as module.name(args).
// Recursion is bounded: the trees compared here are small.
inline std::string dump(const ValuePtr& vp, int depth = 0) {
  if (!vp) return "<null>";
  if (depth > 50) return "...";
  const Value& v = *vp;
  auto seq = [&](const std::vector<ValuePtr>& items) {
    std::string s;
    for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + dump(items[i], depth + 1);
    return s;
  };
  std::string state = v.state() ? " state=" + dump(v.state(), depth + 1) : "";
  switch (v.kind()) {
    case Value::Kind::kString:
      return "'" + v.str() + "'";
    case Value::Kind::kList:
      return "[" + seq(v.items()) + "]";
    case Value::Kind::kTuple:
      return "(" + seq(v.items()) + (v.items().size() == 1 ? ",)" : ")");
    case Value::Kind::kSet:
      return "{" + seq(v.items()) + "}";
    case Value::Kind::kDict: {
      std::string s = v.module().empty() ? "{" : v.module() + "." + v.name() + "{";
      for (size_t i = 0; i < v.entries().size(); ++i)
        s += (i ? ", " : "") + dump(v.entries()[i].first, depth + 1) + ": " +
             dump(v.entries()[i].second, depth + 1);
      return s + "}" + state;
    }
    case Value::Kind::kObject:
      return v.module() + "." + v.name() + "(" + seq(v.items()) + ")" + state;
    case Value::Kind::kGlobal:
      return "<" + v.module() + "." + v.name() + ">";
    default:
      return v.repr(1000);
  }
}

}  // namespace ckpt::test
