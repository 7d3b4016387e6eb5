// Fuzz target: the zip reader (src/zip). Opens the input as a zip, then resolves every entry's
// data offset and reads every entry (with CRC checks), one by one and as one batch.

#include <numeric>
#include <vector>

#include "ckpt/source.h"
#include "fuzz_util.h"
#include "zip/zip_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  try {
    // A copying memory source: the reader may hold views into it past this scope.
    internal::ZipReader zip(
        memory_source(std::string_view(reinterpret_cast<const char*>(data), size)),
        fuzz::fuzz_limits());
    const size_t n = zip.entries().size();
    for (size_t i = 0; i < n; ++i) {
      try {
        zip.find(zip.entries()[i].name);
        zip.data_offset(i);
        zip.read(i, /*verify=*/true, 8 << 20);
      } catch (const Error&) {
      }
    }
    if (n) {
      try {
        zip.read_checked(0, true, 8 << 20);
      } catch (const Error&) {
      }
    }
    std::vector<size_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    zip.read_many(all);
  } catch (const Error&) {
  }
  return 0;
}
