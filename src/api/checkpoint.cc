// Checkpoint: the public handle over an opened model. Opening detects the format
// (formats/open.h); every load builds a LoadPlan (load/plan.h) and runs one of its executors.

#include "ckpt/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "api/checkpoint_impl.h"
#include "formats/open.h"
#include "load/plan.h"
#include "util/crc32.h"

namespace ckpt {

using internal::CheckpointModel;

Checkpoint::Impl::Impl(std::shared_ptr<const CheckpointModel> m)
    : model(std::move(m)), root(model->root) {
  copy = model->source->pread_twin();
  if (!copy) copy = model->source;
}

Checkpoint::Checkpoint(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Checkpoint Checkpoint::open(const std::string& path, const OpenOptions& options) {
  return open(options.mmap ? open_mmap_source(path) : open_file_source(path), options);
}

Checkpoint Checkpoint::open(SourcePtr source, const OpenOptions& options) {
  return internal::CheckpointAccess::make(internal::open_model(std::move(source), options));
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
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cache.empty()) c.cache.resize(m.storages.size());
    if (auto st = c.cache[index].lock()) return st;
  }
  internal::LoadPlan plan = internal::plan_storage(m, c.copy, index, options, true);
  StoragePtr st = internal::load_one(plan, plan.storages[0]);
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto other = c.cache[index].lock()) return other;
  c.cache[index] = st;
  return st;
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
  internal::LoadPlan plan = internal::make_plan(*impl_->model, impl_->copy, options, filter, false);
  return internal::execute_eager(plan);
}

void Checkpoint::stream(uint64_t budget, const std::function<void(const Tensor&)>& fn,
                        const LoadOptions& options, const TensorFilter& filter) const {
  internal::LoadPlan plan = internal::make_plan(*impl_->model, impl_->copy, options, filter, false);
  internal::execute_stream(plan, budget, fn);
}

void Checkpoint::read_into(size_t index, std::span<std::byte> dst,
                           const LoadOptions& options) const {
  const Impl& c = *impl_;
  const CheckpointModel& m = *c.model;
  if (index >= m.tensors.size())
    throw Error(ErrorCode::kNotFound, "no tensor #" + std::to_string(index), m.source->name());
  const TensorInfo& t = m.tensors[index];
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
