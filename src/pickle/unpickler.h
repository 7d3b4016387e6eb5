#pragma once
// A restricted pickle VM: it builds Value trees and never executes code. Globals are resolved
// only through the caller's allow-list; calls (REDUCE, NEWOBJ, NEWOBJ_EX, OBJ, INST) and BUILD on
// allowed globals are handed to the caller's hooks or to the few built-in semantics below.
//
// Opcodes: protocols 0-5 as checkpoints use them (see docs/formats/torch.md "torch.save zip",
// **Pickle**; the list opens unpickler.cc). EXT1/2/4 and out-of-band buffers are
// Error{kUnsupported}; a byte that is no opcode is Error{kCorrupt}; both name the offset.
//
// Values: ints beyond int64 keep their decimal text in Value::s (i = 0); LONG payloads above
// 2048 bytes are Error{kUnsupported}. Python 2 str opcodes (STRING, BINSTRING, SHORT_BINSTRING)
// give kString: the bytes as they are when valid UTF-8 (torch.load's encoding='utf-8'), else
// read as latin-1. Protocol 0-2 names are renamed to Python 3 ones (__builtin__ -> builtins)
// before allow_global sees them, as CPython's fix_imports does. None, booleans, () and ints in
// [-5, 256] are shared Values within one result, as in CPython: do not mutate them in place.
// Dict entries are appended in pickle order, duplicate keys included.

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "ckpt/options.h"
#include "ckpt/value.h"
#include "pickle/heap.h"

namespace ckpt::internal {

// Hooks see the VM's objects in its heap (pickle/heap.h) by Ref. Spans they are given stay
// valid for the call; spans they get from the heap do not survive their own make_* calls.
struct UnpicklerHooks {
  // Is module.name allowed as a GLOBAL / STACK_GLOBAL / INST / OBJ class? Not allowed ->
  // Error{kUnsupported, "global 'os.system' is not allowed"} at the opcode's offset.
  std::function<bool(const std::string& module, const std::string& name)> allow_global;
  // Asked for a global that allow_global refused: true admits it as a foreign (opaque) global.
  // Calls of it are recorded as kObject (never interpreted, never run), and APPEND(S) and
  // SETITEM(S) onto such objects are recorded too (PickleHeap::object_append/object_set_items).
  // Unset or false: the refusal above.
  std::function<bool(const std::string& module, const std::string& name)> admit_foreign;
  // REDUCE / NEWOBJ / NEWOBJ_EX / INST / OBJ of an allowed global `callable` (a kGlobal) with
  // `args`. Return the result, or kNoRef to get the built-in handling (below) or, failing that,
  // a kObject recording the call. May throw Error.
  std::function<Ref(PickleHeap& heap, Ref callable, std::span<const Ref> args)> call;
  // BUILD: set `state` on `obj`. Return true if handled; false -> built-in handling: kDict and
  // kObject get `state` stored as their state (dict state items of a plain dict are not merged).
  std::function<bool(PickleHeap& heap, Ref obj, Ref state)> build;
  // BINPERSID / PERSID: map a persistent id (any object) to an object. Unset ->
  // Error{kUnsupported}.
  std::function<Ref(PickleHeap& heap, Ref pid)> persistent_load;
};

// Built-in call semantics (applied when `call` returns nullptr), for allowed globals only:
//   collections.OrderedDict() -> ordered kDict;  builtins.set/frozenset(iterable) -> kSet;
//   builtins.complex(re, im) -> kComplex;  builtins.bytearray(x) -> kBytes with bytearray=true;
//   _codecs.encode(str, 'latin1'/'latin-1'/'utf-8') -> kBytes;  builtins.bytes(...) -> kBytes.
// APPEND/APPENDS onto kList (and kSet via ADDITEMS), SETITEM/SETITEMS onto kDict; onto a kObject
// they are recorded (a list or dict subclass, a deque, a defaultdict); anything else is
// Error{kCorrupt}. The call kind (REDUCE or NEWOBJ) of a kObject is recorded for writers.

struct UnpickleOptions {
  std::string source;        // names the file in errors
  std::string record;        // names the record ("archive/data.pkl")
  uint64_t base_offset = 0;  // absolute offset of data[0] in the file, for error offsets
  Limits limits;  // max_pickle_memo, max_pickle_stack, max_pickle_depth, max_metadata_bytes
  // Size of the file the pickle came from (0: the pickle's own size): the pickle and its objects
  // may take limits.object_bytes_for(file_size) bytes.
  uint64_t file_size = 0;
};

// Runs the pickle in `data` to its STOP and returns the result. `consumed`, if given, receives
// the number of bytes read (the legacy format has several pickles back to back). Throws Error:
// kTruncated, kCorrupt (stack underflow, bad memo index, unknown opcode byte...), kUnsupported
// (disallowed global, opcode not supported), kLimitExceeded (memo/stack limits, a result nested
// deeper than limits.max_pickle_depth, more objects than limits.object_bytes_for(file_size)
// allows, or memory running out: std::bad_alloc is reported as this, naming the file).
ValuePtr unpickle(std::span<const std::byte> data, const UnpicklerHooks& hooks,
                  const UnpickleOptions& options, size_t* consumed = nullptr);

// As unpickle(), with the same checks (the result's depth and the copies its objects' arguments
// would take included), but without making the Value tree: `read` is given the VM's heap and the
// result's Ref, valid during the call. For a reader of a known, large structure (a DCP
// `.metadata` of a million objects), where the tree would cost more than the reading. Errors
// `read` throws pass through unchanged.
void unpickle_heap(std::span<const std::byte> data, const UnpicklerHooks& hooks,
                   const UnpickleOptions& options,
                   const std::function<void(const PickleHeap&, Ref)>& read);

// Checks the first bytes of a pickle (at least one) before the rest of it is read or inflated:
// the first byte must be an opcode, and a PROTO must name protocol 0 to 5. Throws
// Error{kCorrupt} naming `source`, `record` and offset 0.
void check_pickle_start(std::span<const std::byte> head, const std::string& source,
                        std::string_view record);

}  // namespace ckpt::internal
