// The DCP reader's checks of `.metadata` against itself (formats/dcp/dcp_checks.h).

#include "formats/dcp/dcp_checks.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>

namespace ckpt::internal {

std::string dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string join(const std::string& dir, const std::string& name) {
  return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}

namespace {

bool meet(const DcpChunk& a, const DcpChunk& b, size_t d) {
  return a.offsets[d] < b.offsets[d] + b.sizes[d] && b.offsets[d] < a.offsets[d] + a.sizes[d];
}

// Drops exact duplicates (same offsets and sizes), keeping the first of each in place.
void drop_duplicates(std::vector<DcpChunk>& chunks) {
  std::vector<size_t> idx(chunks.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](size_t i) { return std::tie(chunks[i].offsets, chunks[i].sizes); };
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  std::vector<uint8_t> dup(chunks.size(), 0);
  for (size_t k = 1; k < idx.size(); ++k)
    if (key(idx[k]) == key(idx[k - 1])) dup[idx[k]] = 1;
  std::vector<DcpChunk> kept;
  kept.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i)
    if (!dup[i]) kept.push_back(std::move(chunks[i]));
  chunks = std::move(kept);
}

// Two of the `live` chunks (non-empty, inside the tensor) that overlap: (earlier, later) in the
// sweep. `split`: the dimensions some chunk does not span whole; the others never separate two
// chunks.
std::optional<std::pair<size_t, size_t>> find_overlap(const std::vector<DcpChunk>& c,
                                                      std::vector<size_t> live,
                                                      const std::vector<size_t>& split) {
  if (live.size() < 2) return std::nullopt;
  if (split.empty()) return std::make_pair(live[0], live[1]);
  const size_t d0 = split[0];
  auto start = [&](size_t i) { return c[i].offsets[d0]; };
  auto end = [&](size_t i) { return c[i].offsets[d0] + c[i].sizes[d0]; };
  std::sort(live.begin(), live.end(), [&](size_t a, size_t b) { return start(a) < start(b); });
  if (split.size() == 1) {  // intervals: each must start at or after every earlier one's end
    size_t far = live[0];
    for (size_t k = 1; k < live.size(); ++k) {
      if (start(live[k]) < end(far)) return std::make_pair(far, live[k]);
      if (end(live[k]) > end(far)) far = live[k];
    }
    return std::nullopt;
  }
  // A sweep along d0: the chunks that span the sweep's position ("active") are disjoint in the
  // other split dimensions; a chunk that starts checks against them there.
  std::vector<size_t> by_end = live;
  std::sort(by_end.begin(), by_end.end(), [&](size_t a, size_t b) { return end(a) < end(b); });
  const std::vector<size_t> rest(split.begin() + 1, split.end());
  const size_t d1 = rest[0];
  std::map<int64_t, size_t> active1;  // two split dimensions: active chunks by start in d1
  std::vector<size_t> active;         // more: every active chunk
  size_t gone = 0;
  for (size_t i : live) {
    for (; gone < by_end.size() && end(by_end[gone]) <= start(i); ++gone) {
      const size_t r = by_end[gone];
      if (rest.size() == 1)
        active1.erase(c[r].offsets[d1]);
      else
        active.erase(std::find(active.begin(), active.end(), r));
    }
    if (rest.size() == 1) {
      const int64_t s1 = c[i].offsets[d1], e1 = s1 + c[i].sizes[d1];
      auto it = active1.lower_bound(s1);
      if (it != active1.end() && it->first < e1) return std::make_pair(it->second, i);
      if (it != active1.begin()) {
        const size_t p = std::prev(it)->second;
        if (c[p].offsets[d1] + c[p].sizes[d1] > s1) return std::make_pair(p, i);
      }
      active1.emplace(s1, i);
    } else {
      for (size_t a : active) {
        bool all = true;
        for (size_t d : rest) all = all && meet(c[a], c[i], d);
        if (all) return std::make_pair(a, i);
      }
      active.push_back(i);
    }
  }
  return std::nullopt;
}

}  // namespace

void check_tiling(DcpEntry& e, const ChunkFail& fail) {
  drop_duplicates(e.chunks);
  const size_t n = e.size.size();
  uint64_t numel = 1;
  for (int64_t s : e.size) {
    const auto u = static_cast<uint64_t>(s);
    if (u && numel > UINT64_MAX / u)
      fail(ErrorCode::kCorrupt, "the tensor's size overflows", nullptr);
    numel *= u;
  }
  uint64_t covered = 0;
  std::vector<size_t> live;
  std::vector<uint8_t> is_split(n, 0);
  for (size_t a = 0; a < e.chunks.size(); ++a) {
    const DcpChunk& c = e.chunks[a];
    if (c.offsets.size() != n || c.sizes.size() != n)
      fail(ErrorCode::kCorrupt,
           "a chunk at " + dims(c.offsets) + " of size " + dims(c.sizes) + " has not the " +
               std::to_string(n) + " dimensions of the tensor " + dims(e.size),
           &c);
    uint64_t vol = 1;
    for (size_t d = 0; d < n; ++d) {
      if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] > e.size[d] ||
          c.sizes[d] > e.size[d] - c.offsets[d])
        fail(ErrorCode::kCorrupt,
             "the chunk at " + dims(c.offsets) + " of size " + dims(c.sizes) +
                 " falls outside the tensor " + dims(e.size),
             &c);
      vol *= static_cast<uint64_t>(c.sizes[d]);
    }
    if (vol == 0) continue;
    if (vol <= numel - covered)  // else an overlap, found below
      covered += vol;
    live.push_back(a);
    for (size_t d = 0; d < n; ++d)
      if (c.offsets[d] != 0 || c.sizes[d] != e.size[d]) is_split[d] = 1;
  }
  std::vector<size_t> split;
  for (size_t d = 0; d < n; ++d)
    if (is_split[d]) split.push_back(d);
  if (auto o = find_overlap(e.chunks, std::move(live), split)) {
    const DcpChunk& a = e.chunks[o->first];
    const DcpChunk& b = e.chunks[o->second];
    fail(ErrorCode::kCorrupt,
         "the chunk at " + dims(b.offsets) + " of size " + dims(b.sizes) +
             " overlaps the chunk at " + dims(a.offsets) + " of size " + dims(a.sizes),
         &b);
  }
  if (covered != numel)
    fail(ErrorCode::kCorrupt,
         "the chunks cover " + std::to_string(covered) + " of the " + std::to_string(numel) +
             " elements of the tensor " + dims(e.size) + ": a hole",
         nullptr);
}

std::optional<std::pair<size_t, size_t>> shared_bytes(std::vector<DcpItemRange> ranges) {
  std::erase_if(ranges, [](const DcpItemRange& r) { return r.length == 0; });
  std::sort(ranges.begin(), ranges.end(), [](const DcpItemRange& a, const DcpItemRange& b) {
    return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
  });
  for (size_t k = 1, far = 0; k < ranges.size(); ++k) {
    const DcpItemRange& a = ranges[far];
    const DcpItemRange& b = ranges[k];
    if (a.file == b.file && b.offset < a.offset + a.length) return std::make_pair(a.item, b.item);
    if (a.file != b.file || b.offset + b.length > a.offset + a.length) far = k;
  }
  return std::nullopt;
}

}  // namespace ckpt::internal
