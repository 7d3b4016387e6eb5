// A set of files that are checkpoints of their own (Hugging Face shards), opened as one by
// api/checkpoint_set.cc. The merged model serves the metadata; every load is handed to the part
// (an ordinary Checkpoint) that holds the bytes, part after part, so each keeps its own fast
// paths (its mapping, CRCs, decoders) and a single file's load path knows nothing of sets.
// Progress over the parts is counted by FileProgress (api/checkpoint_kind.h).

#include <algorithm>

#include "api/checkpoint_impl.h"
#include "api/checkpoint_kind.h"

namespace ckpt::internal {
namespace {

class SetKind final : public CheckpointKind {
 public:
  SetKind(std::shared_ptr<const CheckpointModel> merged, FileSet set)
      : CheckpointKind(std::move(merged)), set_(std::move(set)) {}

  const std::vector<std::string>& files() const override { return set_.paths; }
  std::span<const uint32_t> files_of(size_t t) const override { return {&set_.tensor_part[t], 1}; }
  const std::vector<Checkpoint>& parts() const override { return set_.parts; }

  StoragePtr load_storage(size_t s, const LoadOptions& options) const override {
    // The part shares its loaded storages too.
    return part_of_storage(s).storage(set_.local_storage(s), options);
  }
  const std::byte* view(size_t s) const override {
    return part_of_storage(s).view(set_.local_storage(s));
  }
  std::shared_ptr<const void> view_owner(size_t s) const override {
    return part_of_storage(s).view_owner(set_.local_storage(s));
  }
  void read_into(size_t t, std::span<std::byte> dst, const LoadOptions& options) const override {
    set_.parts[set_.tensor_part[t]].read_into(set_.local_tensor(t), dst, options);
  }
  void prefetch(std::span<const size_t> tensors, bool populate) const override;
  std::vector<Tensor> load(const LoadOptions& options, const TensorFilter& filter,
                           const PlacedFn& placed) const override;
  void stream(uint64_t budget, const std::function<void(const Tensor&)>& fn,
              const LoadOptions& options, const TensorFilter& filter) const override;
  void stream_storages(uint64_t budget, std::span<const uint32_t> order, const StorageFn& fn,
                       const LoadOptions& options) const override {
    // Each run of storages of one part, by that part.
    std::vector<uint32_t> local;
    for (size_t begin = 0, end; begin < order.size(); begin = end) {
      const uint32_t part = set_.storage_part[order[begin]];
      local.clear();
      for (end = begin; end < order.size() && set_.storage_part[order[end]] == part; ++end)
        local.push_back(static_cast<uint32_t>(set_.local_storage(order[end])));
      CheckpointAccess::kind(set_.parts[part])
          .stream_storages(
              budget, local, [&](size_t k, const StoragePtr& st) { fn(begin + k, st); }, options);
    }
  }
  size_t verify(const ProgressFn& progress) const override;

 private:
  const Checkpoint& part_of_storage(size_t s) const { return set_.parts[set_.storage_part[s]]; }

  // For each part with a selected tensor, in order: fn(k, options for part k, filter for part
  // k's own table), with the part's progress counted into the whole selection's.
  void for_each_selected_part(
      const std::vector<uint8_t>& sel, const LoadOptions& options,
      const std::function<void(size_t, const LoadOptions&, const TensorFilter&)>& fn) const;

  FileSet set_;
};

void SetKind::for_each_selected_part(
    const std::vector<uint8_t>& sel, const LoadOptions& options,
    const std::function<void(size_t, const LoadOptions&, const TensorFilter&)>& fn) const {
  const CheckpointModel& m = model();
  // Bytes of the storages the selected tensors use, per part: what each part's load counts.
  std::vector<uint64_t> bytes(set_.parts.size(), 0);
  std::vector<uint8_t> counted(m.storages.size(), 0);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const uint32_t s = m.tensors[i].storage;
    if (!sel[i] || counted[s]) continue;
    counted[s] = 1;
    bytes[set_.storage_part[s]] += m.storages[s].nbytes;
  }
  FileProgress progress(options.progress, bytes);
  for (size_t k = 0; k < set_.parts.size(); ++k) {
    const size_t base = set_.tensor_base[k];
    const size_t n = set_.parts[k].tensors().size();
    if (std::none_of(sel.begin() + base, sel.begin() + base + n, [](uint8_t b) { return b; }))
      continue;
    LoadOptions o = options;
    o.on_placed = nullptr;  // the set's hook is the set's to call
    o.progress = progress.part(k);
    // The load plan calls the filter with references into the part's own tensors().
    const TensorInfo* first = set_.parts[k].tensors().data();
    TensorFilter part_filter = [first, n, base, &sel](const TensorInfo& t) {
      const size_t i = static_cast<size_t>(&t - first);
      return i < n && sel[base + i] != 0;
    };
    fn(k, o, part_filter);
    progress.end(k);
  }
  progress.finish();
}

std::vector<Tensor> SetKind::load(const LoadOptions& options, const TensorFilter& filter,
                                  const PlacedFn& placed) const {
  const CheckpointModel& m = model();
  const std::vector<uint8_t> sel = select_tensors(m, filter);
  size_t last = set_.parts.size();  // the last part with a selected tensor
  for (size_t i = 0; i < m.tensors.size(); ++i)
    if (sel[i]) last = set_.tensor_part[i];
  std::vector<Tensor> out;
  bool called = false;
  for_each_selected_part(
      sel, options, [&](size_t k, const LoadOptions& o, const TensorFilter& part_filter) {
        const size_t first_out = out.size();
        // The part's tensors under their merged descriptions (same storages, the set's indices).
        // The plan keeps table order: the selected tensors of this part, in order.
        auto merge = [&](const std::vector<Tensor>& part) {
          out.resize(first_out);
          size_t i = set_.tensor_base[k];
          for (const Tensor& t : part) {
            while (!sel[i]) ++i;
            out.emplace_back(m.tensors[i++], t.storage());
          }
        };
        LoadOptions po = o;
        if (placed && k == last)
          // The earlier parts are loaded; this one's addresses are fixed while its readers run:
          // every tensor of the load has its final address now.
          po.on_placed = [&](const Checkpoint&, const std::vector<Tensor>& part) {
            merge(part);
            called = true;
            placed(out);
          };
        std::vector<Tensor> part = set_.parts[k].load_all(po, part_filter);
        merge(part);
      });
  if (placed && !called) placed(out);  // nothing selected
  return out;
}

void SetKind::stream(uint64_t budget, const std::function<void(const Tensor&)>& fn,
                     const LoadOptions& options, const TensorFilter& filter) const {
  const CheckpointModel& m = model();
  const std::vector<uint8_t> sel = select_tensors(m, filter);
  auto stream_part = [&](size_t k, const LoadOptions& o, const TensorFilter& part_filter) {
    const Checkpoint& part = set_.parts[k];
    const size_t base = set_.tensor_base[k];
    // Each tensor under its merged description (the same name; the set's storage index).
    auto merged = [&](const Tensor& t) {
      const size_t local = part.find(t.name()).value_or(0);
      fn(Tensor(m.tensors[base + local], t.storage()));
    };
    part.stream(budget, merged, o, part_filter);
  };
  for_each_selected_part(sel, options, stream_part);
}

void SetKind::prefetch(std::span<const size_t> tensors, bool populate) const {
  std::vector<std::vector<size_t>> per(set_.parts.size());
  for (size_t i : tensors)
    if (i < set_.tensor_part.size()) per[set_.tensor_part[i]].push_back(set_.local_tensor(i));
  for (size_t k = 0; k < set_.parts.size(); ++k)
    if (tensors.empty() || !per[k].empty()) set_.parts[k].prefetch(per[k], populate);
}

size_t SetKind::verify(const ProgressFn& progress) const {
  // Each part as its own file; until a part reports its own total, the storage bytes of the
  // parts estimate what is left.
  std::vector<uint64_t> bytes(set_.parts.size(), 0);
  for (size_t k = 0; k < set_.parts.size(); ++k)
    for (const StorageInfo& s : set_.parts[k].storages()) bytes[k] += s.nbytes;
  FileProgress p(progress, std::move(bytes));
  size_t checked = 0;
  for (size_t k = 0; k < set_.parts.size(); ++k) {
    checked += set_.parts[k].verify(p.part(k));
    p.end(k);
  }
  p.finish();
  return checked;
}

}  // namespace

KindPtr set_kind(std::shared_ptr<const CheckpointModel> merged, FileSet set) {
  return std::make_shared<const SetKind>(std::move(merged), std::move(set));
}

}  // namespace ckpt::internal
