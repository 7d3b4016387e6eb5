// Fuzz target: the `.metadata` reader of torch.distributed.checkpoint folders
// (src/formats/dcp): the restricted pickle VM with DCP's classes, then every field read as data.

#include "formats/dcp/dcp_metadata.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  Limits limits = fuzz::fuzz_limits();
  limits.max_pickle_depth = 200;
  try {
    internal::DcpMetadata md =
        internal::read_dcp_metadata(fuzz::as_span(data, size), "<fuzz>", limits);
    // Every chunk read has its dimensions; the reader promised non-negative ints.
    for (const auto& e : md.entries)
      for (const auto& c : e.chunks)
        for (int64_t v : c.offsets)
          if (v < 0) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
