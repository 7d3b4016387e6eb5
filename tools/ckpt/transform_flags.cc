// `ckpt convert`'s transform flags (transform_flags.h).

#include "transform_flags.h"

#include <cstdio>

#include "ckpt/error.h"

namespace ckpt::cli {

class TransformFlags {
 public:
  std::vector<std::string> rename, strip, add, keep, drop, transpose, split, fuse, dequantize;
  std::string cast, recipe;
  CLI::App* cmd = nullptr;
  CLI::Option *rename_opt = nullptr, *strip_opt = nullptr, *add_opt = nullptr,
              *dequantize_opt = nullptr;
};

std::shared_ptr<TransformFlags> add_transform_flags(CLI::App& cmd) {
  auto f = std::make_shared<TransformFlags>();
  f->cmd = &cmd;
  const char* group = "Transforms (converting for serving)";
  f->rename_opt = cmd.add_option("--rename", f->rename,
                                 "rename tensors: REGEX=REPLACEMENT (ECMAScript, $1 for groups); "
                                 "repeatable, applied in order with --strip-prefix/--add-prefix")
                      ->group(group)
                      ->allow_extra_args(false);
  f->strip_opt = cmd.add_option("--strip-prefix", f->strip,
                                "remove a prefix from the names that have it (module., "
                                "_orig_mod.); repeatable")
                     ->group(group)
                     ->allow_extra_args(false);
  f->add_opt = cmd.add_option("--add-prefix", f->add, "put a prefix before every name")
                   ->group(group)
                   ->allow_extra_args(false);
  cmd.add_option("--keep", f->keep, "write only tensors whose name matches GLOB (repeatable)")
      ->group(group)
      ->allow_extra_args(false);
  cmd.add_option("--drop", f->drop, "leave out tensors whose name matches GLOB (repeatable)")
      ->group(group)
      ->allow_extra_args(false);
  cmd.add_option("--cast", f->cast, "cast floating tensors to bf16, fp16 or fp32")
      ->group(group)
      ->check(CLI::IsMember({"bf16", "bfloat16", "fp16", "float16", "fp32", "float32"}));
  f->dequantize_opt =
      cmd.add_option("--dequantize", f->dequantize,
                     "dequantize to bf16: fp8-block (W + W_scale_inv, 128x128 blocks), mxfp4 "
                     "(X_blocks + X_scales); without SCHEME both")
          ->group(group)
          ->expected(0, 1)
          ->allow_extra_args(false)
          ->check(CLI::IsMember({"fp8-block", "mxfp4"}));
  cmd.add_option("--split", f->split, "cut NAME along DIM into parts: NAME:DIM:P1,P2[:S1,S2]")
      ->group(group)
      ->allow_extra_args(false);
  cmd.add_option("--fuse", f->fuse, "concatenate parts along DIM: P1,P2:DIM:NAME")
      ->group(group)
      ->allow_extra_args(false);
  cmd.add_option("--transpose", f->transpose, "transpose 2-D tensors whose name matches GLOB")
      ->group(group)
      ->allow_extra_args(false);
  cmd.add_option("--recipe", f->recipe,
                 "the rules from a JSON or YAML file (.yaml/.yml; docs/cli.md)")
      ->group(group)
      ->check(CLI::ExistingFile);
  return f;
}

TransformRecipe transform_recipe(const TransformFlags& f) {
  TransformRecipe r;
  if (!f.recipe.empty()) r = read_transform_recipe(f.recipe);  // JSON or YAML
  // Rename rules in the order given on the command line.
  size_t ri = 0, si = 0, ai = 0;
  for (const CLI::Option* o : f.cmd->parse_order()) {
    if (o == f.rename_opt && ri < f.rename.size()) {
      const std::string& s = f.rename[ri++];
      const size_t eq = s.find('=');
      if (eq == std::string::npos)
        throw Error(ErrorCode::kInvalidArgument, "--rename " + s + ": not REGEX=REPLACEMENT");
      r.rename.push_back({RenameRule::kRegex, s.substr(0, eq), s.substr(eq + 1)});
    } else if (o == f.strip_opt && si < f.strip.size()) {
      r.rename.push_back({RenameRule::kStripPrefix, f.strip[si++], ""});
    } else if (o == f.add_opt && ai < f.add.size()) {
      r.rename.push_back({RenameRule::kAddPrefix, f.add[ai++], ""});
    }
  }
  r.keep.insert(r.keep.end(), f.keep.begin(), f.keep.end());
  r.drop.insert(r.drop.end(), f.drop.begin(), f.drop.end());
  r.transpose.insert(r.transpose.end(), f.transpose.begin(), f.transpose.end());
  if (!f.cast.empty()) r.cast = parse_cast_dtype(f.cast);
  if (f.dequantize_opt->count() > 0) {
    // --dequantize without a scheme: every scheme.
    for (const auto& s : f.dequantize)
      if (!s.empty()) r.dequantize.push_back(s);
    if (r.dequantize.empty()) r.dequantize = {"fp8-block", "mxfp4"};
  }
  for (const auto& s : f.split) r.split.push_back(parse_split_rule(s));
  for (const auto& s : f.fuse) r.fuse.push_back(parse_fuse_rule(s));
  return r;
}

void print_transform_report(const ConvertReport& r) {
  for (const auto& rule : r.transforms.rules)
    if (rule.matched)
      std::fprintf(stderr, "ckpt: %s: %zu tensors\n", rule.rule.c_str(), rule.matched);
  for (const auto& rule : r.transforms.unmatched)
    std::fprintf(stderr, "ckpt: warning: %s matched no tensor\n", rule.c_str());
  if (!r.aliases_dropped.empty())
    std::fprintf(stderr,
                 "ckpt: note: %zu tied names left out (the same tensor as another; recorded in "
                 "__metadata__, as safetensors' save_model does; --copy-shared writes copies), "
                 "first: %s = %s\n",
                 r.aliases_dropped.size(), r.aliases_dropped[0].first.c_str(),
                 r.aliases_dropped[0].second.c_str());
}

}  // namespace ckpt::cli
