// CheckpointModel: validation of what a format reader produced, the lazily built record table,
// and the CRC32 mismatch error naming a storage's tensors.

#include "model/checkpoint_model.h"

#include <unordered_set>

#include "util/bytes.h"
#include "util/crc32.h"

namespace ckpt::internal {

const std::vector<RecordInfo>& CheckpointModel::records() const {
  if (make_records) std::call_once(records_once_, [this] { make_records(records_); });
  return records_;
}

void CheckpointModel::finalize() {
  const std::string& src = source->name();
  const Limits& lim = options.limits;
  if (tensors.size() > lim.max_tensors)
    throw Error(ErrorCode::kLimitExceeded,
                std::to_string(tensors.size()) + " tensors; Limits::max_tensors is " +
                    std::to_string(lim.max_tensors),
                src);
  for (const StorageInfo& s : storages) {
    if (s.meta || s.offset == kNoOffset) continue;
    auto end = checked_add(s.offset, s.nbytes);
    if (!end || *end > source->size())
      throw Error(ErrorCode::kTruncated,
                  "storage of " + std::to_string(s.nbytes) + " bytes passes the end of the file",
                  src, s.record.empty() ? s.key : s.record, s.offset);
  }
  by_name_.reset(tensors.size());
  const auto name_of = [this](size_t i) -> const std::string& { return tensors[i].name; };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    auto bad = [&](ErrorCode c, const std::string& m) { throw Error(c, m, src, t.name); };
    if (t.storage >= storages.size()) bad(ErrorCode::kCorrupt, "tensor refers to no storage");
    if (t.shape.size() > lim.max_dims)
      bad(ErrorCode::kLimitExceeded, std::to_string(t.shape.size()) +
                                         " dimensions; Limits::max_dims is " +
                                         std::to_string(lim.max_dims));
    if (t.strides.size() != t.shape.size())
      bad(ErrorCode::kCorrupt, "stride and shape have different lengths");
    uint64_t numel = 1, last = 0;
    bool empty = false;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] < 0 || t.strides[d] < 0) bad(ErrorCode::kCorrupt, "negative size or stride");
      if (t.shape[d] == 0) empty = true;
      auto n = checked_mul(numel, static_cast<uint64_t>(t.shape[d]));
      if (!n) bad(ErrorCode::kCorrupt, "element count overflows");
      numel = *n;
      if (t.shape[d] > 0) {
        auto step =
            checked_mul(static_cast<uint64_t>(t.shape[d] - 1), static_cast<uint64_t>(t.strides[d]));
        auto sum = step ? checked_add(last, *step) : std::nullopt;
        if (!sum) bad(ErrorCode::kCorrupt, "view extent overflows");
        last = *sum;
      }
    }
    if (t.storage_offset < 0) bad(ErrorCode::kCorrupt, "negative storage offset");
    const StorageInfo& st = storages[t.storage];
    if (!empty) {
      // The view's last element must lie inside the storage.
      auto end_elem = checked_add(static_cast<uint64_t>(t.storage_offset), last);
      auto end_elem1 = end_elem ? checked_add(*end_elem, 1) : std::nullopt;
      auto end_bytes = end_elem1 ? dtype_nbytes(t.dtype, *end_elem1) : std::nullopt;
      if (!end_bytes || *end_bytes > st.nbytes)
        bad(ErrorCode::kCorrupt, "view reaches byte " +
                                     (end_bytes ? std::to_string(*end_bytes) : std::string("?")) +
                                     " of a storage of " + std::to_string(st.nbytes) + " bytes");
    }
    by_name_.insert(t.name, i, name_of);  // a repeated name keeps its first tensor
  }
}

void CheckpointModel::index_names() {
  by_name_.reset(tensors.size());
  const auto name_of = [this](size_t i) -> const std::string& { return tensors[i].name; };
  for (size_t i = 0; i < tensors.size(); ++i) by_name_.insert(tensors[i].name, i, name_of);
}

Error crc_mismatch(const CheckpointModel& m, size_t s, uint32_t computed) {
  const StorageInfo& si = m.storages[s];
  std::string names;
  for (const auto& t : m.tensors)
    if (t.storage == s) names += (names.empty() ? "" : ", ") + t.name;
  return crc_mismatch(m.source->name(), si.record.empty() ? si.key : si.record, si.offset,
                      si.crc32.value_or(0), computed, " (tensors: " + names + ")");
}

// Moves the tensor indices of a (cloned) subtree by `base`. The clone keeps the tree's sharing,
// so a node reached twice is moved once.
void shift_tensors(const ValuePtr& top, size_t base) {
  if (base == 0 || !top) return;
  std::unordered_set<const Value*> seen;
  std::vector<Value*> stack{top.get()};
  while (!stack.empty()) {
    Value* v = stack.back();
    stack.pop_back();
    if (!v || !seen.insert(v).second) continue;
    if (v->kind() == Value::Kind::kTensor) v->set_tensor_index(v->tensor_index() + base);
    for (auto& i : v->items()) stack.push_back(i.get());
    for (auto& [key, val] : v->entries()) {
      stack.push_back(key.get());
      stack.push_back(val.get());
    }
    if (v->state()) stack.push_back(v->state().get());
  }
}

}  // namespace ckpt::internal
