#pragma once
// planner_data's paths, as both `.metadata` readers make them (dcp_metadata.cc, the generic one
// over the pickle heap; dcp_metadata_direct.cc, the one straight from the opcodes): the Values of
// their steps, one per distinct string or int, and the nested state dict they describe, whose
// objects are bounded by the pickle's object budget.
//
// Layer: formats. Thread-safety: none (one reader owns each).

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/value.h"
#include "formats/dcp/flat_index.h"
#include "util/name_index.h"

namespace ckpt::internal {

// The nested state dict that planner_data's paths describe (torch's set_element makes it: a dict
// per string step, a list per int step, padded with None up to the index). Each path is added
// to a trie of its steps; a list's length is its largest index plus one. Every step and every
// list slot counts as one object against `objects` (limits.object_bytes_for(.metadata size) /
// PickleHeap::kBytesPerObject): an index is padding a few bytes of pickle can ask for, and
// torch itself writes gaps (an empty dict in a list leaves no key), so only its cost is bounded.
class PathTree {
 public:
  explicit PathTree(uint64_t objects) : budget_(objects) {
    list_len_.push_back(0);
    steps_.emplace_back();
  }

  // False when the path's objects would exceed the budget. The steps are Values made once per
  // distinct string or int (PathSteps), so a step is known by its Value's address; they must
  // outlive the tree.
  bool add(const std::vector<ValuePtr>& path) {
    // The steps this path shares with the last one lead to the nodes they led to then (each was
    // found or made, its list long enough): the walk starts after them.
    size_t k = 0;
    while (k < path.size() && k < last_.size() && last_[k] == path[k].get()) ++k;
    last_.resize(k);
    last_nodes_.resize(k + 1);
    uint32_t node = last_nodes_[k];
    for (size_t i = k; i < path.size(); ++i) {
      const ValuePtr& step = path[i];
      const bool index = step->kind() == Value::Kind::kInt;
      const Step key{node, step.get()};
      const size_t next = list_len_.size();
      const uint32_t child =
          children_.find_or_add(hash(key), next, [&](uint32_t n) { return steps_[n] == key; });
      if (child == next) {
        if (!spend(1)) return false;
        list_len_.push_back(0);
        steps_.push_back(key);
      }
      if (index) {
        uint64_t& len = list_len_[node];
        const uint64_t want = static_cast<uint64_t>(step->as_int()) + 1;
        if (want > len && !spend(want - len)) return false;
        len = std::max(len, want);
      }
      node = child;
      last_.push_back(step.get());
      last_nodes_.push_back(node);
    }
    return true;
  }

  // Prefetches the index slot that add(path) will probe first if the paths added before it
  // end as the last one did (keys a few apart mostly share all but their last steps).
  void prefetch(const std::vector<ValuePtr>& path) const {
    size_t k = 0;
    while (k < path.size() && k < last_.size() && last_[k] == path[k].get()) ++k;
    if (k < path.size()) children_.prefetch(hash(Step{last_nodes_[k], path[k].get()}));
  }

 private:
  // A step from node `parent`: a list index or a dict key, as its Value.
  struct Step {
    uint32_t parent = 0;
    const Value* v = nullptr;
    bool operator==(const Step& o) const { return parent == o.parent && v == o.v; }
  };
  static uint64_t hash(const Step& k) {
    return (reinterpret_cast<uintptr_t>(k.v) * 0x9e3779b97f4a7c15ull) ^ k.parent;
  }
  bool spend(uint64_t n) {
    if (n > budget_) return false;
    budget_ -= n;
    return true;
  }
  uint64_t budget_;
  FlatIndex children_;              // (parent, step) -> node
  std::vector<Step> steps_;         // per node: the step that leads to it ([0]: the root, none)
  std::vector<uint64_t> list_len_;  // per node: its length as a list
  // The last path added, as its steps, and the nodes it went through ([0]: the root).
  std::vector<const Value*> last_;
  std::vector<uint32_t> last_nodes_{0};
};

// The Values of path steps (a string or a non-negative int), made once per distinct value.
class PathSteps {
 public:
  const ValuePtr& string(std::string_view s) { return get(true, s, 0); }
  const ValuePtr& integer(int64_t i) { return get(false, {}, i); }

 private:
  const ValuePtr& get(bool str, std::string_view s, int64_t i) {
    const uint64_t h = str ? name_hash(s) : static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull + 1;
    const size_t next = steps_.size();
    const uint32_t at = index_.find_or_add(h, next, [&](uint32_t j) {
      const Value& v = *steps_[j];
      return str ? v.kind() == Value::Kind::kString && v.str() == s
                 : v.kind() == Value::Kind::kInt && v.as_int() == i;
    });
    if (at == next) steps_.push_back(str ? Value::string(std::string(s)) : Value::integer(i));
    return steps_[at];
  }
  std::vector<ValuePtr> steps_;
  FlatIndex index_;
};

}  // namespace ckpt::internal
