#pragma once
// Shared by the device tests: every device load inside a UseEngine's scope goes to its engine
// (the host copy engine stands in for CUDA).

#include "device/copy_engine.h"

namespace ckpt::test {

struct UseEngine {
  explicit UseEngine(internal::CopyEngine& e) { internal::set_engine_override(&e); }
  ~UseEngine() { internal::set_engine_override(nullptr); }
  UseEngine(const UseEngine&) = delete;
  UseEngine& operator=(const UseEngine&) = delete;
};

}  // namespace ckpt::test
