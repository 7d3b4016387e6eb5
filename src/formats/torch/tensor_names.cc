// name_tensors: each tensor of a torch pickle is named by the dotted path where the object
// tree first reaches it ("model.layers.0.weight", "state.0.exp_avg"; docs/formats/torch.md).

#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckpt/error.h"
#include "formats/torch/torch_unpickle.h"

namespace ckpt::internal {
namespace {

// `seen`: shared containers already walked. A pickle can reference one subtree many times
// through the memo (level i = [level i-1, level i-1] is 2^64 paths in 64 levels, a few hundred
// bytes); every tensor under a subtree is named on its first visit, so later visits are skipped.
void walk(const ValuePtr& v, std::string& path, std::vector<TensorInfo>& tensors,
          std::vector<uint8_t>& named, uint32_t depth, uint32_t max_depth,
          std::unordered_set<const Value*>& seen) {
  if (!v) return;
  if (depth > max_depth)
    throw Error(ErrorCode::kLimitExceeded, "object tree deeper than Limits::max_pickle_depth (" +
                                               std::to_string(max_depth) + ")");
  if (v.use_count() > 1 && (!v->items().empty() || !v->entries().empty() || v->state()) &&
      !seen.insert(v.get()).second)
    return;
  auto child = [&](std::string_view comp, const ValuePtr& c) {
    size_t len = path.size();
    if (!path.empty()) path += '.';
    path += comp;
    walk(c, path, tensors, named, depth + 1, max_depth, seen);
    path.resize(len);
  };
  // A string key is its own path component; no temporary string for the common case.
  auto key_child = [&](const ValuePtr& k, const ValuePtr& c) {
    if (k && k->kind() == Value::Kind::kString) {
      child(k->str(), c);
    } else {
      child(k ? path_component(*k) : "?", c);
    }
  };
  switch (v->kind()) {
    case Value::Kind::kTensor: {
      size_t i = static_cast<size_t>(v->as_int());
      if (i < tensors.size() && !named[i]) {
        named[i] = 1;
        tensors[i].name = path;
      }
      return;
    }
    case Value::Kind::kDict: {
      // A state dict's keys and tensors were made long before (to_value) and have left the
      // cache: ask for entry i + 16's Values and entry i + 8's key text ahead of their turn.
      const auto& e = std::as_const(*v).entries();
      for (size_t i = 0; i < e.size(); ++i) {
        if (i + 16 < e.size()) {
          __builtin_prefetch(e[i + 16].first.get());
          __builtin_prefetch(e[i + 16].second.get());
        }
        if (i + 8 < e.size() && e[i + 8].first) __builtin_prefetch(e[i + 8].first->str().data());
        key_child(e[i].first, e[i].second);
      }
      return;
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kSet:
      for (size_t i = 0; i < v->items().size(); ++i) child(std::to_string(i), v->items()[i]);
      return;
    case Value::Kind::kObject:
      for (size_t i = 0; i < v->items().size(); ++i) child(std::to_string(i), v->items()[i]);
      for (size_t i = 0; i < std::as_const(*v).appended().size(); ++i)
        child(std::to_string(i), std::as_const(*v).appended()[i]);
      for (auto& [k, val] : v->entries()) key_child(k, val);
      if (v->state()) {
        // A module's attributes read as its own path (TorchScript: encoder.layer.weight).
        if (v->state()->kind() == Value::Kind::kDict) {
          for (auto& [k, val] : v->state()->entries()) key_child(k, val);
        } else {
          walk(v->state(), path, tensors, named, depth + 1, max_depth, seen);
        }
      }
      return;
    default:
      return;
  }
}

}  // namespace

void name_tensors(const ValuePtr& root, std::vector<TensorInfo>& tensors, uint32_t max_depth) {
  std::vector<uint8_t> named(tensors.size(), 0);
  std::string path;
  std::unordered_set<const Value*> seen;
  walk(root, path, tensors, named, 0, max_depth, seen);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!named[i] && tensors[i].name.empty()) tensors[i].name = "<unnamed>." + std::to_string(i);
}

}  // namespace ckpt::internal
