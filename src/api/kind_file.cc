// One model over its own files: the model one format reader produced (a single file, or a folder
// whose storages the format's decoder assembles from its data files), loaded through the load
// plan (load/plan.h). Every load builds a plan over the model and runs one of its executors.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "api/checkpoint_kind.h"
#include "load/device_load.h"
#include "load/plan.h"
#include "util/bytes.h"
#include "util/progress.h"

namespace ckpt::internal {
namespace {

class FileKind final : public CheckpointKind {
 public:
  explicit FileKind(std::shared_ptr<const CheckpointModel> m) : CheckpointKind(std::move(m)) {
    files_ =
        model().files.empty() ? std::vector<std::string>{model().source->name()} : model().files;
    copy_ = model().source->pread_twin();
    if (!copy_) copy_ = model().source;
  }

  const std::vector<std::string>& files() const override { return files_; }
  std::span<const uint32_t> files_of(size_t t) const override {
    if (model().tensor_files.empty()) return {&kFirst, 1};
    return model().tensor_files[t];
  }
  SourcePtr file_copy() const override { return copy_; }

  StoragePtr load_storage(size_t s, const LoadOptions& options) const override {
    if (!options.device.is_cpu()) {
      LoadPlan plan = plan_storage(model(), copy_, s, options, false);
      return execute_device(plan, options.device, options)[s];
    }
    LoadPlan plan = plan_storage(model(), copy_, s, options, true);
    return load_one(plan, plan.storages[0]);
  }

  const std::byte* view(size_t s) const override {
    const CheckpointModel& m = model();
    if (route_of(m, s, LoadOptions{}, true) != Route::kView) return nullptr;
    return m.source->memory() + m.storages[s].offset;
  }

  std::shared_ptr<const void> view_owner(size_t s) const override {
    return view(s) ? model().source->memory_owner() : nullptr;
  }

  void read_into(size_t index, std::span<std::byte> dst, const LoadOptions& options) const override;
  // A decoder that reads a box by itself (the chunks of a folder that meet it) does; else the
  // tensor is loaded and the box copied out.
  void read_slice(size_t t, std::span<const int64_t> begin, std::span<const int64_t> end,
                  std::span<std::byte> dst, const LoadOptions& options) const override {
    const CheckpointModel& m = model();
    const size_t s = m.tensors[t].storage;
    if (m.kind(s) == StorageKind::kDecoded && m.decoder->read_box(s, m.tensors[t], begin, end, dst))
      return;
    CheckpointKind::read_slice(t, begin, end, dst, options);
  }
  void prefetch(std::span<const size_t> tensors, bool populate) const override;

  std::vector<Tensor> load(const LoadOptions& options, const TensorFilter& filter,
                           const PlacedFn& placed) const override {
    LoadPlan plan = make_plan(model(), copy_, options, filter, false);
    if (!options.device.is_cpu()) {
      std::vector<Tensor> out = plan_tensors(plan, execute_device(plan, options.device, options));
      if (placed) placed(out);  // the bytes are there already: a later call keeps the contract
      return out;
    }
    return execute_eager(plan, {}, {}, placed);
  }

  void stream(uint64_t budget, const std::function<void(const Tensor&)>& fn,
              const LoadOptions& options, const TensorFilter& filter) const override {
    LoadPlan plan = make_plan(model(), copy_, options, filter, false);
    execute_stream(plan, budget, fn);
  }

  void stream_storages(uint64_t budget, std::span<const uint32_t> order, const StorageFn& fn,
                       const LoadOptions& options) const override {
    const CheckpointModel& m = model();
    if (m.source->memory() && !options.copy) {
      // Mapped: views, nothing to read ahead.
      for (size_t k = 0; k < order.size(); ++k) fn(k, load_storage(order[k], options));
      return;
    }
    std::vector<uint8_t> wanted(m.storages.size(), 0);
    for (uint32_t s : order) wanted.at(s) = 1;
    LoadPlan plan = make_plan(
        m, copy_, options, [&](const TensorInfo& t) { return wanted[t.storage] != 0; }, false);
    std::vector<uint32_t> at(m.storages.size(), 0);  // storage -> its place in plan.storages
    for (size_t k = 0; k < plan.storages.size(); ++k) at[plan.storages[k].storage] = k;
    std::vector<uint32_t> planned(order.size());
    uint64_t largest = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      planned[k] = at[order[k]];
      largest = std::max(largest, m.storages[order[k]].nbytes);
    }
    execute_stream_order(plan, std::max(budget, align_up(largest, kStorageAlign)), planned, fn);
  }

  size_t verify(const ProgressFn& progress) const override;

 private:
  static constexpr uint32_t kFirst = 0;
  std::vector<std::string> files_;
  // The source to copy bytes from: a pread source over the same open file when the source is a
  // mapping of a file (copying out of the mapping would make the file's pages resident beside
  // the copy, doubling the memory an eager or streaming load holds), else the source.
  SourcePtr copy_;
};

void FileKind::read_into(size_t index, std::span<std::byte> dst, const LoadOptions& options) const {
  const CheckpointModel& m = model();
  const TensorInfo& t = m.tensors[index];
  if (dst.size() != t.nbytes())
    throw Error(ErrorCode::kInvalidArgument,
                "destination holds " + std::to_string(dst.size()) + " bytes; the tensor needs " +
                    std::to_string(t.nbytes()),
                m.source->name(), t.name);
  const StorageInfo& si = m.storages[t.storage];
  LoadPlan plan = plan_storage(m, copy_, t.storage, options, false);
  const PlannedStorage& p = plan.storages[0];
  const bool whole = t.byte_offset() == 0 && t.nbytes() == si.nbytes;
  if (t.is_contiguous() && whole) {
    load_into(plan, p, dst.data());  // one read straight into dst
    return;
  }
  if (t.is_contiguous() && p.route == Route::kRead && !p.byteswap && !p.check_crc) {
    copy_->read_into(si.offset + t.byte_offset(), dst);  // just the view's bytes
    return;
  }
  // Views of part of a storage with verification, non-contiguous views, decoded storages.
  Tensor full(t, load_storage(t.storage, options));
  auto bytes = full.contiguous_bytes();
  std::memcpy(dst.data(), bytes.data(), bytes.size());
}

void FileKind::prefetch(std::span<const size_t> tensors, bool populate) const {
  const CheckpointModel& d = model();
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

size_t FileKind::verify(const ProgressFn& progress) const {
  const CheckpointModel& m = model();
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
  ProgressMeter meter(progress, total);
  size_t checked = 0;
  LoadOptions o;
  o.verify = true;
  for (size_t i = 0; i < m.storages.size(); ++i) {
    const StorageInfo& s = m.storages[i];
    if (!checkable(s)) continue;
    (void)load_storage(i, o);
    meter.add(s.nbytes);
    ++checked;
  }
  meter.finish();
  return checked;
}

}  // namespace

KindPtr file_kind(std::shared_ptr<const CheckpointModel> model) {
  return std::make_shared<const FileKind>(std::move(model));
}

}  // namespace ckpt::internal
