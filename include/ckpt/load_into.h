#pragma once
// Loading into memory the caller owns: each named tensor's elements are copied into a
// destination given for it (host memory, or the memory of a CUDA device), nothing is allocated
// for them. For reloading weights in place (the Python module's ckpt.load_into), and for callers
// that manage device memory themselves.

#include <cstdint>
#include <map>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/device.h"
#include "ckpt/dtype.h"
#include "ckpt/options.h"

namespace ckpt {

// Where one tensor's elements go: `bytes` bytes at `data` on `device`, holding `dtype` elements.
struct Destination {
  void* data = nullptr;
  uint64_t bytes = 0;
  Device device;
  DType dtype = DType::kUInt8;
};

// Copies the elements (row-major, contiguous) of every tensor named in `into` into its
// destination. Everything is checked before any byte is read: a name the checkpoint lacks is
// Error{kNotFound}; a destination whose dtype or size differs from the tensor's, or whose device
// is not options.device (resolved: "cuda" is the current device), is Error{kInvalidArgument}
// naming the tensor. Host destinations are filled by options.threads readers (each tensor by one
// positional read where its bytes are raw); device ones through the pinned staging ring of a
// device load (LoadOptions), one plan over the file, without any device allocation (a single
// file; other checkpoints go tensor by tensor through host memory). A device destination's
// tensor must be contiguous in its storage (else Error{kUnsupported}). options.verify checks the
// CRC of a storage a destination covers whole. On a throw, destinations may hold part of their
// bytes. Destinations must not overlap.
void load_into(const Checkpoint& checkpoint, const std::map<std::string, Destination>& into,
               const LoadOptions& options = {});

}  // namespace ckpt
