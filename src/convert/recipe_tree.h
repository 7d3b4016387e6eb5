#pragma once
// The tree a transform recipe is read from (transform_recipe.cc): JSON's, whichever syntax the
// recipe was written in. A YAML recipe (recipe_yaml.cc, with yaml-cpp) is turned into the same
// tree, its typing made explicit, with the line and column of every node; there is one reader
// of that tree, for both.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace ckpt::internal {

struct RecipeTree {
  nlohmann::json root;
  // Where each node of `root` was written (1-based line, column), by address: YAML only
  // (nlohmann-json keeps no positions). The addresses hold while `root` is not modified and the
  // tree is not moved.
  std::unordered_map<const nlohmann::json*, std::pair<int, int>> positions;
};

// Fills `tree` from YAML text. Plain scalars are typed as YAML 1.2's core schema types them:
// null, ~ and nothing are null; true/false (True, TRUE...) booleans; decimal, 0x and 0o integers
// (int64); decimal floats, .inf and .nan floats; anything else a string. yes/no/on/off (YAML 1.1
// booleans) are refused as ambiguous. Quoted and block scalars are strings; the tags !!str,
// !!int, !!float, !!bool, !!null, !!seq and !!map are honoured, any other refused. Mapping keys
// are the scalars' text; a duplicate key, a second document, a tree of more than 100,000 nodes
// (aliases expanded) or nested deeper than 32 are refused. Throws Error{kInvalidArgument}
// "transform recipe (YAML): line L, column C: ..." with `source`, and in a build without
// yaml-cpp Error{kUnsupported} naming its packages.
void read_yaml_recipe(std::string_view text, const std::string& source, RecipeTree& tree);

}  // namespace ckpt::internal
