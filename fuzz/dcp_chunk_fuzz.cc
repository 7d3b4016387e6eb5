// Fuzz target: a DCP chunk's torch.save item read directly (src/formats/dcp/dcp_chunk.h), against
// open_model: whatever read_chunk_item accepts, open_model must accept with the same facts.

#include "formats/dcp/dcp_chunk.h"
#include "formats/open.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  OpenOptions o;
  o.limits = fuzz::fuzz_limits();
  std::vector<std::byte> bytes(fuzz::as_span(data, size).begin(), fuzz::as_span(data, size).end());
  std::optional<internal::DcpChunkFacts> fast =
      internal::read_chunk_item(memory_source(bytes, "<fuzz>"), o);
  if (!fast) return 0;
  try {
    auto m = internal::open_model(memory_source(std::move(bytes), "<fuzz>"), o);
    const internal::DcpChunkFacts slow = internal::chunk_facts(*m);
    if (slow.one_tensor != fast->one_tensor || slow.dtype != fast->dtype ||
        slow.shape != fast->shape || slow.raw != fast->raw || slow.offset != fast->offset ||
        slow.nbytes != fast->nbytes)
      __builtin_trap();  // read differently
  } catch (const Error&) {
    __builtin_trap();  // read directly, refused by open_model
  }
  return 0;
}
