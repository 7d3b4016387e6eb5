// Fuzz target: legacy checkpoints, opened with internal::open_torch_legacy and then listed, loaded
// (all tensors, CRC checks on) and verified as a user would (checkpoint_fuzz.h).

#include "checkpoint_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::run_checkpoint(data, size, &ckpt::internal::open_torch_legacy);
  return 0;
}
