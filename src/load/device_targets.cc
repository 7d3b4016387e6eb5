// The device memory of a load (load/device_load.h): targets, their feed, and their allocation
// while the first storages are read.

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "load/device_load.h"
#include "util/bytes.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kDeviceAlign = 256;

}  // namespace

void TargetFeed::publish(size_t count) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (count > ready_.load(std::memory_order_relaxed))
      ready_.store(count, std::memory_order_release);
  }
  cv_.notify_all();
}

void TargetFeed::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

bool TargetFeed::wait(size_t j) {
  if (j < ready_.load(std::memory_order_acquire)) return true;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return j < ready_.load(std::memory_order_relaxed) || closed(); });
  return j < ready_.load(std::memory_order_relaxed);
}

bool device_overlap() {
  const char* e = std::getenv("CKPT_DEVICE_OVERLAP");
  return !(e && std::strcmp(e, "0") == 0);
}

DeviceMemory::DeviceMemory(const LoadPlan& plan, const LoadOptions& options)
    : plan_(plan), allocator_(options.allocator) {
  const CheckpointModel& m = *plan.model;
  const size_t n = plan.storages.size();
  targets_.resize(n);
  offsets_.resize(n);
  if (allocator_) owners_.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const PlannedStorage& p = plan.storages[k];
    const uint64_t bytes = p.route == Route::kZeros ? 0 : m.storages[p.storage].nbytes;
    targets_[k] = {k, 0, bytes, nullptr};
    offsets_[k] = total_;
    total_ = align_up(total_ + bytes, kDeviceAlign);
    need_ += align_up(bytes, kDeviceAlign);
  }
}

std::shared_ptr<const void> DeviceMemory::owner(size_t k) const {
  return allocator_ ? std::shared_ptr<const void>(owners_[k]) : std::shared_ptr<const void>(arena_);
}

void DeviceMemory::allocate(CopyEngine& engine, TargetFeed& feed) {
  const size_t n = targets_.size();
  if (!allocator_) {
    arena_ = engine.allocate(std::max<uint64_t>(total_, 1));
    for (size_t k = 0; k < n; ++k)
      if (targets_[k].len) targets_[k].dst = arena_.get() + offsets_[k];
    feed.publish(n);
    return;
  }
  // Batches of 1, 2, 4, ... storages: the first reads wait for one allocation, and an allocator
  // behind a lock (the Python module's GIL) takes it a few times per load, not once per storage.
  // Without overlap, all in one call.
  const Device device = engine.device();
  std::vector<size_t> which;
  size_t k = 0;
  for (size_t batch = device_overlap() ? 1 : n; k < n && !feed.closed(); batch *= 2) {
    which.clear();
    while (k < n && (which.size() < batch || !targets_[k].len)) {
      if (targets_[k].len) which.push_back(k);
      ++k;
    }
    if (!which.empty()) allocate_batch(device, which, engine);
    feed.publish(k);
  }
}

void DeviceMemory::allocate_batch(const Device& device, std::span<const size_t> which,
                                  CopyEngine& engine) {
  std::vector<uint64_t> sizes(which.size());
  for (size_t i = 0; i < which.size(); ++i) sizes[i] = targets_[which[i]].len;
  std::vector<void*> got(which.size(), nullptr);
  std::shared_ptr<DeviceAllocator> a = allocator_;
  auto take = [&] {  // ownership of whatever was given, so that a failure frees it
    for (size_t i = 0; i < which.size(); ++i) {
      if (!got[i]) continue;
      const uint64_t bytes = sizes[i];
      owners_[which[i]] = std::shared_ptr<std::byte>(
          static_cast<std::byte*>(got[i]),
          [a, bytes, device](std::byte* q) noexcept { a->free(q, bytes, device); });
    }
  };
  try {
    a->allocate_all(sizes, device, got);
  } catch (...) {
    take();
    throw;
  }
  take();
  const CheckpointModel& m = *plan_.model;
  for (size_t i = 0; i < which.size(); ++i) {
    if (!got[i]) {
      uint64_t left = 0;  // this storage and the ones after it
      for (size_t k = which[i]; k < targets_.size(); ++k)
        left += align_up(targets_[k].len, kDeviceAlign);
      throw Error(ErrorCode::kLimitExceeded,
                  "the allocator gave no memory for " + std::to_string(sizes[i]) + " bytes on " +
                      device.str() + " (" + std::to_string(left) + " bytes needed, " +
                      std::to_string(engine.free_bytes()) + " free)",
                  m.source->name(), m.storages[plan_.storages[which[i]].storage].key);
    }
    targets_[which[i]].dst = static_cast<std::byte*>(got[i]);
  }
}

}  // namespace ckpt::internal
