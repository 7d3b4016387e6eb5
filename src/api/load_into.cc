// Loads into caller memory (include/ckpt/load_into.h).

#include "ckpt/load_into.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "api/checkpoint_impl.h"
#include "device/copy_engine.h"
#include "load/device_load.h"
#include "util/arena.h"

namespace ckpt {
namespace {

struct Job {
  size_t tensor;
  const Destination* dst;
};

// Every destination against its tensor, before anything is read.
std::vector<Job> check_all(const Checkpoint& c, const std::map<std::string, Destination>& into,
                           const Device& device) {
  std::vector<Job> jobs;
  jobs.reserve(into.size());
  for (const auto& entry : into) {
    // Named, not a structured binding: lambdas below capture it (clang before 16 cannot capture
    // a structured binding).
    const std::string& name = entry.first;
    const auto& d = entry.second;
    std::optional<size_t> i = c.find(name);
    if (!i)
      throw Error(ErrorCode::kNotFound, "no tensor named \"" + name + "\"", c.source().name(),
                  name);
    const TensorInfo& t = c.tensors()[*i];
    auto refuse = [&](const std::string& why) {
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot load into the destination of " + name + ": " + why, c.source().name(),
                  name);
    };
    if (d.dtype != t.dtype)
      refuse("the tensor is " + std::string(dtype_name(t.dtype)) + ", the destination " +
             std::string(dtype_name(d.dtype)));
    if (d.bytes != t.nbytes())
      refuse("the tensor has " + std::to_string(t.nbytes()) + " bytes, the destination " +
             std::to_string(d.bytes));
    if (internal::resolve_device(d.device) != device)
      refuse("the destination is on " + d.device.str() + ", the load goes to " + device.str());
    if (!d.data && d.bytes) refuse("no address");
    jobs.push_back({*i, &d});
  }
  return jobs;
}

// Host destinations: readers take tensors in turn, each by Checkpoint::read_into.
void into_host(const Checkpoint& c, const std::vector<Job>& jobs, const LoadOptions& options) {
  const int readers = static_cast<int>(std::min<size_t>(
      static_cast<size_t>(options.threads > 0 ? options.threads : internal::default_threads()),
      std::max<size_t>(jobs.size(), 1)));
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr failure;
  std::mutex mu;
  auto work = [&] {
    try {
      for (size_t k; !stop && (k = next++) < jobs.size();)
        c.read_into(
            jobs[k].tensor,
            std::span<std::byte>(static_cast<std::byte*>(jobs[k].dst->data), jobs[k].dst->bytes),
            options);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!failure) failure = std::current_exception();
      stop = true;
    }
  };
  std::vector<std::thread> pool;
  for (int r = 1; r < readers; ++r) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

// Device destinations of a single file: one plan, its targets filled through the ring.
void into_device_file(const Checkpoint& c, const SourcePtr& copy, const std::vector<Job>& jobs,
                      const Device& device, const LoadOptions& options) {
  const internal::CheckpointModel& m = internal::CheckpointAccess::model(c);
  std::vector<uint8_t> want(m.tensors.size(), 0);
  for (const Job& j : jobs) want[j.tensor] = 1;
  std::vector<size_t> position(m.storages.size(), SIZE_MAX);
  LoadOptions o = options;
  o.progress = nullptr;
  internal::LoadPlan plan = internal::make_plan(m, copy, o, {}, false);
  for (size_t k = 0; k < plan.storages.size(); ++k) position[plan.storages[k].storage] = k;
  std::vector<internal::DeviceTarget> targets;
  for (const Job& j : jobs) {
    const TensorInfo& t = m.tensors[j.tensor];
    if (!t.is_contiguous())
      throw Error(ErrorCode::kUnsupported,
                  "a device destination takes a contiguous tensor; " + t.name + " is strided",
                  m.source->name(), t.name);
    const uint64_t from = static_cast<uint64_t>(t.storage_offset) * dtype_size(t.dtype);
    targets.push_back(
        {position[t.storage], from, t.nbytes(), static_cast<std::byte*>(j.dst->data)});
  }
  // The plan covers every storage; only the targets' are read.
  internal::fill_device(plan, internal::engine_for(device), targets, options);
}

// Device destinations of other checkpoints: each tensor read into host memory, then copied.
void into_device_each(const Checkpoint& c, const std::vector<Job>& jobs, const Device& device,
                      const LoadOptions& options) {
  internal::CopyEngine& engine = internal::engine_for(device);
  LoadOptions host = options;
  host.device = Device{};
  for (const Job& j : jobs) {
    std::vector<std::byte> bytes(j.dst->bytes);
    c.read_into(j.tensor, bytes, host);
    engine.to_device(static_cast<std::byte*>(j.dst->data), bytes.data(), bytes.size());
  }
}

}  // namespace

void load_into(const Checkpoint& checkpoint, const std::map<std::string, Destination>& into,
               const LoadOptions& options) {
  const Device device = internal::resolve_device(options.device);
  std::vector<Job> jobs = check_all(checkpoint, into, device);
  if (device.is_cpu()) return into_host(checkpoint, jobs, options);
  if (SourcePtr copy = internal::CheckpointAccess::kind(checkpoint).file_copy())
    return into_device_file(checkpoint, copy, jobs, device, options);
  into_device_each(checkpoint, jobs, device, options);
}

}  // namespace ckpt
