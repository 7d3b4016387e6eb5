// LoadPlan: the one place that decides how each storage is loaded, and the single-storage
// executor that every path shares.

#include "load/plan.h"

#include <algorithm>
#include <cstring>

#include "util/arena.h"
#include "util/bytes.h"
#include "util/crc32.h"

namespace ckpt::internal {

Route route_of(const CheckpointModel& m, size_t s, const LoadOptions& options, bool allow_view) {
  switch (m.kind(s)) {
    case StorageKind::kMeta:
      return Route::kZeros;
    case StorageKind::kDecoded:
      return Route::kDecode;
    case StorageKind::kRaw:
      break;
  }
  // Hashes the format keeps out of StorageInfo::crc32 (tensorizer headers read lazily over the
  // network): a verified load reads the bytes through the decoder, which checks them.
  if (options.verify && m.hashes_in_decoder && m.decoder) return Route::kDecode;
  const bool mapped = m.source->memory() != nullptr;
  return allow_view && mapped && !m.storages[s].byteswap && !options.copy ? Route::kView
                                                                          : Route::kRead;
}

namespace {

PlannedStorage plan_one(const CheckpointModel& m, size_t s, const LoadOptions& options,
                        bool allow_view) {
  const StorageInfo& si = m.storages[s];
  PlannedStorage p;
  p.storage = static_cast<uint32_t>(s);
  p.route = route_of(m, s, options, allow_view);
  p.byteswap = si.byteswap && p.route != Route::kZeros;
  p.check_crc = options.verify && si.crc32.has_value() &&
                (p.route == Route::kView || p.route == Route::kRead);
  return p;
}

LoadPlan empty_plan(const CheckpointModel& m, SourcePtr copy, const LoadOptions& options) {
  if (m.tensors.size() > LoadPlan::kMaxItems || m.storages.size() > LoadPlan::kMaxItems)
    throw Error(ErrorCode::kLimitExceeded, "a load supports up to 2^32 - 1 tensors and storages",
                m.source->name());
  LoadPlan plan;
  plan.model = &m;
  plan.copy = std::move(copy);
  plan.verify = options.verify;
  plan.drop_cache = options.drop_cache;
  plan.threads = options.threads > 0 ? options.threads : default_threads();
  // Nothing here may cost O(storages): storage() plans one storage per call.
  return plan;
}

}  // namespace

namespace {
// What the decoder can check before the storages are allocated (StorageDecoder::check).
void check_decoded(const CheckpointModel& m, const LoadPlan& plan) {
  if (!m.decoder) return;
  for (const PlannedStorage& p : plan.storages)
    if (p.route == Route::kDecode) m.decoder->check(p.storage, m.storages[p.storage].nbytes);
}
}  // namespace

LoadPlan make_plan(const CheckpointModel& m, SourcePtr copy, const LoadOptions& options,
                   const TensorFilter& filter, bool allow_view) {
  LoadPlan plan = empty_plan(m, std::move(copy), options);
  plan.progress = options.progress;  // whole-plan executors only: storage() plans one at a time
  std::vector<uint8_t> need(m.storages.size(), 0);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (filter && !filter(m.tensors[i])) continue;
    plan.tensors.push_back(static_cast<uint32_t>(i));
    need[m.tensors[i].storage] = 1;
  }
  for (size_t s = 0; s < m.storages.size(); ++s)
    if (need[s]) plan.storages.push_back(plan_one(m, s, options, allow_view));
  check_decoded(m, plan);
  // File order for raw bytes (a remote or cold source then sees ascending ranges); the rest
  // (kNoOffset) after them.
  std::stable_sort(plan.storages.begin(), plan.storages.end(),
                   [&](const PlannedStorage& a, const PlannedStorage& b) {
                     auto key = [&](const PlannedStorage& p) {
                       return p.route == Route::kView || p.route == Route::kRead
                                  ? m.storages[p.storage].offset
                                  : kNoOffset;
                     };
                     return key(a) < key(b);
                   });
  return plan;
}

LoadPlan plan_storage(const CheckpointModel& m, SourcePtr copy, size_t s,
                      const LoadOptions& options, bool allow_view) {
  LoadPlan plan = empty_plan(m, std::move(copy), options);
  plan.storages.push_back(plan_one(m, s, options, allow_view));
  check_decoded(m, plan);
  return plan;
}

void load_into(const LoadPlan& plan, const PlannedStorage& p, std::byte* dst) {
  const CheckpointModel& m = *plan.model;
  const StorageInfo& si = m.storages[p.storage];
  switch (p.route) {
    case Route::kZeros:
      std::memset(dst, 0, si.nbytes);
      return;
    case Route::kView:
    case Route::kRead: {
      const uint64_t kPiece = std::max<uint64_t>(1 << 20, plan.copy->preferred_read_size());
      uint32_t crc = 0;
      for (uint64_t done = 0; done < si.nbytes; done += kPiece) {
        uint64_t n = std::min(kPiece, si.nbytes - done);
        plan.copy->read_into(si.offset + done, std::span<std::byte>(dst + done, n));
        if (p.check_crc) crc = crc32(crc, std::span<const std::byte>(dst + done, n));
      }
      if (p.check_crc && crc != *si.crc32) throw crc_mismatch(m, p.storage, crc);
      break;
    }
    case Route::kDecode:
      if (!m.decoder)
        throw Error(ErrorCode::kCorrupt, "storage has no data", m.source->name(), si.key);
      m.decoder->read(p.storage, std::span<std::byte>(dst, si.nbytes), plan.verify);
      break;
  }
  if (p.byteswap)
    byteswap_elements(dst, si.nbytes, dtype_size(si.dtype), dtype_info(si.dtype).is_complex);
}

StoragePtr make_storage(const StorageInfo& info, const std::byte* data,
                        std::shared_ptr<const void> owner, bool writable) {
  auto st = std::make_shared<Storage>();
  st->info = info;
  st->data = data;
  st->owner = std::move(owner);
  st->writable = writable;
  return st;
}

StoragePtr load_one(const LoadPlan& plan, const PlannedStorage& p) {
  const CheckpointModel& m = *plan.model;
  const StorageInfo& si = m.storages[p.storage];
  if (p.route == Route::kView) {
    const std::byte* data = m.source->memory() + si.offset;
    if (p.check_crc) {
      uint32_t crc = crc32(std::span<const std::byte>(data, si.nbytes));
      if (crc != *si.crc32) throw crc_mismatch(m, p.storage, crc);
    }
    return make_storage(si, data, m.source->memory_owner(), m.source->memory_writable());
  }
  auto buf = allocate_arena(si.nbytes);
  load_into(plan, p, buf.get());
  return make_storage(si, buf.get(), buf, true);
}

uint64_t plan_bytes(const LoadPlan& plan) {
  uint64_t n = 0;
  for (const PlannedStorage& p : plan.storages) n += plan.model->storages[p.storage].nbytes;
  return n;
}

std::vector<Tensor> plan_tensors(const LoadPlan& plan, const std::vector<StoragePtr>& storages) {
  std::vector<Tensor> out;
  out.reserve(plan.tensors.size());
  for (uint32_t i : plan.tensors) {
    const TensorInfo& t = plan.model->tensors[i];
    out.emplace_back(t, storages[t.storage]);
  }
  return out;
}

}  // namespace ckpt::internal
