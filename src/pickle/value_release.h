#pragma once
// Iterative release of Value trees. ~Value frees children recursively, so dropping the last
// reference to a tree nested 100k deep (cheap to build from a few hundred KB of pickle) would
// overflow the C++ stack; the VM hands every value it drops to this instead.

#include <vector>

#include "ckpt/value.h"

namespace ckpt::internal {

// Drops the references in `values` (left empty). A value whose last reference this is has its
// children detached first, so no destructor recurses. Values that others still hold are only
// released by one reference; cycles (a list appended into itself) stay alive, as shared_ptr cycles
// do.
void release_values(std::vector<ValuePtr>& values) noexcept;

inline void release_value(ValuePtr v) noexcept {
  std::vector<ValuePtr> one;
  one.push_back(std::move(v));
  release_values(one);
}

}  // namespace ckpt::internal
