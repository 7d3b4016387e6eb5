#pragma once
// A protocol-2 pickler that writes Value trees the way CPython's pickle module (protocol 2) does,
// so that torch.save output can be reproduced byte for byte: PROTO 2, memo (BINPUT/LONG_BINPUT)
// and BINGET by object identity (the same ValuePtr pickled twice is a BINGET), batches of 1000 for
// APPENDS/SETITEMS, TUPLE1/2/3, EMPTY_TUPLE not memoized, BININT1/BININT2/BININT/LONG1, BINFLOAT,
// NEWTRUE/NEWFALSE, BINUNICODE, bytes as _codecs.encode(latin1 str, 'latin1').
//
// Value kinds map to:
//   kGlobal -> GLOBAL "module\nname\n" (memoized).
//   kObject -> the reduce form: GLOBAL of module.name, args tuple (from items), REDUCE (NEWOBJ
//              when call() is kNewObj), memoize, APPEND(S) of appended(), SETITEM(S) of
//              entries(), then BUILD of `state` when state is non-null.
//   a value with an origin() (a numpy scalar) -> its origin, so the output holds the same object.
//   kDict with a class (module/name set, e.g. collections.OrderedDict) -> GLOBAL, args (items()),
//              REDUCE, memoize, SETITEM(S) for entries, then BUILD of `state` when non-null.
//   kSet -> builtins.set reduce of a list (protocol 2 has no set opcodes).
//   kComplex -> builtins.complex reduce.
//   kTensor -> Error{kInvalidArgument}: callers replace tensors with reduce forms before pickling.

#include <functional>
#include <string>

#include "ckpt/value.h"

namespace ckpt::internal {

struct PicklerHooks {
  // Called for every value before it is written; a non-null result is written as its persistent
  // id (the result pickled, then BINPERSID) instead of the value.
  std::function<ValuePtr(const Value&)> persistent_id;
};

// Appends the pickle of `root` (PROTO 2 ... STOP) to `out`. Throws Error{kInvalidArgument} for
// values protocol 2 cannot express.
void pickle(const ValuePtr& root, std::string& out, const PicklerHooks& hooks = {});

}  // namespace ckpt::internal
