// Fuzz target: the `.metadata` reader of torch.distributed.checkpoint folders
// (src/formats/dcp): the restricted pickle VM with DCP's classes, then every field read as data.
// Differential too: where the direct reader (dcp_metadata_direct.cc) gives a result, the generic
// reader must give the same one.

#include "formats/dcp/dcp_metadata.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  Limits limits = fuzz::fuzz_limits();
  limits.max_pickle_depth = 200;
  const auto bytes = fuzz::as_span(data, size);
  try {
    internal::DcpMetadata md = internal::read_dcp_metadata(bytes, "<fuzz>", limits);
    // Every chunk read has its dimensions; the reader promised non-negative ints.
    for (const auto& e : md.entries)
      for (const auto& c : e.chunks)
        for (int64_t v : c.offsets)
          if (v < 0) __builtin_trap();
  } catch (const Error&) {
  }
  if (size <= limits.max_metadata_bytes)
    if (auto fast = internal::read_dcp_metadata_direct(bytes, limits)) {
      try {
        if (!internal::same_metadata(*fast,
                                     internal::read_dcp_metadata_generic(bytes, "<fuzz>", limits)))
          __builtin_trap();  // the direct reader read it otherwise
      } catch (const Error&) {
        __builtin_trap();  // the direct reader read what the generic one refuses
      }
    }
  return 0;
}
