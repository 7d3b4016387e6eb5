#pragma once
// Shared body of the format targets: open the input with one format's opener (as
// Checkpoint::open would after detecting it), then do everything a user does with an untrusted
// checkpoint: list, read each tensor, load all (CRC/hash checks on), verify, and touch the
// first and last byte of every tensor view so that ASan sees any view outside its storage.

#include <memory>
#include <string_view>

#include "api/checkpoint_impl.h"
#include "ckpt/checkpoint.h"
#include "formats/open.h"
#include "fuzz_util.h"

namespace ckpt::fuzz {

using Opener = std::shared_ptr<internal::CheckpointModel> (*)(SourcePtr, const OpenOptions&);

inline void touch(const Tensor& t) {
  if (!t.storage() || t.info().numel() == 0) return;
  volatile std::byte sink{};
  const std::byte* p = t.data();
  sink = p[0];
  uint64_t extent = t.info().byte_extent();
  if (extent) sink = p[extent - 1];
  // Bounded: a zero-stride view may claim far more elements than its storage holds.
  if (t.info().nbytes() <= (1u << 20)) t.contiguous_bytes();
  (void)sink;
}

inline void run_checkpoint(const uint8_t* data, size_t size, Opener opener,
                           const OpenOptions& base = {}) {
  OpenOptions opt = base;
  opt.limits = fuzz_limits();
  try {
    SourcePtr src = memory_source(std::string_view(reinterpret_cast<const char*>(data), size));
    // No opener: detect the format as users do.
    Checkpoint c = opener ? [&] {
      auto d = opener(src, opt);
      d->finalize();
      return internal::CheckpointAccess::make(std::move(d));
    }()
                          : Checkpoint::open(src, opt);
    c.find("x");
    for (size_t i = 0; i < c.tensors().size() && i < 64; ++i) {
      try {
        touch(c.tensor(i));
      } catch (const Error&) {
      }
    }
    try {
      LoadOptions lo;
      lo.verify = true;
      lo.threads = 2;
      for (const Tensor& t : c.load_all(lo)) touch(t);
    } catch (const Error&) {
    }
    c.verify();
  } catch (const Error&) {
  }
}

}  // namespace ckpt::fuzz
