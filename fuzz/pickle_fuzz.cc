// Fuzz target: the restricted pickle VM (src/pickle/unpickler). Allows a few globals so that the
// call, BUILD and persistent-id paths run, and renders the result as a pickle again.

#include <string>

#include "fuzz_util.h"
#include "pickle/pickler.h"
#include "pickle/unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  using namespace ckpt::internal;
  UnpicklerHooks hooks;
  hooks.allow_global = [](const std::string& module, const std::string& name) {
    return module == "collections" || (module == "builtins" && name != "eval" && name != "exec") ||
           module == "_codecs" || module == "torch._utils";
  };
  hooks.persistent_load = [](ckpt::internal::PickleHeap&, ckpt::internal::Ref pid) { return pid; };
  UnpickleOptions opt;
  opt.limits = fuzz::fuzz_limits();
  opt.limits.max_pickle_depth = 200;
  try {
    size_t consumed = 0;
    ValuePtr v = unpickle(fuzz::as_span(data, size), hooks, opt, &consumed);
    if (consumed > size) __builtin_trap();
    // The pickler walks the tree the VM built (cycles, deep nesting, odd kinds).
    try {
      std::string out;
      pickle(v, out);
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  return 0;
}
