// A window of another source (io/window_source.h).

#include "io/window_source.h"

#include "ckpt/error.h"

namespace ckpt::internal {
namespace {

class WindowSource final : public ByteSource {
 public:
  WindowSource(SourcePtr base, uint64_t offset, uint64_t size, std::string name)
      : base_(std::move(base)), offset_(offset), size_(size), name_(std::move(name)) {}
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void read_into(uint64_t offset, std::span<std::byte> dst) const override {
    check_range(offset, dst.size());
    count_forwarded(dst.size());
    base_->read_into(offset_ + offset, dst);
  }
  void read_batch(std::span<const ReadRequest> requests) const override {
    std::vector<ReadRequest> moved(requests.begin(), requests.end());
    for (ReadRequest& r : moved) {
      check_range(r.offset, r.dst.size());
      count_forwarded(r.dst.size());
      r.offset += offset_;
    }
    base_->read_batch(moved);
  }
  uint64_t preferred_read_size() const override { return base_->preferred_read_size(); }

 private:
  SourcePtr base_;
  uint64_t offset_, size_;
  std::string name_;
};

}  // namespace

SourcePtr window_source(SourcePtr base, uint64_t offset, uint64_t size, std::string name) {
  if (offset > base->size() || size > base->size() - offset)
    throw Error(ErrorCode::kTruncated,
                "an item of " + std::to_string(size) + " bytes passes the end of the file (" +
                    std::to_string(base->size()) + " bytes)",
                base->name(), {}, offset);
  return std::make_shared<WindowSource>(std::move(base), offset, size, std::move(name));
}

}  // namespace ckpt::internal
