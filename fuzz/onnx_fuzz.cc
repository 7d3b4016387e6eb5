// Fuzz target: ONNX models, opened with internal::open_onnx and then listed, loaded (typed fields
// decoded; external data is read from files beside "<memory>", which has no folder, so it is
// refused) and verified as a user would (checkpoint_fuzz.h).

#include "checkpoint_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::fuzz::run_checkpoint(data, size, &ckpt::internal::open_onnx);
  return 0;
}
