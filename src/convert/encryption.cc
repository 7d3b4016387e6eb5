#include "convert/encryption.h"

#include "ckpt/error.h"
#include "ckpt/sink.h"
#include "util/text.h"

namespace ckpt::internal {

void write_key_file(const std::string& path, const std::string& raw_key, bool atomic, bool fsync) {
  FileSinkOptions fo;
  fo.atomic = atomic;
  fo.fsync = fsync;
  fo.owner_only = true;  // a key file is a secret: 0600 from its creation on
  fo.replace = false;    // and one that appeared meanwhile is never overwritten
  auto sink = create_file_sink(path, fo);
  sink->write(to_hex(std::as_bytes(std::span(raw_key.data(), raw_key.size()))) + "\n");
  sink->commit();
}

}  // namespace ckpt::internal
