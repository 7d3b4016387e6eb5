// Format detection: the first bytes name the format; every opener reads metadata only.

#include "formats/open.h"

#include <cstring>

namespace ckpt::internal {

std::shared_ptr<CheckpointModel> open_model(SourcePtr source, const OpenOptions& options,
                                            const OpenHooks& hooks) {
  std::byte head[16] = {};
  size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof head, source->size()));
  std::shared_ptr<CheckpointModel> data;
  std::optional<Error> zip_error;
  if (source->memory()) {
    std::memcpy(head, source->memory(), n);
  } else {
    // Try the zip layout first: its first read (the tail) is one the zip reader needs anyway,
    // so a torch zip opens in at most three reads. Other formats pay one read more.
    try {
      data = open_torch_zip(source, options, hooks);
    } catch (const Error& e) {
      zip_error = e;
    }
    if (!data) source->read_into(0, std::span<std::byte>(head, n));
  }
  auto h = reinterpret_cast<const unsigned char*>(head);
  try {
    if (data) {
      // opened as a zip above
    } else if (n >= 4 && h[0] == 'P' && h[1] == 'K' && h[2] == 3 && h[3] == 4) {
      if (zip_error) throw *zip_error;
      data = open_torch_zip(source, options, hooks);
    } else if (n >= 4 && h[0] == 0x80 && h[1] == 0x02 && h[2] == 0x8a) {
      data = open_torch_legacy(source, options);
    } else if (n >= 5 && std::memcmp(h, "|TZR|", 5) == 0) {
      data = open_tensorizer(source, options);
    } else if (n >= 9 && (h[8] == '{' || h[8] == ' ')) {
      data = open_safetensors(source, options);
    } else if (n >= 8 && std::memcmp(h, "PYTORCH1", 8) == 0) {
      throw Error(ErrorCode::kUnsupported, "pre-1.0 PYTORCH1 archives are not supported",
                  source->name());
    } else {
      throw Error(ErrorCode::kUnsupported,
                  "unknown format (not a torch zip, legacy torch file, safetensors or tensorizer "
                  "file)",
                  source->name(), {}, 0);
    }
    data->finalize();
  } catch (Error& e) {
    e.with_source(source->name());
    throw;
  }
  return data;
}

}  // namespace ckpt::internal
