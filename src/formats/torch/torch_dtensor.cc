// DTensors in a torch pickle: the rank's shard of a DTensor's rebuild call (torch_dtensor.h).

#include "formats/torch/torch_dtensor.h"

namespace ckpt::internal {

Ref dtensor_local(const PickleHeap& h, Ref fn, Ref type, Ref state) {
  using Kind = Value::Kind;
  if (h.kind(fn) != Kind::kGlobal || h.module(fn) != "torch._utils" ||
      h.name(fn) != "_rebuild_wrapper_subclass" || h.kind(type) != Kind::kGlobal ||
      h.name(type) != "DTensor" || !h.module(type).starts_with("torch.distributed."))
    return kNoRef;
  if (h.kind(state) == Kind::kTuple && h.items(state).size() == 2) {
    const Ref slots = h.items(state)[1];
    if (h.kind(slots) == Kind::kDict)
      if (Ref r = dtensor_local(h, fn, type, slots); r != kNoRef) return r;
    return h.kind(h.items(state)[0]) == Kind::kDict ? dtensor_local(h, fn, type, h.items(state)[0])
                                                    : kNoRef;
  }
  if (h.kind(state) != Kind::kDict) return kNoRef;
  std::span<const Ref> kv = h.items(state);
  for (size_t k = 0; k + 1 < kv.size(); k += 2)
    if (h.kind(kv[k]) == Kind::kString && h.text(kv[k]) == "_local_tensor" &&
        h.kind(kv[k + 1]) == Kind::kTensor)
      return kv[k + 1];
  return kNoRef;
}

}  // namespace ckpt::internal
