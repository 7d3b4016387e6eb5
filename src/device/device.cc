// Device names: "cpu", "cuda", "cuda:N".

#include <charconv>

#include "ckpt/device.h"
#include "ckpt/error.h"

namespace ckpt {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return {};
  std::string_view kind = text.substr(0, text.find(':'));
  if (kind == "cuda") {
    if (text.size() == kind.size()) return cuda(0);
    std::string_view num = text.substr(kind.size() + 1);
    int index = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec != std::errc() || end != num.data() + num.size() || num.empty() || index < 0)
      throw Error(ErrorCode::kInvalidArgument,
                  "bad device \"" + std::string(text) + "\": expected cuda:N with N >= 0");
    return cuda(index);
  }
  if (text == "cpu:0") return {};
  for (const char* known : {"meta", "mps", "xpu", "hip", "xla", "vulkan", "ipu", "hpu", "mtia"})
    if (kind == known)
      throw Error(ErrorCode::kUnsupported,
                  "cannot load into device \"" + std::string(text) + "\": ckpt loads into cpu and cuda");
  throw Error(ErrorCode::kInvalidArgument,
              "bad device \"" + std::string(text) + "\": expected cpu, cuda or cuda:N");
}

std::string Device::str() const {
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
}

}  // namespace ckpt
