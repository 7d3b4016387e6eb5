// resolve: a RankPlan against one checkpoint for one rank: each tensor's box, and the byte
// ranges Checkpoint::read_slice reads for it where the storage is raw.

#include "ckpt/error.h"
#include "ckpt/rank_plan.h"
#include "util/box.h"

namespace ckpt {

std::vector<int64_t> RankTensor::shape() const {
  std::vector<int64_t> s(begin.size());
  for (size_t d = 0; d < s.size(); ++d) s[d] = end[d] - begin[d];
  return s;
}

uint64_t RankLoadPlan::read_bytes() const {
  uint64_t n = 0;
  for (const RankTensor& t : tensors) {
    if (!t.exact) {
      n += t.nbytes;
      continue;
    }
    for (const FileRange& r : t.ranges) n += r.length;
  }
  return n;
}

namespace {

// The box of tensor `t` under `p` for rank `rank` of `world`.
void place(const Checkpoint& c, const TensorInfo& t, const Placement& p, int rank, int world,
           RankTensor& out) {
  const size_t n = t.shape.size();
  out.begin.assign(n, 0);
  out.end = t.shape;
  auto refuse = [&](const std::string& why) {
    throw Error(ErrorCode::kInvalidArgument, why + " (placement " + p.str() + ")",
                c.source().name(), t.name);
  };
  if (p.kind == Placement::Kind::kShard) {
    const int d = p.dim < 0 ? p.dim + static_cast<int>(n) : p.dim;
    if (d < 0 || d >= static_cast<int>(n))
      refuse("a tensor of " + std::to_string(n) + " dimensions has no dimension " +
             std::to_string(p.dim) + " to shard");
    auto [b, e] = shard_range(t.shape[d], rank, world);
    out.begin[d] = b;
    out.end[d] = e;
  } else if (p.kind == Placement::Kind::kBox) {
    if (p.begin.size() != n || p.end.size() != n)
      refuse("a box of " + std::to_string(p.begin.size()) + " dimensions for a tensor of " +
             std::to_string(n));
    for (size_t d = 0; d < n; ++d)
      if (p.begin[d] < 0 || p.begin[d] > p.end[d] || p.end[d] > t.shape[d])
        refuse("the box is not inside the tensor's dimension " + std::to_string(d) + " of size " +
               std::to_string(t.shape[d]));
    out.begin = p.begin;
    out.end = p.end;
  }
}

// The file ranges of the box where the tensor's bytes lie raw in one file.
void ranges_of(const Checkpoint& c, const TensorInfo& t, RankTensor& out) {
  const StorageInfo& si = c.storages()[t.storage];
  if (si.offset == kNoOffset || si.byteswap || si.meta || !t.is_contiguous()) return;
  out.exact = true;
  const uint32_t file = c.files_of(out.tensor)[0];
  const uint64_t base = si.offset + t.byte_offset();
  for (const internal::ByteRun& r :
       internal::box_runs(t.shape, out.begin, out.end, dtype_size(t.dtype)))
    out.ranges.push_back({file, base + r.offset, r.length});
}

}  // namespace

RankLoadPlan resolve(const Checkpoint& c, const RankPlan& plan, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(
        ErrorCode::kInvalidArgument,
        "rank " + std::to_string(rank) + " is not one of a group of " + std::to_string(world));
  RankLoadPlan out;
  out.rank = rank;
  out.world = world;
  out.tensors.reserve(c.tensors().size());
  for (size_t i = 0; i < c.tensors().size(); ++i) {
    const TensorInfo& t = c.tensors()[i];
    std::optional<Placement> p = plan.placement_of(t.name);
    if (!p)
      throw Error(ErrorCode::kInvalidArgument, "no rule of the plan covers this tensor",
                  c.source().name(), t.name);
    RankTensor& rt = out.tensors.emplace_back();
    rt.tensor = i;
    rt.placement = *p;
    place(c, t, *p, rank, world, rt);
    uint64_t numel = 1;
    for (size_t d = 0; d < rt.begin.size(); ++d)
      numel *= static_cast<uint64_t>(rt.end[d] - rt.begin[d]);
    rt.nbytes = numel * dtype_size(t.dtype);
    ranges_of(c, t, rt);
  }
  return out;
}

}  // namespace ckpt
