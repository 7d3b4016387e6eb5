// What every kind of checkpoint shares (api/checkpoint_kind.h): the defaults of parts() and
// stream_storages(), the selection of tensors, and the progress of an operation over several files.

#include "api/checkpoint_kind.h"

#include <algorithm>

namespace ckpt::internal {

const std::vector<Checkpoint>& CheckpointKind::parts() const {
  static const std::vector<Checkpoint> none;
  return none;
}

void CheckpointKind::stream_storages(uint64_t, std::span<const uint32_t> order, const StorageFn& fn,
                                     const LoadOptions& options) const {
  for (size_t k = 0; k < order.size(); ++k) fn(k, load_storage(order[k], options));
}

std::vector<uint8_t> select_tensors(const CheckpointModel& m, const TensorFilter& filter) {
  std::vector<uint8_t> sel(m.tensors.size(), 1);
  if (filter)
    for (size_t i = 0; i < m.tensors.size(); ++i) sel[i] = filter(m.tensors[i]) ? 1 : 0;
  return sel;
}

FileProgress::FileProgress(const ProgressFn& fn, std::vector<uint64_t> expected)
    : fn_(fn), later_(expected.size(), 0), expected_(std::move(expected)) {
  for (size_t k = expected_.size(); k-- > 1;) later_[k - 1] = later_[k] + expected_[k];
}

void FileProgress::report(uint64_t done, uint64_t total) {
  done = std::max(std::min(done, total), last_done_);  // never back, never past the total
  total = std::max(total, done);
  last_done_ = done;
  last_total_ = total;
  reported_ = true;
  fn_(done, total);
}

ProgressFn FileProgress::part(size_t k) {
  if (!fn_) return {};
  current_ = 0;
  return [this, k](uint64_t done, uint64_t of) {
    current_ = of;
    report(base_ + done, base_ + of + later_[k]);
  };
}

void FileProgress::end(size_t) {
  base_ += current_;
  current_ = 0;
}

void FileProgress::finish() {
  if (!fn_) return;
  if (reported_ && last_done_ == base_ && last_total_ == base_) return;
  report(base_, base_);
}

}  // namespace ckpt::internal
