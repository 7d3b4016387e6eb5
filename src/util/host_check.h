#pragma once
// Writers read tensors' bytes on the host: a tensor in device memory (a device load's) is
// refused at a writer's entry, before anything is written, naming it.

#include <string>

#include "ckpt/error.h"
#include "ckpt/tensor.h"

namespace ckpt::internal {

inline void require_host_tensor(const Tensor& t, const std::string& file) {
  if (t.storage() && !t.storage()->on_host())
    throw Error(ErrorCode::kInvalidArgument,
                "tensor is in " + t.storage()->device.str() +
                    " memory: writers read bytes on the host (load it into the cpu to save it)",
                file, t.name());
}

}  // namespace ckpt::internal
