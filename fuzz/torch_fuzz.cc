// Fuzz target: torch checkpoints, opened with Checkpoint::open (format detection, then
// the zip reader, the pickle VM and the torch rebuild rules) listed, loaded (all
// tensors, CRC checks on) and verified as a user would (checkpoint_fuzz.h).

#include "checkpoint_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::run_checkpoint(data, size, nullptr);
  return 0;
}
