// Checkpoint: the public handle over an opened model. Opening detects the format
// (formats/open.h); every load builds a LoadPlan (load/plan.h) and runs one of its executors.

#include "ckpt/remote.h"
#include "ckpt/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "api/checkpoint_impl.h"
#include "formats/open.h"
#include "device/copy_engine.h"
#include "load/device_load.h"
#include "load/plan.h"
#include "util/crc32.h"

namespace ckpt {

using internal::CheckpointModel;
using internal::ShardSet;

namespace {

// A set's progress: shard after shard, counted on from the bytes of the shards before, against
// the whole set's total.
struct SetProgress {
  ProgressFn fn;
  uint64_t total = 0;
  uint64_t base = 0;
  ProgressFn shard(uint64_t later) const {  // `later`: bytes of the shards after this one
    if (!fn) return {};
    return [this, later](uint64_t done, uint64_t of) {
      const uint64_t all = std::max(total, base + of + later);
      fn(std::min(base + done, all), all);
    };
  }
};

// Bytes of the storages the selected tensors use, per shard.
std::vector<uint64_t> selected_bytes(const CheckpointModel& m, const ShardSet& set,
                                     const std::vector<uint8_t>& selected);

// The walk load_all and stream share over a set: for each shard with a selected tensor, `fn(k,
// options)` with the shard's LoadOptions, whose progress counts into the whole set's.
void for_each_selected_shard(const CheckpointModel& m, const ShardSet& set,
                             const std::vector<uint8_t>& sel, const LoadOptions& options,
                             const std::function<void(size_t, const LoadOptions&)>& fn) {
  const std::vector<uint64_t> bytes = selected_bytes(m, set, sel);
  SetProgress progress{options.progress, 0, 0};
  for (uint64_t b : bytes) progress.total += b;
  for (size_t k = 0; k < set.shards.size(); ++k) {
    uint64_t later = 0;
    for (size_t j = k + 1; j < bytes.size(); ++j) later += bytes[j];
    const size_t base = set.tensor_base[k];
    bool any = false;
    for (size_t i = 0; i < set.shards[k].tensors().size() && !any; ++i) any = sel[base + i] != 0;
    if (any) {
      LoadOptions o = options;
      o.progress = progress.shard(later);
      fn(k, o);
    }
    progress.base += bytes[k];
  }
}

// Bytes of the storages the selected tensors use, per shard.
std::vector<uint64_t> selected_bytes(const CheckpointModel& m, const ShardSet& set,
                                     const std::vector<uint8_t>& selected) {
  std::vector<uint64_t> bytes(set.shards.size(), 0);
  std::vector<uint8_t> counted(m.storages.size(), 0);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (!selected[i]) continue;
    const uint32_t s = m.tensors[i].storage;
    if (counted[s]) continue;
    counted[s] = 1;
    bytes[set.storage_shard[s]] += m.storages[s].nbytes;
  }
  return bytes;
}

// The tensors `filter` accepts, by merged index.
std::vector<uint8_t> select(const CheckpointModel& m, const TensorFilter& filter) {
  std::vector<uint8_t> sel(m.tensors.size(), 1);
  if (filter)
    for (size_t i = 0; i < m.tensors.size(); ++i) sel[i] = filter(m.tensors[i]) ? 1 : 0;
  return sel;
}

// A filter for shard k's own table: the merged selection (the load plan calls it with references
// into the shard's tensors()).
TensorFilter shard_filter(const Checkpoint& shard, const ShardSet& set, size_t k,
                          const std::vector<uint8_t>& sel) {
  const TensorInfo* first = shard.tensors().data();
  const size_t n = shard.tensors().size(), base = set.tensor_base[k];
  return [first, n, base, &sel](const TensorInfo& t) {
    const size_t i = static_cast<size_t>(&t - first);
    return i < n && sel[base + i] != 0;
  };
}

}  // namespace

Checkpoint::Impl::Impl(std::shared_ptr<const CheckpointModel> m,
                       std::shared_ptr<const ShardSet> shard_set)
    : model(std::move(m)), root(model->root), set(std::move(shard_set)) {
  copy = model->source->pread_twin();
  if (!copy) copy = model->source;
}

Checkpoint::Checkpoint(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Checkpoint Checkpoint::open(const std::string& path, const OpenOptions& options) {
  return open(open_source(path, options.mmap, options.remote), options);
}

Checkpoint Checkpoint::open(SourcePtr source, const OpenOptions& options) {
  try {
    return internal::CheckpointAccess::make(internal::open_model(source, options));
  } catch (const Error& e) {
    // Not a checkpoint: a sharded checkpoint's index (JSON) opens as its set of shards.
    // A read that failed (a remote source after its retries) is no format's refusal.
    if (e.code() == ErrorCode::kIo || e.code() == ErrorCode::kAuth) throw;
    if (!internal::looks_like_json(*source)) throw;
  }
  return internal::open_index(source, std::filesystem::path(source->name()).parent_path().string(),
                              options);
}

Checkpoint Checkpoint::open_set(const std::vector<std::string>& paths,
                                const OpenOptions& options) {
  if (paths.size() == 1) return open(paths[0], options);
  return internal::open_files(paths, options);
}

const std::vector<Checkpoint>& Checkpoint::shards() const {
  static const std::vector<Checkpoint> none;
  return impl_->set ? impl_->set->shards : none;
}

size_t Checkpoint::shard_of(size_t tensor) const {
  if (!impl_->set) return 0;
  if (tensor >= impl_->set->tensor_shard.size())
    throw Error(ErrorCode::kNotFound, "no tensor #" + std::to_string(tensor),
                impl_->model->source->name());
  return impl_->set->tensor_shard[tensor];
}

Format Checkpoint::format() const { return impl_->model->format; }
const std::map<std::string, std::string>& Checkpoint::properties() const {
  return impl_->model->properties;
}
const std::vector<TensorInfo>& Checkpoint::tensors() const { return impl_->model->tensors; }
const std::vector<StorageInfo>& Checkpoint::storages() const { return impl_->model->storages; }
const std::vector<RecordInfo>& Checkpoint::records() const { return impl_->model->records(); }
const ConstValuePtr& Checkpoint::root() const { return impl_->root; }
const ByteSource& Checkpoint::source() const { return *impl_->model->source; }
SourcePtr Checkpoint::source_ptr() const { return impl_->model->source; }
std::optional<size_t> Checkpoint::find(std::string_view name) const {
  return impl_->model->find(name);
}

StoragePtr Checkpoint::storage(size_t index, const LoadOptions& options) const {
  const Impl& c = *impl_;
  const CheckpointModel& m = *c.model;
  if (index >= m.storages.size())
    throw Error(ErrorCode::kInvalidArgument, "no storage #" + std::to_string(index),
                m.source->name());
  if (options.device.is_cpu()) {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cache.empty()) c.cache.resize(m.storages.size());
    if (auto st = c.cache[index].lock()) return st;
  }
  if (c.set) {
    // The shard shares its loaded storages; one more cache here keeps the rule for the set.
    StoragePtr st = c.set->shards[c.set->storage_shard[index]].storage(
        c.set->local_storage(index), options);
    if (!options.device.is_cpu()) return st;
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto other = c.cache[index].lock()) return other;
    c.cache[index] = st;
    return st;
  }
  if (!options.device.is_cpu()) {
    // Not cached: the cache holds host storages (loaded the default way).
    internal::LoadPlan plan = internal::plan_storage(m, c.copy, index, options, false);
    return internal::execute_device(plan, internal::engine_for(options.device),
                                     options.staging_bytes)[index];
  }
  internal::LoadPlan plan = internal::plan_storage(m, c.copy, index, options, true);
  StoragePtr st = internal::load_one(plan, plan.storages[0]);
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto other = c.cache[index].lock()) return other;
  c.cache[index] = st;
  return st;
}

const std::byte* Checkpoint::view(size_t index) const {
  const CheckpointModel& m = *impl_->model;
  if (index >= m.storages.size())
    throw Error(ErrorCode::kInvalidArgument, "no storage #" + std::to_string(index),
                m.source->name());
  if (impl_->set) return nullptr;
  if (internal::route_of(m, index, LoadOptions{}, true) != internal::Route::kView) return nullptr;
  return m.source->memory() + m.storages[index].offset;
}

Tensor Checkpoint::tensor(size_t index, const LoadOptions& options) const {
  const CheckpointModel& m = *impl_->model;
  if (index >= m.tensors.size())
    throw Error(ErrorCode::kNotFound, "no tensor #" + std::to_string(index), m.source->name());
  const TensorInfo& t = m.tensors[index];
  return Tensor(t, storage(t.storage, options));
}

Tensor Checkpoint::tensor(std::string_view name, const LoadOptions& options) const {
  auto i = find(name);
  if (!i)
    throw Error(ErrorCode::kNotFound, "no tensor named '" + std::string(name) + "'",
                impl_->model->source->name());
  return tensor(*i, options);
}

std::vector<Tensor> Checkpoint::load_all(const LoadOptions& options,
                                         const TensorFilter& filter) const {
  if (const ShardSet* set = impl_->set.get()) {
    const CheckpointModel& m = *impl_->model;
    const std::vector<uint8_t> sel = select(m, filter);
    std::vector<Tensor> out;
    for_each_selected_shard(m, *set, sel, options, [&](size_t k, const LoadOptions& shard_opt) {
      const Checkpoint& shard = set->shards[k];
      LoadOptions o = shard_opt;
      o.on_placed = nullptr;  // one file's hook; a set's tensors are placed shard by shard
      std::vector<Tensor> part = shard.load_all(o, shard_filter(shard, *set, k, sel));
      // The plan keeps table order: the selected tensors of this shard, in order.
      size_t i = set->tensor_base[k];
      for (Tensor& t : part) {
        while (!sel[i]) ++i;
        out.emplace_back(m.tensors[i++], t.storage());
      }
    });
    return out;
  }
  internal::LoadPlan plan = internal::make_plan(*impl_->model, impl_->copy, options, filter, false);
  if (!options.device.is_cpu()) {
    std::vector<Tensor> out = internal::plan_tensors(
        plan, internal::execute_device(plan, internal::engine_for(options.device),
                                       options.staging_bytes));
    if (options.on_placed) options.on_placed(*this, out);  // the bytes are there already
    return out;
  }
  internal::PlacedFn placed;
  if (options.on_placed)
    placed = [&](const std::vector<Tensor>& tensors) { options.on_placed(*this, tensors); };
  return internal::execute_eager(plan, {}, {}, placed);
}

void Checkpoint::stream(uint64_t budget, const std::function<void(const Tensor&)>& fn,
                        const LoadOptions& options, const TensorFilter& filter) const {
  if (!options.device.is_cpu())
    throw Error(ErrorCode::kUnsupported,
                "stream() hands tensors in host memory; load into " + options.device.str() +
                    " with load_all()",
                impl_->model->source->name());
  if (const ShardSet* set = impl_->set.get()) {
    const CheckpointModel& m = *impl_->model;
    const std::vector<uint8_t> sel = select(m, filter);
    for_each_selected_shard(m, *set, sel, options, [&](size_t k, const LoadOptions& o) {
      const Checkpoint& shard = set->shards[k];
      const size_t base = set->tensor_base[k];
      // Each tensor under its merged description (the same name; the set's storage index).
      shard.stream(
          budget,
          [&](const Tensor& t) {
            const size_t local = shard.find(t.name()).value_or(0);
            fn(Tensor(m.tensors[base + local], t.storage()));
          },
          o, shard_filter(shard, *set, k, sel));
    });
    return;
  }
  internal::LoadPlan plan = internal::make_plan(*impl_->model, impl_->copy, options, filter, false);
  internal::execute_stream(plan, budget, fn);
}

void Checkpoint::read_into(size_t index, std::span<std::byte> dst,
                           const LoadOptions& options) const {
  const Impl& c = *impl_;
  const CheckpointModel& m = *c.model;
  if (!options.device.is_cpu())
    throw Error(ErrorCode::kUnsupported, "read_into() fills host memory; load into " +
                                             options.device.str() + " with load_all()",
                m.source->name());
  if (index >= m.tensors.size())
    throw Error(ErrorCode::kNotFound, "no tensor #" + std::to_string(index), m.source->name());
  const TensorInfo& t = m.tensors[index];
  if (c.set) {
    c.set->shards[c.set->tensor_shard[index]].read_into(c.set->local_tensor(index), dst, options);
    return;
  }
  if (dst.size() != t.nbytes())
    throw Error(ErrorCode::kInvalidArgument,
                "destination holds " + std::to_string(dst.size()) + " bytes; the tensor needs " +
                    std::to_string(t.nbytes()),
                m.source->name(), t.name);
  const StorageInfo& si = m.storages[t.storage];
  internal::LoadPlan plan = internal::plan_storage(m, c.copy, t.storage, options, false);
  const internal::PlannedStorage& p = plan.storages[0];
  const bool whole = t.byte_offset() == 0 && t.nbytes() == si.nbytes;
  if (t.is_contiguous() && whole) {
    internal::load_into(plan, p, dst.data());  // one read straight into dst
    return;
  }
  if (t.is_contiguous() && p.route == internal::Route::kRead && !p.byteswap && !p.check_crc) {
    c.copy->read_into(si.offset + t.byte_offset(), dst);  // just the view's bytes
    return;
  }
  // Views of part of a storage with verification, non-contiguous views, decoded storages.
  Tensor full = tensor(index, options);
  auto bytes = full.contiguous_bytes();
  std::memcpy(dst.data(), bytes.data(), bytes.size());
}

void Checkpoint::prefetch(std::span<const size_t> tensors, bool populate) const {
  if (const ShardSet* set = impl_->set.get()) {
    std::vector<std::vector<size_t>> per(set->shards.size());
    for (size_t i : tensors)
      if (i < set->tensor_shard.size()) per[set->tensor_shard[i]].push_back(set->local_tensor(i));
    for (size_t k = 0; k < set->shards.size(); ++k)
      if (tensors.empty() || !per[k].empty()) set->shards[k].prefetch(per[k], populate);
    return;
  }
  const CheckpointModel& d = *impl_->model;
  const std::byte* base = d.source->memory();
  if (!base) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto advise = [&](const StorageInfo& si) {
    if (si.meta || si.offset == kNoOffset || si.nbytes == 0) return;
    auto start = reinterpret_cast<uintptr_t>(base + si.offset) & ~(page - 1);
    auto end = reinterpret_cast<uintptr_t>(base + si.offset + si.nbytes);
    ::madvise(reinterpret_cast<void*>(start), end - start, MADV_WILLNEED);
#ifdef MADV_POPULATE_READ
    if (populate) ::madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_READ);
#else
    if (populate) {
      volatile std::byte sink{};
      for (uintptr_t p = start; p < end; p += page) sink = *reinterpret_cast<const std::byte*>(p);
      (void)sink;
    }
#endif
  };
  if (tensors.empty()) {
    for (const auto& si : d.storages) advise(si);
  } else {
    for (size_t i : tensors)
      if (i < d.tensors.size()) advise(d.storages[d.tensors[i].storage]);
  }
}

size_t Checkpoint::verify(const ProgressFn& progress) const {
  if (const ShardSet* set = impl_->set.get()) {
    // Each shard as its own file; what is left to check is estimated by the storage bytes of
    // the shards after this one.
    std::vector<uint64_t> bytes(set->shards.size(), 0);
    for (size_t k = 0; k < set->shards.size(); ++k)
      for (const StorageInfo& s : set->shards[k].storages()) bytes[k] += s.nbytes;
    SetProgress p{progress, 0, 0};
    size_t checked = 0;
    for (size_t k = 0; k < set->shards.size(); ++k) {
      uint64_t later = 0;
      for (size_t j = k + 1; j < bytes.size(); ++j) later += bytes[j];
      uint64_t shard_total = 0;
      ProgressFn inner = p.shard(later);
      ProgressFn fn;
      if (inner)
        fn = [&](uint64_t done, uint64_t of) {
          shard_total = of;
          inner(done, of);
        };
      checked += set->shards[k].verify(fn);
      p.base += shard_total;
      p.total = p.base + later;
    }
    if (progress) progress(p.base, p.base);
    return checked;
  }
  const CheckpointModel& m = *impl_->model;
  if (m.verify) {
    try {
      return m.verify(progress);
    } catch (const Error& e) {
      // A format's own verify names the bad record; add the tensors that use it.
      if (e.code() != ErrorCode::kCorrupt || e.record().empty() ||
          e.message().find("(tensors: ") != std::string::npos)
        throw;
      std::string names;
      for (size_t s = 0; s < m.storages.size(); ++s) {
        if (m.storages[s].record != e.record()) continue;
        for (const auto& t : m.tensors)
          if (t.storage == s) names += (names.empty() ? "" : ", ") + t.name;
      }
      if (names.empty()) throw;
      Error named(e.code(), e.message() + " (tensors: " + names + ")", e.source(), e.record(),
                  e.offset());
      for (const auto& what : e.context()) named.add_context(what);
      throw named;
    }
  }
  auto checkable = [&m](const StorageInfo& s) { return s.crc32 && !s.meta; };
  uint64_t total = 0;
  if (progress)
    for (const StorageInfo& s : m.storages)
      if (checkable(s)) total += s.nbytes;
  internal::ProgressMeter meter(progress, total);
  size_t checked = 0;
  LoadOptions o;
  o.verify = true;
  for (size_t i = 0; i < m.storages.size(); ++i) {
    const StorageInfo& s = m.storages[i];
    if (!checkable(s)) continue;
    (void)storage(i, o);
    meter.add(s.nbytes);
    ++checked;
  }
  meter.finish();
  return checked;
}

}  // namespace ckpt
