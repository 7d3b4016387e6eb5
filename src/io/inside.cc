#include "io/inside.h"

#include <filesystem>

#include "ckpt/error.h"

namespace ckpt::internal {

void check_inside(const std::string& path, const std::string& dir, const std::string& what,
                  const std::string& where, const std::string& file, const std::string& record) {
  std::error_code ec;
  const auto base = std::filesystem::weakly_canonical(dir.empty() ? "." : dir, ec);
  if (ec) return;
  const auto real = std::filesystem::weakly_canonical(path, ec);
  if (ec) return;  // opening reports the error
  const auto rel = real.lexically_relative(base);
  if (rel.empty() || *rel.begin() == "..")
    throw Error(ErrorCode::kCorrupt,
                what + " " + path + " resolves outside " + where + " (" + real.string() + ")", file,
                record);
}

}  // namespace ckpt::internal
