// Transform recipes from JSON and the CLI's rule strings (include/ckpt/transform.h).

#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "ckpt/transform.h"

namespace ckpt {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "transform recipe: " + what);
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

using Json = nlohmann::json;

std::vector<std::string> strings(const Json& j, const char* field) {
  if (j.is_string()) return {j.get<std::string>()};
  if (!j.is_array()) bad(std::string(field) + " must be a string or a list of strings");
  std::vector<std::string> out;
  for (const auto& v : j) {
    if (!v.is_string()) bad(std::string(field) + " must be a list of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

RenameRule rename_of(const Json& j) {
  if (j.is_string()) {  // "REGEX=REPLACEMENT", as --rename
    const std::string s = j.get<std::string>();
    const size_t eq = s.find('=');
    if (eq == std::string::npos) bad("rename \"" + s + "\" is not REGEX=REPLACEMENT");
    return {RenameRule::kRegex, s.substr(0, eq), s.substr(eq + 1)};
  }
  if (!j.is_object()) bad("a rename rule is an object or \"REGEX=REPLACEMENT\"");
  if (j.contains("strip_prefix")) return {RenameRule::kStripPrefix, j["strip_prefix"], ""};
  if (j.contains("add_prefix")) return {RenameRule::kAddPrefix, j["add_prefix"], ""};
  if (j.contains("regex") && j.contains("replacement"))
    return {RenameRule::kRegex, j["regex"], j["replacement"]};
  bad("a rename rule has strip_prefix, add_prefix, or regex and replacement: " + j.dump());
}

std::vector<int64_t> ints(const Json& j, const char* field) {
  std::vector<int64_t> out;
  if (!j.is_array()) bad(std::string(field) + " must be a list of integers");
  for (const auto& v : j) {
    if (!v.is_number_integer()) bad(std::string(field) + " must be a list of integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

}  // namespace

DType parse_cast_dtype(std::string_view name) {
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::kFloat16;
  if (name == "fp32" || name == "float32" || name == "float") return DType::kFloat32;
  throw Error(ErrorCode::kInvalidArgument,
              "cast: bf16, fp16 or fp32, not '" + std::string(name) + "'");
}

SplitRule parse_split_rule(std::string_view text) {
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

FuseRule parse_fuse_rule(std::string_view text) {
  const auto f = cut(text, ':');
  if (f.size() != 3 || f[2].empty())
    bad("fuse \"" + std::string(text) + "\" is not PART1,PART2:DIM:NAME");
  return {cut(f[0], ','), integer(f[1], "fuse dim"), f[2]};
}

TransformRecipe parse_transform_recipe(std::string_view text) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    bad(std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) bad("must be a JSON object");
  static const char* kFields[] = {"rename", "strip_prefix", "add_prefix", "keep", "drop",
                                  "cast",   "dequantize",   "split",      "fuse", "transpose"};
  for (const auto& item : j.items()) {
    const std::string& k = item.key();  // not a structured binding: the lambda captures it
    if (std::find_if(std::begin(kFields), std::end(kFields),
                     [&](const char* f) { return k == f; }) == std::end(kFields))
      bad("unknown field \"" + k + "\"");
  }
  TransformRecipe r;
  try {
    if (j.contains("rename")) {
      if (!j["rename"].is_array()) bad("rename must be a list");
      for (const auto& v : j["rename"]) r.rename.push_back(rename_of(v));
    }
    if (j.contains("strip_prefix"))
      for (const auto& p : strings(j["strip_prefix"], "strip_prefix"))
        r.rename.push_back({RenameRule::kStripPrefix, p, ""});
    if (j.contains("add_prefix"))
      for (const auto& p : strings(j["add_prefix"], "add_prefix"))
        r.rename.push_back({RenameRule::kAddPrefix, p, ""});
    if (j.contains("keep")) r.keep = strings(j["keep"], "keep");
    if (j.contains("drop")) r.drop = strings(j["drop"], "drop");
    if (j.contains("transpose")) r.transpose = strings(j["transpose"], "transpose");
    if (j.contains("cast")) {
      if (!j["cast"].is_string()) bad("cast must be a string");
      r.cast = parse_cast_dtype(j["cast"].get<std::string>());
    }
    if (j.contains("dequantize")) {
      const Json& d = j["dequantize"];
      if (d.is_boolean())
        r.dequantize = d.get<bool>() ? std::vector<std::string>{"fp8-block", "mxfp4"}
                                     : std::vector<std::string>{};
      else
        r.dequantize = strings(d, "dequantize");
    }
    if (j.contains("split")) {
      if (!j["split"].is_array()) bad("split must be a list");
      for (const auto& v : j["split"]) {
        if (v.is_string()) {
          r.split.push_back(parse_split_rule(v.get<std::string>()));
          continue;
        }
        SplitRule s;
        s.name = v.at("name");
        s.dim = v.value("dim", 0);
        s.parts = strings(v.at("parts"), "split parts");
        if (v.contains("sizes")) s.sizes = ints(v["sizes"], "split sizes");
        r.split.push_back(std::move(s));
      }
    }
    if (j.contains("fuse")) {
      if (!j["fuse"].is_array()) bad("fuse must be a list");
      for (const auto& v : j["fuse"]) {
        if (v.is_string()) {
          r.fuse.push_back(parse_fuse_rule(v.get<std::string>()));
          continue;
        }
        r.fuse.push_back({strings(v.at("parts"), "fuse parts"), v.value("dim", 0), v.at("name")});
      }
    }
  } catch (const Json::exception& e) {
    bad(std::string("a field has the wrong type: ") + e.what());
  }
  for (const auto& s : r.dequantize)
    if (s != "fp8-block" && s != "mxfp4") bad("unknown dequantize scheme \"" + s + "\"");
  return r;
}

}  // namespace ckpt
