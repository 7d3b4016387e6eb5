// Fuzz target: the `.metadata` reader of torch.distributed.checkpoint folders
// (src/formats/dcp): the restricted pickle VM with DCP's classes, then every field read as data.
// Differential too: where the direct reader (dcp_metadata_direct.cc) gives a result, the generic
// reader must give the same one.

#include "formats/dcp/dcp_metadata.h"
#include "fuzz_util.h"

namespace {

bool same(const ckpt::internal::DcpMetadata& a, const ckpt::internal::DcpMetadata& b) {
  if (a.version != b.version || a.mcore_keys != b.mcore_keys ||
      a.entries.size() != b.entries.size() || a.storage.size() != b.storage.size())
    return false;
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const auto &x = a.entries[i], &y = b.entries[i];
    if (x.fqn != y.fqn || x.is_bytes != y.is_bytes || x.dtype != y.dtype || x.size != y.size ||
        x.chunks.size() != y.chunks.size() || x.path.size() != y.path.size())
      return false;
    for (size_t c = 0; c < x.chunks.size(); ++c)
      if (x.chunks[c].offsets != y.chunks[c].offsets || x.chunks[c].sizes != y.chunks[c].sizes)
        return false;
    for (size_t p = 0; p < x.path.size(); ++p)
      if (x.path[p]->repr(80) != y.path[p]->repr(80)) return false;
  }
  for (size_t i = 0; i < a.storage.size(); ++i) {
    const auto &x = a.storage[i], &y = b.storage[i];
    if (x.fqn != y.fqn || x.chunk_offsets != y.chunk_offsets ||
        x.relative_path != y.relative_path || x.offset != y.offset || x.length != y.length ||
        x.transformed != y.transformed || x.transforms != y.transforms)
      return false;
  }
  return true;
}

}  // namespace

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
        if (!same(*fast, internal::read_dcp_metadata_generic(bytes, "<fuzz>", limits)))
          __builtin_trap();  // the direct reader read it otherwise
      } catch (const Error&) {
        __builtin_trap();  // the direct reader read what the generic one refuses
      }
    }
  return 0;
}
