#pragma once
// numpy values in a torch pickle (torch_unpickle.cc): numpy.dtype objects and the scalars of
// numpy.core.multiarray.scalar(dtype, bytes). Arrays (BUILD of _reconstruct) become tensors in
// torch_unpickle.cc, which holds the storage table.

#include <optional>
#include <span>

#include "ckpt/dtype.h"
#include "pickle/heap.h"

namespace ckpt::internal {

// A plain numeric numpy type, and whether its bytes are big-endian (to be swapped).
struct NpType {
  DType dtype;
  bool swap = false;
};

// A numpy.dtype object: numpy.dtype('f8', False, True) with BUILD state (3, '<', ...). Only
// plain numeric types ('b1', 'i1'..'i8', 'u1'..'u8', 'f2', 'f4', 'f8', 'c8', 'c16').
std::optional<NpType> numpy_type(const PickleHeap& h, Ref d);

// numpy.core.multiarray.scalar(dtype, bytes): the number, its origin the call (kNoRef when it
// is not a plain numeric scalar: the call is then recorded as it is).
Ref numpy_scalar(PickleHeap& h, Ref fn, std::span<const Ref> a);

}  // namespace ckpt::internal
