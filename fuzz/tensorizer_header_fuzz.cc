// Fuzz target: one tensorizer per-tensor header (tzr::parse_tensor_header), with and without the
// crypt_info block that encrypted files carry. The first input byte picks the variant.

#include <string>

#include "formats/tensorizer/tensorizer_format.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  if (size < 1) return 0;
  const bool crypt = data[0] & 1;
  try {
    auto h = internal::tzr::parse_tensor_header(fuzz::as_span(data + 1, size - 1), crypt, "<fuzz>",
                                                "t", 0);
    internal::tzr::parse_dtype_string(h.dtype);
    try {
      internal::tzr::parse_tensor_name(h.name);
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  return 0;
}
