#pragma once
// The few calls the restricted VM evaluates itself (unpickler.h lists them), for globals that the
// caller's allow-list admitted and its `call` hook left alone. Each builds plain data in the
// heap; none runs code.

#include <cstdint>
#include <span>

#include "ckpt/value.h"
#include "pickle/heap.h"

namespace ckpt::internal {

// Elements copied out of containers that may be shared (memoized) are counted, because a pickle
// can reference one big list many times for a few bytes each: set(big) a million times would
// otherwise cost a million copies of big.
class CopyBudget {
 public:
  explicit CopyBudget(uint64_t elements) : left_(elements) {}
  // Throws Error{kLimitExceeded} once the budget is spent.
  void spend(uint64_t elements);

 private:
  uint64_t left_;
};

// Value::Kind name for messages ("list", "global").
const char* kind_name(Value::Kind kind) noexcept;

// The result of `callable(*args)` for a built-in (collections.OrderedDict, Counter, defaultdict,
// builtins.set, frozenset, complex, bytearray, bytes, _codecs.encode), or kNoRef when `callable` is
// none of them or `args` is not a form this implements. Throws Error{kCorrupt} for arguments Python
// itself would reject (a non-latin-1 str encoded as latin-1).
Ref builtin_call(PickleHeap& heap, Ref callable, std::span<const Ref> args, CopyBudget& budget);

}  // namespace ckpt::internal
