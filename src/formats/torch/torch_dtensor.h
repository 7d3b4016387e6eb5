#pragma once
// DTensors (torch.distributed.tensor) in a torch pickle (torch_unpickle.cc): a DTensor is pickled
// as a wrapper subclass, _rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, args, state),
// its rank's shard in the state's `_local_tensor` and its DeviceMesh and placements in `_spec`.
// The shard is read as the tensor; the class and the state go with it as for any subclass
// (formats/dcp/dtensor_files.cc assembles a folder of them).

#include "pickle/heap.h"

namespace ckpt::internal {

// The shard of a DTensor's rebuild call: the tensor under state["_local_tensor"] (the state is
// copyreg's (dict, slots) pair for DTensor's __slots__, or a dict), or kNoRef when `fn` and
// `type` are not _rebuild_wrapper_subclass and a torch.distributed DTensor class, or the state
// holds no tensor there.
Ref dtensor_local(const PickleHeap& h, Ref fn, Ref type, Ref state);

}  // namespace ckpt::internal
