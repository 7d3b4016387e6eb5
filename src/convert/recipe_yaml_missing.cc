// YAML transform recipes in a build without yaml-cpp (recipe_yaml.cc with it): refused, naming
// the packages that provide it. JSON recipes need no library.

#include "convert/recipe_tree.h"
#include "util/features.h"

namespace ckpt::internal {

void read_yaml_recipe(std::string_view, const std::string& source, RecipeTree&) {
  throw missing_feature("yaml-cpp", "YAML transform recipes need (a JSON recipe works)", source);
}

}  // namespace ckpt::internal
