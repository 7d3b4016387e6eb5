// Checkpoint: the public handle over the body of one kind of checkpoint (api/checkpoint_kind.h).
// The opener (api/opener.h) chooses the kind; every other method checks its arguments, keeps the
// storage cache every kind shares, and hands its work to the body.

#include "ckpt/checkpoint.h"

#include <new>

#include "api/checkpoint_impl.h"
#include "api/opener.h"

namespace ckpt {

using internal::CheckpointModel;

Checkpoint::Checkpoint(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Checkpoint Checkpoint::open(const std::string& path, const OpenOptions& options) {
  return internal::open_path(path, options);
}

Checkpoint Checkpoint::open(SourcePtr source, const OpenOptions& options) {
  return internal::open_file(source, options);
}

Checkpoint Checkpoint::open_set(const std::vector<std::string>& paths, const OpenOptions& options) {
  return internal::open_paths(paths, options);
}

namespace {

void check_tensor(const CheckpointModel& m, size_t index) {
  if (index >= m.tensors.size())
    throw Error(ErrorCode::kNotFound, "no tensor #" + std::to_string(index), m.source->name());
}

void check_storage(const CheckpointModel& m, size_t index) {
  if (index >= m.storages.size())
    throw Error(ErrorCode::kInvalidArgument, "no storage #" + std::to_string(index),
                m.source->name());
}

// Memory running out while loading (a tensor larger than the machine can give, a cap on the
// address space): a typed error that names the checkpoint, not std::bad_alloc.
template <typename F>
auto naming_oom(const CheckpointModel& m, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kLimitExceeded, "out of memory loading the checkpoint's tensors",
                m.source->name());
  }
}

}  // namespace

const std::vector<std::string>& Checkpoint::files() const { return impl_->kind->files(); }

std::span<const uint32_t> Checkpoint::files_of(size_t tensor) const {
  check_tensor(impl_->kind->model(), tensor);
  return impl_->kind->files_of(tensor);
}

// The files API's views for a set: its parts, and a tensor's first file.
const std::vector<Checkpoint>& Checkpoint::shards() const { return impl_->kind->parts(); }

size_t Checkpoint::shard_of(size_t tensor) const { return files_of(tensor)[0]; }

Format Checkpoint::format() const { return impl_->kind->model().format; }
const std::map<std::string, std::string>& Checkpoint::properties() const {
  return impl_->kind->model().properties;
}
const std::vector<TensorInfo>& Checkpoint::tensors() const { return impl_->kind->model().tensors; }
const std::vector<StorageInfo>& Checkpoint::storages() const {
  return impl_->kind->model().storages;
}
const std::vector<RecordInfo>& Checkpoint::records() const {
  return impl_->kind->model().records();
}
const ConstValuePtr& Checkpoint::root() const { return impl_->root; }
const ByteSource& Checkpoint::source() const { return *impl_->kind->model().source; }
SourcePtr Checkpoint::source_ptr() const { return impl_->kind->model().source; }
std::optional<size_t> Checkpoint::find(std::string_view name) const {
  return impl_->kind->model().find(name);
}

StoragePtr Checkpoint::storage(size_t index, const LoadOptions& options) const {
  const Impl& c = *impl_;
  check_storage(c.kind->model(), index);
  // A device storage is not cached: the cache holds host storages (loaded the default way).
  if (!options.device.is_cpu())
    return naming_oom(c.kind->model(), [&] { return c.kind->load_storage(index, options); });
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cache.empty()) c.cache.resize(c.kind->model().storages.size());
    if (auto st = c.cache[index].lock()) return st;
  }
  StoragePtr st = naming_oom(c.kind->model(), [&] { return c.kind->load_storage(index, options); });
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto other = c.cache[index].lock()) return other;
  c.cache[index] = st;
  return st;
}

const std::byte* Checkpoint::view(size_t index) const {
  check_storage(impl_->kind->model(), index);
  return impl_->kind->view(index);
}

std::shared_ptr<const void> Checkpoint::view_owner(size_t index) const {
  check_storage(impl_->kind->model(), index);
  return impl_->kind->view_owner(index);
}

Tensor Checkpoint::tensor(size_t index, const LoadOptions& options) const {
  const CheckpointModel& m = impl_->kind->model();
  check_tensor(m, index);
  const TensorInfo& t = m.tensors[index];
  return Tensor(t, storage(t.storage, options));
}

Tensor Checkpoint::tensor(std::string_view name, const LoadOptions& options) const {
  auto i = find(name);
  if (!i)
    throw Error(ErrorCode::kNotFound, "no tensor named '" + std::string(name) + "'",
                impl_->kind->model().source->name());
  return tensor(*i, options);
}

std::vector<Tensor> Checkpoint::load_all(const LoadOptions& options,
                                         const TensorFilter& filter) const {
  internal::PlacedFn placed;
  if (options.on_placed)
    placed = [&](const std::vector<Tensor>& tensors) { options.on_placed(*this, tensors); };
  return naming_oom(impl_->kind->model(),
                    [&] { return impl_->kind->load(options, filter, placed); });
}

void Checkpoint::stream(uint64_t budget, const std::function<void(const Tensor&)>& fn,
                        const LoadOptions& options, const TensorFilter& filter) const {
  if (!options.device.is_cpu())
    throw Error(ErrorCode::kUnsupported,
                "stream() hands tensors in host memory; load into " + options.device.str() +
                    " with load_all()",
                impl_->kind->model().source->name());
  naming_oom(impl_->kind->model(), [&] { impl_->kind->stream(budget, fn, options, filter); });
}

void Checkpoint::read_into(size_t index, std::span<std::byte> dst,
                           const LoadOptions& options) const {
  check_tensor(impl_->kind->model(), index);
  if (!options.device.is_cpu())
    throw Error(
        ErrorCode::kUnsupported,
        "read_into() fills host memory; load into " + options.device.str() + " with load_all()",
        impl_->kind->model().source->name());
  naming_oom(impl_->kind->model(), [&] { impl_->kind->read_into(index, dst, options); });
}

void Checkpoint::prefetch(std::span<const size_t> tensors, bool populate) const {
  impl_->kind->prefetch(tensors, populate);
}

size_t Checkpoint::verify(const ProgressFn& progress) const {
  return naming_oom(impl_->kind->model(), [&] { return impl_->kind->verify(progress); });
}

}  // namespace ckpt
