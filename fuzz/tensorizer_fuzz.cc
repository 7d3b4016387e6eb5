// Fuzz target: tensorizer files (prologue, index, per-tensor headers, hashes, decryption),
// opened with internal::open_tensorizer and then listed, loaded (all tensors, hash checks on)
// and verified as a user would (checkpoint_fuzz.h).
//
// The key of the tensorizer fixture v3_encrypted_random_key (docs/formats/tensorizer.md
// "tensorizer", **Fixtures**) is always given, so that inputs
// derived from that fixture reach the (parallel) decryption, and no password is: a password
// would run Argon2id with the file's cost on every execution.

#include "checkpoint_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::OpenOptions opt;
  opt.decrypt_key = "94db41031901a88222f148e6aabe61d4f49653e661f7110eebef5bad072931aa";
  ckpt::fuzz::run_checkpoint(data, size, &ckpt::internal::open_tensorizer, opt);
  return 0;
}
