// load_rank and load_group: a resolved rank plan's tensors read into memory of their own, host
// or device (LoadOptions::device, through the device's copy engine); for load_group, the
// Replicate tensors' bytes read once across the group and assembled in place (rank_exchange.cc).

#include <cstring>
#include <memory>

#include "ckpt/error.h"
#include "load/device_load.h"
#include "ranks/rank_stream.h"
#include "util/bytes.h"

namespace ckpt {
namespace internal {

const ByteSource& source_of(const Checkpoint& c, uint32_t file) {
  return c.shards().empty() ? c.source() : c.shards()[file].source();
}

RankTarget RankTarget::of(const LoadOptions& options) {
  RankTarget t;
  t.host = options;
  t.host.device = Device{};
  t.host.allocator = nullptr;
  if (options.device.is_cpu()) return t;
  t.device = resolve_device(options.device);
  t.engine = &engine_for(t.device);
  return t;
}

void Batches::add(const RankTensor& rt, uint64_t a, uint64_t b, std::byte* dst) {
  const FileRange& r = rt.ranges[0];
  of(r.file).push_back({r.offset + a, std::span<std::byte>(dst, b - a)});
}

void Batches::add_box(const RankTensor& rt, std::byte* dst) {
  for (const FileRange& r : rt.ranges) {
    of(r.file).push_back({r.offset, std::span<std::byte>(dst, r.length)});
    dst += r.length;
  }
}

void Batches::read() {
  for (auto& [file, reqs] : files_) source_of(c_, file).read_batch(reqs);
  files_.clear();
}

std::vector<ReadRequest>& Batches::of(uint32_t file) {
  for (auto& [f, reqs] : files_)
    if (f == file) return reqs;
  return files_.emplace_back(file, std::vector<ReadRequest>{}).second;
}

}  // namespace internal

namespace {

using internal::RankTarget;

// Memory of sizes[i] bytes for each i, with the owner that keeps it alive: host memory, or the
// device's (after the budget check, so that a load that cannot fit allocates nothing): one
// allocation of its engine, or one per size from options.allocator.
std::vector<std::byte*> memory(const RankTarget& t, const std::vector<uint64_t>& sizes,
                               const LoadOptions& o, const std::string& file,
                               std::vector<std::shared_ptr<const void>>& owners) {
  std::vector<std::byte*> at(sizes.size(), nullptr);
  owners.assign(sizes.size(), nullptr);
  if (!t.engine) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::shared_ptr<std::byte[]> b(new std::byte[std::max<uint64_t>(sizes[i], 1)]);
      at[i] = b.get();
      owners[i] = std::move(b);
    }
    return at;
  }
  uint64_t total = 0;
  std::vector<uint64_t> off(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    off[i] = total;
    total = internal::align_up(total + sizes[i], 256);
  }
  internal::check_device_budget(*t.engine, total, o, file);
  if (!o.allocator) {
    std::shared_ptr<std::byte> arena = t.engine->allocate(std::max<uint64_t>(total, 1));
    for (size_t i = 0; i < sizes.size(); ++i) at[i] = arena.get() + off[i], owners[i] = arena;
    return at;
  }
  std::shared_ptr<DeviceAllocator> a = o.allocator;
  const Device device = t.device;
  std::vector<size_t> which;
  std::vector<uint64_t> asked;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i]) which.push_back(i), asked.push_back(sizes[i]);
  std::vector<void*> got(which.size(), nullptr);
  auto take = [&] {  // ownership of whatever was given, so that a failure frees it
    for (size_t j = 0; j < which.size(); ++j) {
      if (!got[j] || owners[which[j]]) continue;
      const uint64_t bytes = asked[j];
      owners[which[j]] = std::shared_ptr<std::byte>(
          static_cast<std::byte*>(got[j]),
          [a, bytes, device](std::byte* q) noexcept { a->free(q, bytes, device); });
      at[which[j]] = static_cast<std::byte*>(got[j]);
    }
  };
  try {
    a->allocate_all(asked, device, got);
  } catch (...) {
    take();
    throw;
  }
  take();
  for (size_t j = 0; j < which.size(); ++j)
    if (!got[j])
      throw Error(ErrorCode::kLimitExceeded,
                  "the allocator gave no memory for " + std::to_string(asked[j]) + " bytes on " +
                      device.str(),
                  file);
  return at;
}

// rt's box into host memory dst: batched where its bytes lie raw (and no CRC is to be checked,
// which covers whole storages), else through Checkpoint::read_slice.
void read_box(const Checkpoint& c, const RankTensor& rt, std::span<std::byte> dst,
              const LoadOptions& o, internal::Batches& batches) {
  if (rt.exact && !o.verify) return batches.add_box(rt, dst.data());
  c.read_slice(rt.tensor, rt.begin, rt.end, dst, o);
}

using Box = std::pair<const RankTensor*, std::byte*>;  // a tensor's box and its memory

// The boxes read into their memory. Host: raw ranges batched per file, the rest by read_slice.
// Device: the raw ranges of every box through the staging ring of the device's copy engine (the
// runs of a box packed into slots: no box is ever whole in host memory); other layouts through
// read_slice into host memory, one box at a time, then through the ring.
void read_boxes(const Checkpoint& c, const std::vector<Box>& boxes, const RankTarget& t,
                const LoadOptions& o) {
  if (!t.engine) {
    internal::Batches batches(c);
    for (const Box& b : boxes)
      read_box(c, *b.first, std::span<std::byte>(b.second, b.first->nbytes), t.host, batches);
    batches.read();
    return;
  }
  auto raw = [&](const RankTensor& rt) { return rt.exact && !o.verify; };
  std::vector<internal::DeviceRun> runs;
  for (const Box& b : boxes) {
    if (!raw(*b.first)) continue;
    std::byte* dst = b.second;
    for (const FileRange& r : b.first->ranges) {
      runs.push_back({&internal::source_of(c, r.file), r.offset, nullptr, r.length, dst});
      dst += r.length;
    }
  }
  internal::fill_device_runs(*t.engine, runs, o);
  for (const Box& b : boxes) {
    const RankTensor& rt = *b.first;
    if (raw(rt) || rt.nbytes == 0) continue;
    std::vector<std::byte> host(rt.nbytes);
    c.read_slice(rt.tensor, rt.begin, rt.end, host, t.host);
    const internal::DeviceRun run{nullptr, 0, host.data(), host.size(), b.second};
    internal::fill_device_runs(*t.engine, std::span(&run, 1), o);
  }
}

// The plan's tensors, each in memory of its own (the Replicate ones of a group, with `ex`, in
// one stream assembled across the group), on o.device.
std::vector<Tensor> load_tensors(const Checkpoint& c, const RankLoadPlan& plan, RankExchange* ex,
                                 uint64_t budget, const LoadOptions& o) {
  const RankTarget t = RankTarget::of(o);
  internal::Replicated rep;
  std::vector<uint64_t> sizes;
  std::vector<size_t> block(plan.tensors.size());  // its memory, or its place in rep
  std::vector<uint8_t> streamed(plan.tensors.size(), 0);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const RankTensor& rt = plan.tensors[i];
    if (ex && plan.world > 1 && rt.placement.kind == Placement::Kind::kReplicate) {
      streamed[i] = 1;
      block[i] = rep.tensors.size();
      rep.add(rt);
      continue;
    }
    block[i] = sizes.size();
    sizes.push_back(rt.nbytes);
  }
  const size_t stream = sizes.size();
  if (!rep.tensors.empty()) sizes.push_back(rep.total);
  std::vector<std::shared_ptr<const void>> owners;
  const std::vector<std::byte*> at = memory(t, sizes, o, c.source().name(), owners);

  std::vector<Tensor> out;
  out.reserve(plan.tensors.size());
  std::vector<Box> boxes;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const RankTensor& rt = plan.tensors[i];
    const size_t m = streamed[i] ? stream : block[i];
    std::byte* p = streamed[i] ? at[m] + rep.start[block[i]] : at[m];
    const TensorInfo& info = c.tensors()[rt.tensor];
    out.push_back(Tensor::from_bytes(info.name, info.dtype, rt.shape(),
                                     std::span<const std::byte>(p, rt.nbytes), owners[m]));
    out.back().storage()->device = t.device;
    if (!streamed[i]) boxes.emplace_back(&rt, p);
  }
  if (!rep.total) {
    read_boxes(c, boxes, t, o);
    return out;
  }
  // The boxes are read by the exchange's reader once this rank's parts are: alongside the rounds.
  internal::exchange_replicated(c, rep, *ex, budget, o, at[stream], t,
                                [&] { read_boxes(c, boxes, t, o); });
  return out;
}

}  // namespace

std::vector<Tensor> load_rank(const Checkpoint& c, const RankLoadPlan& plan,
                              const LoadOptions& options) {
  return load_tensors(c, plan, nullptr, 0, options);
}

std::vector<Tensor> load_group(const Checkpoint& c, const RankLoadPlan& plan, RankExchange& ex,
                               uint64_t budget, const LoadOptions& options) {
  if (plan.rank != ex.rank() || plan.world != ex.world())
    throw Error(ErrorCode::kInvalidArgument,
                "the plan is for rank " + std::to_string(plan.rank) + " of " +
                    std::to_string(plan.world) + "; the exchange is rank " +
                    std::to_string(ex.rank()) + " of " + std::to_string(ex.world()),
                c.source().name());
  return load_tensors(c, plan, &ex, budget, options);
}

}  // namespace ckpt
