// Device names: "cpu", "cuda" (the current device), "cuda:N".

#include "ckpt/device.h"

#include <atomic>
#include <charconv>

#include "ckpt/error.h"
#include "device/copy_engine.h"

namespace ckpt {
namespace {
std::atomic<uint64_t> direct_total{0}, unified_total{0};
}

void internal::count_direct_bytes(uint64_t n) { direct_total += n; }
uint64_t gds_bytes_read() { return direct_total.load(); }
void internal::count_unified_bytes(uint64_t n) { unified_total += n; }
uint64_t unified_bytes_loaded() { return unified_total.load(); }

Device Device::parse(std::string_view text) {
  if (text == "cpu") return {};
  std::string_view kind = text.substr(0, text.find(':'));
  if (kind == "cuda") {
    if (text.size() == kind.size()) return current_cuda();
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
      throw Error(ErrorCode::kUnsupported, "cannot load into device \"" + std::string(text) +
                                               "\": ckpt loads into cpu and cuda");
  throw Error(ErrorCode::kInvalidArgument,
              "bad device \"" + std::string(text) + "\": expected cpu, cuda or cuda:N");
}

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return index < 0 ? "cuda" : "cuda:" + std::to_string(index);
}

}  // namespace ckpt
