// Transform recipes from files (include/ckpt/transform.h): YAML read into the same tree as JSON
// (the same recipe either way), YAML's typing, refusals with the line and column, the syntax
// chosen by extension or content, and the refusal of YAML in a build without yaml-cpp.

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "ckpt/features.h"
#include "ckpt/transform.h"
#include "test_util.h"

namespace ckpt {
namespace {

bool yaml_built_in() { return std::string(build_features()).find("-yaml") == std::string::npos; }

// Every field of a recipe, as text, to compare two recipes.
std::string describe(const TransformRecipe& r) {
  std::string s;
  for (const auto& n : r.rename)
    s += "rename " + std::to_string(n.kind) + " " + n.pattern + " " + n.replacement + "\n";
  for (const auto& k : r.keep) s += "keep " + k + "\n";
  for (const auto& d : r.drop) s += "drop " + d + "\n";
  for (const auto& d : r.dequantize) s += "dequantize " + d + "\n";
  for (const auto& p : r.split) {
    s += "split " + p.name + " " + std::to_string(p.dim);
    for (const auto& x : p.parts) s += " " + x;
    for (int64_t x : p.sizes) s += " " + std::to_string(x);
    s += "\n";
  }
  for (const auto& f : r.fuse) {
    s += "fuse " + f.name + " " + std::to_string(f.dim);
    for (const auto& x : f.parts) s += " " + x;
    s += "\n";
  }
  for (const auto& t : r.transpose) s += "transpose " + t + "\n";
  if (r.cast) s += "cast " + std::to_string(static_cast<int>(*r.cast)) + "\n";
  return s;
}

constexpr const char* kJson = R"({
  "rename": [{"strip_prefix": "module."}, {"regex": "^h\\.(\\d+)\\.", "replacement": "layers.$1."},
             "^wte=embed", {"add_prefix": "model."}],
  "strip_prefix": ["_orig_mod."], "add_prefix": "x.",
  "keep": ["*"], "drop": ["*.inv_freq", "1.5"], "cast": "bf16", "dequantize": true,
  "split": [{"name": "qkv.weight", "dim": 0, "parts": ["q.weight", "k.weight", "v.weight"],
             "sizes": [64, 64, 64]}, "w:1:a,b"],
  "fuse": [{"parts": ["gate.weight", "up.weight"], "dim": 1, "name": "gate_up.weight"}],
  "transpose": "*.c_attn.weight"})";

// The same recipe in block and flow style, with comments, an anchor and quoted strings.
constexpr const char* kYaml = R"(# serving recipe
rename:
  - strip_prefix: module.
  - regex: '^h\.(\d+)\.'
    replacement: "layers.$1."
  - ^wte=embed
  - {add_prefix: model.}
strip_prefix: [_orig_mod.]
add_prefix: x.
keep: ['*']
drop:
  - '*.inv_freq'
  - "1.5"          # quoted: a string, not a float
cast: bf16
dequantize: true
split:
  - name: qkv.weight
    dim: 0
    parts: &qkv [q.weight, k.weight, v.weight]
    sizes: [64, 0x40, +64]
  - w:1:a,b
fuse:
  - parts: [gate.weight, up.weight]
    dim: 1
    name: gate_up.weight
transpose: '*.c_attn.weight'
)";

TEST(Recipe, YamlGivesTheSameRecipeAsJson) {
  if (!yaml_built_in()) GTEST_SKIP() << "built without yaml-cpp";
  const TransformRecipe j = parse_transform_recipe(kJson);
  EXPECT_EQ(describe(parse_transform_recipe(kJson, "r.json")), describe(j));
  EXPECT_EQ(describe(parse_transform_recipe(kYaml, "r.yaml")), describe(j));
  EXPECT_EQ(describe(parse_transform_recipe(kYaml, "R.YML")), describe(j));
  EXPECT_EQ(describe(parse_transform_recipe(kYaml, "recipe")), describe(j));  // by content
  EXPECT_EQ(j.rename.size(), 6u);
  EXPECT_EQ(j.split[0].sizes, (std::vector<int64_t>{64, 64, 64}));
  EXPECT_EQ(j.split[1].dim, 1);
  EXPECT_EQ(j.drop[1], "1.5");
  // JSON is YAML: a JSON recipe named .yaml reads the same.
  EXPECT_EQ(describe(parse_transform_recipe(kJson, "r.yaml")), describe(j));
}

TEST(Recipe, SyntaxByExtensionThenContent) {
  // '{' first and no .yaml/.yml name: JSON, which needs no yaml-cpp in any build.
  EXPECT_EQ(parse_transform_recipe("  \n{\"cast\": \"fp16\"}", "recipe.txt").cast, DType::kFloat16);
  const Error e = test::capture_error([] { parse_transform_recipe("cast: fp16", "r.json"); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message().find("transform recipe (JSON): not JSON"), std::string::npos) << e.what();
  EXPECT_EQ(e.source(), "r.json");
  if (yaml_built_in()) {
    EXPECT_EQ(parse_transform_recipe("cast: fp16", "recipe.txt").cast, DType::kFloat16);
  }
}

// The message of the refusal of `yaml` (a file r.yaml).
std::string refusal(const std::string& yaml) {
  const Error e = test::capture_error([&] { parse_transform_recipe(yaml, "r.yaml"); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  EXPECT_EQ(e.source(), "r.yaml");
  return e.message();
}

TEST(Recipe, YamlTypingIsExplicit) {
  if (!yaml_built_in()) GTEST_SKIP() << "built without yaml-cpp";
  // A dim is an integer: the quoted "0" is a string, refused where it stands.
  EXPECT_EQ(refusal("split:\n  - name: a\n    dim: \"0\"\n    parts: [p, q]\n"),
            "transform recipe (YAML): line 3, column 10: split dim must be an integer, not the "
            "string \"0\" (write it unquoted)");
  EXPECT_EQ(parse_transform_recipe("split:\n  - {name: a, dim: 2, parts: [p, q]}\n", "r.yaml")
                .split[0]
                .dim,
            2);
  EXPECT_EQ(
      parse_transform_recipe("split: [{name: a, dim: !!int '3', parts: p}]", "r.yaml").split[0].dim,
      3);
  EXPECT_NE(refusal("fuse: [{parts: [a, b], dim: 1.0, name: ab}]").find("not a float"),
            std::string::npos);
  EXPECT_NE(refusal("split: [{name: a, dim: 99999999999999999999, parts: p}]").find("int64"),
            std::string::npos);
  // Booleans: true/false; YAML 1.1's yes/no/on/off are refused; a quoted "true" is a string.
  EXPECT_EQ(parse_transform_recipe("dequantize: True", "r.yaml").dequantize.size(), 2u);
  EXPECT_TRUE(parse_transform_recipe("dequantize: false", "r.yaml").dequantize.empty());
  EXPECT_NE(refusal("dequantize: yes").find("line 1, column 13: 'yes' is a boolean in YAML 1.1"),
            std::string::npos);
  EXPECT_NE(refusal("dequantize: 'true'").find("not a boolean"), std::string::npos);
  // Strings where strings are wanted: a plain 12 is an integer, '12' a string.
  EXPECT_NE(refusal("keep: [12]").find("keep item must be a string, not an integer"),
            std::string::npos);
  EXPECT_EQ(parse_transform_recipe("keep: ['12', \"on\", ~x, 0x]", "r.yaml").keep,
            (std::vector<std::string>{"12", "on", "~x", "0x"}));
  EXPECT_NE(refusal("cast: ~").find("cast must be a string, not null"), std::string::npos);
}

TEST(Recipe, BadYamlNamesTheLineAndColumn) {
  if (!yaml_built_in()) GTEST_SKIP() << "built without yaml-cpp";
  EXPECT_NE(refusal("keep: [a, b\ndrop: c\n").find("transform recipe (YAML): line "),
            std::string::npos);
  EXPECT_EQ(refusal("cast: bf16\nrenmae: []\n"),
            "transform recipe (YAML): line 2, column 9: the recipe: unknown field \"renmae\"");
  EXPECT_EQ(refusal("split:\n  - name: a\n    dims: 1\n    parts: p\n"),
            "transform recipe (YAML): line 3, column 11: a split rule: unknown field \"dims\"");
  EXPECT_NE(refusal("cast: bf16\ncast: fp16\n").find("line 2, column 1: duplicate key \"cast\""),
            std::string::npos);
  EXPECT_NE(refusal("cast: bf16\n---\ncast: fp16\n").find("a second document"), std::string::npos);
  EXPECT_NE(refusal("- cast\n").find("line 1, column 1: must be a mapping"), std::string::npos);
  EXPECT_NE(refusal("").find("empty"), std::string::npos);
  EXPECT_NE(refusal("keep: !!binary aGk=").find("tag tag:yaml.org,2002:binary"), std::string::npos);
  EXPECT_NE(refusal("? [a]\n: b\n").find("a mapping key is not a plain string"), std::string::npos);
  EXPECT_NE(refusal("cast: int8").find("line 1, column 7: cast: bf16, fp16 or fp32"),
            std::string::npos);
  // Aliases that multiply (a "billion laughs") and deep nesting are bounded.
  std::string laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'h'; ++c) {
    const std::string prev = "*" + std::string(1, static_cast<char>(c - 1));
    laughs += std::string(1, c) + ": &" + c + " [" + prev;
    for (int i = 1; i < 10; ++i) laughs += ", " + prev;
    laughs += "]\n";
  }
  EXPECT_NE(refusal(laughs).find("more than 100000 nodes"), std::string::npos);
  EXPECT_NE(refusal("keep: " + std::string(200, '[') + std::string(200, ']')).find("YAML"),
            std::string::npos);
}

TEST(Recipe, FilesNameThemselvesAndYamlNeedsYamlCpp) {
  test::TempDir dir;
  const std::string yaml = dir.file("serve.yaml"), json = dir.file("serve.json");
  std::ofstream(yaml) << "strip_prefix: module.\ncast: fp16\n";
  std::ofstream(json) << R"({"strip_prefix": "module.", "cast": "fp16"})";
  const TransformRecipe j = read_transform_recipe(json);
  EXPECT_EQ(j.cast, DType::kFloat16);
  EXPECT_EQ(transform_recipe_json(json), R"({"cast":"fp16","strip_prefix":"module."})");
  if (yaml_built_in()) {
    EXPECT_EQ(describe(read_transform_recipe(yaml)), describe(j));
    EXPECT_EQ(transform_recipe_json(yaml), transform_recipe_json(json));
  } else {
    const Error e = test::capture_error([&] { read_transform_recipe(yaml); });
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(e.source(), yaml);
    for (const char* p : {"yaml-cpp", "libyaml-cpp-dev (Debian/Ubuntu)", "yaml-cpp-devel (Fedora)",
                          "yaml-cpp (conda-forge)"})
      EXPECT_NE(e.message().find(p), std::string::npos) << e.what();
  }
  EXPECT_EQ(test::capture_error([&] { read_transform_recipe(dir.file("none.yaml")); }).code(),
            ErrorCode::kNotFound);
  std::ofstream(dir.file("bad.json")) << R"({"split": [{"name": "a", "dim": "0", "parts": "p"}]})";
  const Error e = test::capture_error([&] { read_transform_recipe(dir.file("bad.json")); });
  EXPECT_EQ(e.message(),
            "transform recipe (JSON): split dim must be an integer, not the string \"0\" (write "
            "it unquoted)");
  EXPECT_EQ(e.source(), dir.file("bad.json"));
}

}  // namespace
}  // namespace ckpt
