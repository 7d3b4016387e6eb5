// YAML transform recipes through yaml-cpp: the YAML becomes the JSON tree the recipe reader takes
// (recipe_tree.h), its scalars typed explicitly. Built only with yaml-cpp (recipe_yaml_missing.cc
// without it).

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "ckpt/error.h"
#include "convert/recipe_tree.h"

namespace ckpt::internal {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxNodes = 100000;  // aliases repeat a node: the expanded tree is bounded
constexpr int kMaxDepth = 32;
constexpr std::string_view kCore = "tag:yaml.org,2002:";

std::string position(const YAML::Mark& m) {
  if (m.is_null()) return {};
  return "line " + std::to_string(m.line + 1) + ", column " + std::to_string(m.column + 1) + ": ";
}

bool one_of(const std::string& s, std::initializer_list<const char*> words) {
  for (const char* w : words)
    if (s == w) return true;
  return false;
}

class YamlToJson {
 public:
  YamlToJson(const std::string& source, RecipeTree& tree) : source_(source), tree_(tree) {}

  // `out` is filled in place (its address is the one recorded): arrays are sized first, so that
  // their elements never move.
  void node(const YAML::Node& y, Json& out, int depth) {
    if (++nodes_ > kMaxNodes)
      fail(y.Mark(), "more than " + std::to_string(kMaxNodes) + " nodes (aliases expanded)");
    if (depth > kMaxDepth) fail(y.Mark(), "nested deeper than " + std::to_string(kMaxDepth));
    const YAML::Mark m = y.Mark();
    if (!m.is_null()) tree_.positions[&out] = {m.line + 1, m.column + 1};
    switch (y.Type()) {
      case YAML::NodeType::Null:
        if (!tagged(y, "null") && !tagged(y, "str"))
          fail(m, "tag " + y.Tag() + " on an empty value");
        out = y.Tag() == std::string(kCore) + "str" ? Json("") : Json(nullptr);
        return;
      case YAML::NodeType::Scalar:
        out = scalar(y);
        return;
      case YAML::NodeType::Sequence: {
        if (!tagged(y, "seq")) fail(m, "tag " + y.Tag() + " on a list");
        out = Json::array();
        auto& items = out.get_ref<Json::array_t&>();
        items.resize(y.size());
        size_t i = 0;
        for (const auto& item : y)
          if (i < items.size()) node(item, items[i++], depth + 1);
        return;
      }
      case YAML::NodeType::Map:
        if (!tagged(y, "map")) fail(m, "tag " + y.Tag() + " on a mapping");
        out = Json::object();
        for (const auto& kv : y) {
          if (kv.first.Type() != YAML::NodeType::Scalar)
            fail(kv.first.Mark(), "a mapping key is not a plain string");
          const std::string& key = kv.first.Scalar();
          if (out.contains(key)) fail(kv.first.Mark(), "duplicate key \"" + key + "\"");
          node(kv.second, out[key], depth + 1);
        }
        return;
      case YAML::NodeType::Undefined:
        break;
    }
    fail(m, "an undefined node");
  }

  [[noreturn]] void fail(const YAML::Mark& m, const std::string& what) const {
    throw Error(ErrorCode::kInvalidArgument, "transform recipe (YAML): " + position(m) + what,
                source_);
  }

 private:
  // No tag ("?" plain, "!" quoted or block) or YAML's own tag `core`.
  static bool tagged(const YAML::Node& y, std::string_view core) {
    const std::string& t = y.Tag();
    return t.empty() || t == "?" || t == "!" ||
           (t.size() == kCore.size() + core.size() && t.starts_with(kCore) && t.ends_with(core));
  }

  Json scalar(const YAML::Node& y) const {
    const std::string& t = y.Tag();
    const std::string& s = y.Scalar();
    if (t == "!" || t == std::string(kCore) + "str") return s;  // quoted, block, or !!str
    std::optional<Json> v = core_type(y);
    if (t == "?" || t.empty()) {  // plain
      if (one_of(s, {"yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF"}))
        fail(y.Mark(), "'" + s +
                           "' is a boolean in YAML 1.1 and a string in YAML 1.2: write true or "
                           "false, or quote it");
      return v ? *v : Json(s);
    }
    const std::string want = t.starts_with(kCore) ? t.substr(kCore.size()) : t;
    const bool ok =
        v && ((want == "int" && v->is_number_integer()) || (want == "float" && v->is_number()) ||
              (want == "bool" && v->is_boolean()) || (want == "null" && v->is_null()));
    if (!ok) {
      if (!one_of(want, {"int", "float", "bool", "null"}))
        fail(y.Mark(), "tag " + t + ": only !!str, !!int, !!float, !!bool, !!null, !!seq, !!map");
      fail(y.Mark(), "'" + s + "' is not a YAML " + want);
    }
    return want == "float" ? Json(v->get<double>()) : *v;
  }

  // YAML 1.2's core schema for a plain scalar: null, bool, int (int64: one beyond its range is
  // refused), float, or nothing (a string).
  std::optional<Json> core_type(const YAML::Node& y) const {
    const std::string& s = y.Scalar();
    if (one_of(s, {"", "~", "null", "Null", "NULL"})) return Json(nullptr);
    if (one_of(s, {"true", "True", "TRUE"})) return Json(true);
    if (one_of(s, {"false", "False", "FALSE"})) return Json(false);
    if (one_of(s, {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"})) return Json(INFINITY);
    if (one_of(s, {"-.inf", "-.Inf", "-.INF"})) return Json(-INFINITY);
    if (one_of(s, {".nan", ".NaN", ".NAN"})) return Json(NAN);
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x'))
      return integer(y, std::string_view(s).substr(2), s[1] == 'o' ? 8 : 16, false);
    const bool neg = s[0] == '-';
    std::string_view d(s);
    if (neg || s[0] == '+') d.remove_prefix(1);
    if (d.find_first_not_of("0123456789") == std::string_view::npos) return integer(y, d, 10, neg);
    // [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
    size_t i = 0;
    auto digits = [&] {
      const size_t from = i;
      while (i < d.size() && d[i] >= '0' && d[i] <= '9') ++i;
      return i > from;
    };
    const bool whole = digits();
    bool frac = false;
    if (i < d.size() && d[i] == '.') {
      ++i;
      frac = digits();
    }
    if (!whole && !frac) return std::nullopt;
    if (i < d.size() && (d[i] == 'e' || d[i] == 'E')) {
      ++i;
      if (i < d.size() && (d[i] == '-' || d[i] == '+')) ++i;
      if (!digits()) return std::nullopt;
    }
    if (i != d.size()) return std::nullopt;
    return Json(std::strtod(s.c_str(), nullptr));
  }

  std::optional<Json> integer(const YAML::Node& y, std::string_view d, int base, bool neg) const {
    if (d.empty() || d.find_first_not_of(base == 8 ? "01234567" : "0123456789abcdefABCDEF") !=
                         std::string_view::npos)
      return std::nullopt;  // "0x", "0o8", a lone sign: strings
    uint64_t u = 0;
    auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), u, base);
    if (ec != std::errc() || end != d.data() + d.size() ||
        u > (neg ? uint64_t{1} << 63 : uint64_t{INT64_MAX}))
      fail(y.Mark(), "the integer " + y.Scalar() + " is beyond int64's range");
    return Json(neg ? static_cast<int64_t>(0 - u) : static_cast<int64_t>(u));
  }

  const std::string& source_;
  RecipeTree& tree_;
  size_t nodes_ = 0;
};

}  // namespace

void read_yaml_recipe(std::string_view text, const std::string& source, RecipeTree& tree) {
  YamlToJson to_json(source, tree);
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(std::string(text));
  } catch (const YAML::Exception& e) {
    to_json.fail(e.mark, e.msg);
  }
  if (docs.empty()) to_json.fail(YAML::Mark::null_mark(), "empty (a recipe is a mapping)");
  if (docs.size() > 1) to_json.fail(docs[1].Mark(), "a second document (--- ...)");
  try {
    to_json.node(docs[0], tree.root, 0);
  } catch (const YAML::Exception& e) {
    to_json.fail(e.mark, e.msg);
  }
}

}  // namespace ckpt::internal
