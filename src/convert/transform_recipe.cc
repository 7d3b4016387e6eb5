// Transform recipes: a JSON or YAML recipe's tree (recipe_tree.h) read into a TransformRecipe,
// and the CLI's rule strings (include/ckpt/transform.h).

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "ckpt/transform.h"
#include "convert/recipe_tree.h"

namespace ckpt {

namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxRecipeBytes = 16 << 20;

// What is wrong with a recipe, and the node it is about: thrown without a node, which `within`
// fills in on the way up (the innermost node wins), then made an Error with the node's position.
struct Problem {
  std::string what;
  const Json* node = nullptr;
};

[[noreturn]] void bad(std::string what) { throw Problem{std::move(what)}; }

template <class F>
auto within(const Json& node, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (Problem& p) {
    if (!p.node) p.node = &node;
    throw;
  } catch (const Json::exception& e) {
    throw Problem{std::string("a field has the wrong type: ") + e.what(), &node};
  }
}

// The public string parsers: a Problem is an Error{kInvalidArgument} "transform recipe: ...".
template <class F>
auto plain(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Problem& p) {
    throw Error(ErrorCode::kInvalidArgument, "transform recipe: " + p.what);
  }
}

std::vector<std::string> cut(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t from = 0;
  for (;;) {
    const size_t at = s.find(sep, from);
    out.emplace_back(s.substr(from, at == std::string_view::npos ? s.npos : at - from));
    if (at == std::string_view::npos) return out;
    from = at + 1;
  }
}

int64_t integer(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  bad(what + ": not an integer: '" + s + "'");
}

std::string type_of(const Json& j) {
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number_integer()) return "an integer";
  if (j.is_number()) return "a float";
  if (j.is_null()) return "null";
  return j.is_array() ? "a list" : "a mapping";
}

std::string text(const Json& j, const std::string& what) {
  if (!j.is_string()) bad(what + " must be a string, not " + type_of(j));
  return j.get<std::string>();
}

// An integer, never the string of one: "0" (quoted in YAML, a string in JSON) is refused.
int64_t whole_number(const Json& j, const std::string& what) {
  if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t{INT64_MAX})
    bad(what + " is out of range");
  if (!j.is_number_integer()) {
    if (j.is_string())
      bad(what + " must be an integer, not the string \"" + j.get<std::string>() +
          "\" (write it unquoted)");
    bad(what + " must be an integer, not " + type_of(j));
  }
  return j.get<int64_t>();
}

std::vector<std::string> strings(const Json& j, const std::string& what) {
  if (j.is_string()) return {j.get<std::string>()};
  if (!j.is_array()) bad(what + " must be a string or a list of strings, not " + type_of(j));
  std::vector<std::string> out;
  for (const auto& v : j) out.push_back(within(v, [&] { return text(v, what + " item"); }));
  return out;
}

std::vector<int64_t> ints(const Json& j, const std::string& what) {
  if (!j.is_array()) bad(what + " must be a list of integers, not " + type_of(j));
  std::vector<int64_t> out;
  for (const auto& v : j) out.push_back(within(v, [&] { return whole_number(v, what + " item"); }));
  return out;
}

// The keys of a rule's mapping: each known, the required ones present.
void keys(const Json& j, const std::string& what, std::initializer_list<const char*> known,
          std::initializer_list<const char*> required) {
  for (const auto& item : j.items()) {
    const std::string& k = item.key();  // not a structured binding: the lambda captures it
    if (std::none_of(known.begin(), known.end(), [&](const char* f) { return k == f; }))
      within(item.value(), [&] { bad(what + ": unknown field \"" + k + "\""); });
  }
  for (const char* r : required)
    if (!j.contains(r)) bad(what + " has no \"" + r + "\"");
}

DType cast_dtype(std::string_view name) {
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::kFloat16;
  if (name == "fp32" || name == "float32" || name == "float") return DType::kFloat32;
  bad("cast: bf16, fp16 or fp32, not '" + std::string(name) + "'");
}

SplitRule split_rule(std::string_view text) {
  const auto f = cut(text, ':');
  if (f.size() < 3 || f.size() > 4 || f[0].empty())
    bad("split \"" + std::string(text) + "\" is not NAME:DIM:PART1,PART2[:SIZE1,SIZE2]");
  SplitRule r;
  r.name = f[0];
  r.dim = integer(f[1], "split dim");
  r.parts = cut(f[2], ',');
  if (f.size() == 4)
    for (const auto& s : cut(f[3], ',')) r.sizes.push_back(integer(s, "split size"));
  return r;
}

FuseRule fuse_rule(std::string_view text) {
  const auto f = cut(text, ':');
  if (f.size() != 3 || f[2].empty())
    bad("fuse \"" + std::string(text) + "\" is not PART1,PART2:DIM:NAME");
  return {cut(f[0], ','), integer(f[1], "fuse dim"), f[2]};
}

RenameRule rename_of(const Json& j) {
  if (j.is_string()) {  // "REGEX=REPLACEMENT", as --rename
    const std::string s = j.get<std::string>();
    const size_t eq = s.find('=');
    if (eq == std::string::npos) bad("rename \"" + s + "\" is not REGEX=REPLACEMENT");
    return {RenameRule::kRegex, s.substr(0, eq), s.substr(eq + 1)};
  }
  if (!j.is_object()) bad("a rename rule is a mapping or \"REGEX=REPLACEMENT\", not " + type_of(j));
  keys(j, "a rename rule", {"strip_prefix", "add_prefix", "regex", "replacement"}, {});
  auto str = [&](const char* k) { return within(j.at(k), [&] { return text(j.at(k), k); }); };
  if (j.size() == 1 && j.contains("strip_prefix"))
    return {RenameRule::kStripPrefix, str("strip_prefix"), ""};
  if (j.size() == 1 && j.contains("add_prefix"))
    return {RenameRule::kAddPrefix, str("add_prefix"), ""};
  if (j.size() == 2 && j.contains("regex") && j.contains("replacement"))
    return {RenameRule::kRegex, str("regex"), str("replacement")};
  bad("a rename rule has strip_prefix, add_prefix, or regex and replacement: " + j.dump());
}

SplitRule split_of(const Json& v) {
  if (v.is_string()) return split_rule(v.get<std::string>());
  if (!v.is_object()) bad("a split rule is a mapping or \"NAME:DIM:P1,P2\", not " + type_of(v));
  keys(v, "a split rule", {"name", "dim", "parts", "sizes"}, {"name", "parts"});
  SplitRule s;
  s.name = within(v.at("name"), [&] { return text(v.at("name"), "split name"); });
  if (v.contains("dim"))
    s.dim = within(v.at("dim"), [&] { return whole_number(v.at("dim"), "split dim"); });
  s.parts = within(v.at("parts"), [&] { return strings(v.at("parts"), "split parts"); });
  if (v.contains("sizes"))
    s.sizes = within(v.at("sizes"), [&] { return ints(v.at("sizes"), "split sizes"); });
  return s;
}

FuseRule fuse_of(const Json& v) {
  if (v.is_string()) return fuse_rule(v.get<std::string>());
  if (!v.is_object()) bad("a fuse rule is a mapping or \"P1,P2:DIM:NAME\", not " + type_of(v));
  keys(v, "a fuse rule", {"parts", "dim", "name"}, {"parts", "name"});
  FuseRule f;
  f.parts = within(v.at("parts"), [&] { return strings(v.at("parts"), "fuse parts"); });
  if (v.contains("dim"))
    f.dim = within(v.at("dim"), [&] { return whole_number(v.at("dim"), "fuse dim"); });
  f.name = within(v.at("name"), [&] { return text(v.at("name"), "fuse name"); });
  return f;
}

std::vector<std::string> dequantize_of(const Json& d) {
  if (d.is_boolean())
    return d.get<bool>() ? std::vector<std::string>{"fp8-block", "mxfp4"}
                         : std::vector<std::string>{};
  if (d.is_string() && (d == "true" || d == "false"))
    bad("dequantize: the string \"" + d.get<std::string>() +
        "\" is not a boolean (write it unquoted)");
  std::vector<std::string> out = strings(d, "dequantize");
  for (const auto& s : out)
    if (s != "fp8-block" && s != "mxfp4") bad("unknown dequantize scheme \"" + s + "\"");
  return out;
}

// `f` on the value of field `name`, when the recipe has it; its problems are about that value.
template <class F>
void field(const Json& j, const char* name, F&& f) {
  const auto it = j.find(name);
  if (it != j.end()) within(*it, [&] { f(*it); });
}

template <class F>
void each(const Json& list, const char* name, F&& f) {
  if (!list.is_array()) bad(std::string(name) + " must be a list, not " + type_of(list));
  for (const auto& v : list) within(v, [&] { f(v); });
}

TransformRecipe recipe_of(const Json& j) {
  if (!j.is_object())
    bad(std::string("must be a mapping of fields (a JSON object), not ") + type_of(j));
  keys(j, "the recipe",
       {"rename", "strip_prefix", "add_prefix", "keep", "drop", "cast", "dequantize", "split",
        "fuse", "transpose"},
       {});
  TransformRecipe r;
  field(j, "rename", [&](const Json& v) {
    each(v, "rename", [&](const Json& x) { r.rename.push_back(rename_of(x)); });
  });
  field(j, "strip_prefix", [&](const Json& v) {
    for (const auto& p : strings(v, "strip_prefix"))
      r.rename.push_back({RenameRule::kStripPrefix, p, ""});
  });
  field(j, "add_prefix", [&](const Json& v) {
    for (const auto& p : strings(v, "add_prefix"))
      r.rename.push_back({RenameRule::kAddPrefix, p, ""});
  });
  field(j, "keep", [&](const Json& v) { r.keep = strings(v, "keep"); });
  field(j, "drop", [&](const Json& v) { r.drop = strings(v, "drop"); });
  field(j, "transpose", [&](const Json& v) { r.transpose = strings(v, "transpose"); });
  field(j, "cast", [&](const Json& v) { r.cast = cast_dtype(text(v, "cast")); });
  field(j, "dequantize", [&](const Json& v) { r.dequantize = dequantize_of(v); });
  field(j, "split", [&](const Json& v) {
    each(v, "split", [&](const Json& x) { r.split.push_back(split_of(x)); });
  });
  field(j, "fuse", [&](const Json& v) {
    each(v, "fuse", [&](const Json& x) { r.fuse.push_back(fuse_of(x)); });
  });
  return r;
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() &&
         std::equal(tail.begin(), tail.end(), s.end() - tail.size(), [](char a, char b) {
           return a == std::tolower(static_cast<unsigned char>(b));
         });
}

// YAML by name (.yaml, .yml), JSON by name (.json); otherwise JSON when the first character
// that is not white space is '{', YAML when not.
bool is_yaml(std::string_view name, std::string_view text) {
  if (ends_with(name, ".yaml") || ends_with(name, ".yml")) return true;
  if (ends_with(name, ".json")) return false;
  const size_t at = text.find_first_not_of(" \t\r\n");
  return at == std::string_view::npos || text[at] != '{';
}

// The recipe in a file's text (`name`: the file), its tree left in `tree`. Errors say which
// syntax it was read as and, for YAML, the line and column.
TransformRecipe read_tree(std::string_view text, const std::string& name,
                          internal::RecipeTree& tree) {
  const bool yaml = is_yaml(name, text);
  const std::string label = yaml ? "transform recipe (YAML)" : "transform recipe (JSON)";
  if (yaml) {
    internal::read_yaml_recipe(text, name, tree);
  } else {
    try {
      tree.root = Json::parse(text);
    } catch (const Json::exception& e) {
      throw Error(ErrorCode::kInvalidArgument, label + ": not JSON: " + e.what(), name);
    }
  }
  try {
    return recipe_of(tree.root);
  } catch (const Problem& p) {
    std::string at;
    if (auto it = tree.positions.find(p.node ? p.node : &tree.root); it != tree.positions.end())
      at = "line " + std::to_string(it->second.first) + ", column " +
           std::to_string(it->second.second) + ": ";
    throw Error(ErrorCode::kInvalidArgument, label + ": " + at + p.what, name);
  }
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, "cannot open the recipe",
                path);
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxRecipeBytes)
      throw Error(ErrorCode::kInvalidArgument, "a transform recipe of more than 16 MiB", path);
  }
  if (in.bad()) throw Error(ErrorCode::kIo, "cannot read the recipe", path);
  return text;
}

}  // namespace

DType parse_cast_dtype(std::string_view name) {
  try {
    return cast_dtype(name);
  } catch (const Problem& p) {
    throw Error(ErrorCode::kInvalidArgument, p.what);
  }
}

SplitRule parse_split_rule(std::string_view text) {
  return plain([&] { return split_rule(text); });
}

FuseRule parse_fuse_rule(std::string_view text) {
  return plain([&] { return fuse_rule(text); });
}

TransformRecipe parse_transform_recipe(std::string_view json) {
  Json j;
  try {
    j = Json::parse(json);
  } catch (const Json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("transform recipe: not JSON: ") + e.what());
  }
  return plain([&] { return recipe_of(j); });
}

TransformRecipe parse_transform_recipe(std::string_view text, const std::string& name) {
  internal::RecipeTree tree;
  return read_tree(text, name, tree);
}

TransformRecipe read_transform_recipe(const std::string& path) {
  return parse_transform_recipe(file_text(path), path);
}

std::string transform_recipe_json(const std::string& path) {
  internal::RecipeTree tree;
  read_tree(file_text(path), path, tree);
  return tree.root.dump();
}

}  // namespace ckpt
