#pragma once
// Transforms applied while converting (ConvertOptions::transforms): renaming, keeping and
// dropping tensors, casting, dequantizing block-scaled FP8 and MXFP4, splitting and fusing,
// transposing. They map the names, dtypes and shapes the writer sees before it writes, and each
// output tensor's bytes are computed from its input tensors' bytes when the writer asks for them
// (streamed: the memory held is the conversion's budget plus the tensor being made).
//
//   ckpt::ConvertOptions o;
//   o.transforms = ckpt::parse_transform_recipe(R"({"strip_prefix": ["module."], "cast":
//   "bf16"})"); ckpt::convert(ckpt::Checkpoint::open("ckpt.pt"), "model.safetensors", o);
//
// The steps run in this order, whatever order the rules were given in:
//   1. dequantize (input names): "W" (float8_e4m3fn) with "W_scale_inv" (float32, one scale per
//      128x128 block, ceil-div at the edges) -> "W" in bfloat16, the scale dropped;
//      "X_blocks" (uint8 [..., G, 16]) with "X_scales" (uint8 [..., G], E8M0) -> "X" in
//      bfloat16 as transformers' convert_moe_packed_tensors makes it (shape [..., G*32], dims 1
//      and 2 swapped when it has three);
//   2. rename rules, in the order given (a name is rewritten by each rule in turn);
//   3. keep / drop globs (on the renamed names; with keep rules, a tensor no keep matches is
//      dropped; a drop wins over a keep);
//   4. split, then fuse (names after renaming);
//   5. transpose (2-D tensors whose name matches a glob);
//   6. cast (floating tensors only: float32/float16/bfloat16/float64 and float8 e4m3fn/e5m2;
//      integer and bool tensors are left as they are).
// Casts equal torch's Tensor.to() bit for bit, round-to-nearest-even, subnormals, infinities
// and NaN included (NaN bits as torch's vectorized CPU loop makes them: float32 -> bfloat16
// gives 0xFFFF, float16/float8 -> bfloat16 0x7FC0, -> float16 keeps the sign and the high
// payload bits with the quiet bit set).
//
// A rule that cannot apply is refused with Error{kInvalidArgument} before the output exists: a
// split whose sizes do not add up to the dimension, fused parts whose shapes or dtypes differ,
// a float8 weight without its scale (or a scale of the wrong shape), a transpose of a tensor that
// is not 2-D, two tensors renamed to one name. A rule that matched nothing is reported
// (TransformReport::unmatched), not refused.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dtype.h"

namespace ckpt {

struct RenameRule {
  enum Kind { kStripPrefix, kAddPrefix, kRegex };
  Kind kind = kRegex;
  // kStripPrefix / kAddPrefix: the prefix. kRegex: an ECMAScript regular expression (std::regex)
  // replaced wherever it matches, `replacement` with $1, $2... for its groups.
  std::string pattern;
  std::string replacement;
};

// One tensor cut along `dim` into parts named `parts` (equal sizes unless `sizes` is given).
struct SplitRule {
  std::string name;
  int64_t dim = 0;
  std::vector<std::string> parts;
  std::vector<int64_t> sizes;  // empty: equal parts
};

// Parts concatenated along `dim` into one tensor `name` (same dtype, same other dims).
struct FuseRule {
  std::vector<std::string> parts;
  int64_t dim = 0;
  std::string name;
};

struct TransformRecipe {
  std::vector<RenameRule> rename;
  std::vector<std::string> keep, drop;  // globs (* ? [...]) on whole names
  // Dequantize schemes: "fp8-block", "mxfp4". Empty: none.
  std::vector<std::string> dequantize;
  std::vector<SplitRule> split;
  std::vector<FuseRule> fuse;
  std::vector<std::string> transpose;  // globs
  std::optional<DType> cast;           // float32, float16 or bfloat16

  bool empty() const noexcept {
    return rename.empty() && keep.empty() && drop.empty() && dequantize.empty() && split.empty() &&
           fuse.empty() && transpose.empty() && !cast;
  }
};

// A recipe from JSON (the fields of --recipe, docs/cli.md "Converting for serving"; YAML below):
//   {"rename": [{"regex": "^h\\.(\\d+)\\.", "replacement": "layers.$1."},
//               {"strip_prefix": "module."}, {"add_prefix": "model."}],
//    "strip_prefix": ["_orig_mod."], "add_prefix": "model.",
//    "keep": ["*"], "drop": ["*.rotary_emb.inv_freq"],
//    "cast": "bf16", "dequantize": ["fp8-block", "mxfp4"] (or true: both),
//    "split": [{"name": "qkv.weight", "dim": 0, "parts": ["q.weight", "k.weight", "v.weight"],
//               "sizes": [64, 64, 64]}],
//    "fuse": [{"parts": ["gate.weight", "up.weight"], "dim": 0, "name": "gate_up.weight"}],
//    "transpose": ["*.c_attn.weight"]}
// String forms of the CLI flags are accepted too: "split": ["NAME:DIM:P1,P2[:S1,S2]"],
// "fuse": ["P1,P2:DIM:NAME"]. Rename rules keep their order ("strip_prefix" and "add_prefix"
// at the top level come after the "rename" list). Integers are numbers (a dim or size given as
// the string "0" is refused), `dequantize: true` a boolean. An unknown field, in the recipe or in
// a rule's mapping, is refused. Throws Error{kInvalidArgument} naming the field.
TransformRecipe parse_transform_recipe(std::string_view json);

// A recipe file's text, JSON or YAML, `name` being the file's name: YAML when it ends in .yaml
// or .yml, JSON when it ends in .json, otherwise JSON when the first character that is not white
// space is '{' and YAML when not. A YAML recipe has the JSON one's structure (the same tree is
// read): block or flow style, comments, anchors; plain scalars typed as YAML 1.2's core schema
// types them (true/false booleans, 12 an integer, 1.5 a float, null/~ null, the rest strings;
// yes/no/on/off refused as ambiguous), quoted ones strings. Errors are Error{kInvalidArgument}
// "transform recipe (YAML): line L, column C: ..." (or "(JSON)") with `name` as the source; a
// YAML recipe in a build without yaml-cpp is Error{kUnsupported} naming its packages
// (build_features() lists "-yaml").
TransformRecipe parse_transform_recipe(std::string_view text, const std::string& name);
// The recipe in the file at `path` (16 MiB at most), as parse_transform_recipe(text, path).
TransformRecipe read_transform_recipe(const std::string& path);
// The file's recipe as JSON text after it was read and checked as read_transform_recipe does (a
// YAML one turned into the JSON it stands for): what Checkpoint.convert(recipe=PATH) adds its
// keywords to.
std::string transform_recipe_json(const std::string& path);

// "bf16"/"bfloat16", "fp16"/"float16"/"half", "fp32"/"float32"/"float": Error{kInvalidArgument}
// for another name.
DType parse_cast_dtype(std::string_view name);
// "NAME:DIM:P1,P2[:S1,S2]" and "P1,P2:DIM:NAME". Error{kInvalidArgument} when malformed.
SplitRule parse_split_rule(std::string_view text);
FuseRule parse_fuse_rule(std::string_view text);

// What each rule did (ConvertReport::transforms).
struct TransformReport {
  struct Rule {
    std::string rule;    // "rename ^h\.(\d+)\. -> layers.$1.", "cast bf16", "drop *.inv_freq"
    size_t matched = 0;  // tensors it applied to
  };
  std::vector<Rule> rules;
  std::vector<std::string> unmatched;  // rules that matched nothing (a warning)
};

}  // namespace ckpt
