// The legacy (pre-1.6, `_use_new_zipfile_serialization=False`) torch.save stream.
//
// Layout (docs/formats/torch.md "Legacy torch.save"): five pickles back to back —
// magic number 0x1950a86a20f9469cfc6c, protocol version 1001, sys_info dict, the object (storages
// as persistent ids), the list of storage keys — then for each key in that list: i64 LE element
// count and the raw little-endian storage bytes. Offsets follow from the sizes in the persistent
// ids; the element counts in the file are checked against them.

#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "ckpt/error.h"
#include "formats/open.h"
#include "formats/torch/torch_unpickle.h"
#include "pickle/unpickler.h"
#include "util/bytes.h"

namespace ckpt::internal {
namespace {

// 0x1950a86a20f9469cfc6c, beyond int64: the unpickler keeps its decimal digits.
constexpr std::string_view kMagic = "119547037146038801333356";

// A growing prefix of the file: the pickles' length is only known by running them.
class Prefix {
 public:
  explicit Prefix(const ByteSource& s) : src_(s) {}
  std::span<const std::byte> get(uint64_t n) {
    n = std::min<uint64_t>(n, src_.size());
    if (src_.memory()) return {src_.memory(), src_.size()};
    if (n > have_.size()) have_ = src_.read(0, n);
    return have_.data;
  }
  bool complete() const { return src_.memory() || have_.size() == src_.size(); }

 private:
  const ByteSource& src_;
  Bytes have_;
};

}  // namespace

std::shared_ptr<CheckpointModel> open_torch_legacy(SourcePtr source, const OpenOptions& options) {
  const std::string& src = source->name();
  auto data = std::make_shared<CheckpointModel>();
  data->source = source;
  data->options = options;
  data->format = Format::kTorchLegacy;

  UnpicklerHooks plain;
  plain.allow_global = [](const std::string&, const std::string&) { return false; };
  UnpickleOptions uo;
  uo.source = src;
  uo.limits = options.limits;
  uo.file_size = source->size();

  Prefix prefix(*source);
  uint64_t want = 1 << 20;
  for (;;) {
    auto buf = prefix.get(want);
    try {
      size_t pos = 0, used = 0;
      // The magic number, in whichever int encoding the pickle protocol chose (detection in
      // open.cc checked the encoding's first bytes; here its value).
      uo.record = "magic number";
      auto magic = unpickle(buf, plain, uo, &used);
      if (magic->kind() != Value::Kind::kInt || magic->str() != kMagic)
        throw Error(ErrorCode::kCorrupt,
                    "not a legacy torch file (bad magic number " + magic->repr(40) + ")", src,
                    "magic number", 0);
      // The pickle protocol torch.save was given: PROTO's byte, or without one 0 (text opcodes:
      // the protocol version is an INT line) or 1 (binary: BININT2).
      const auto* bytes = reinterpret_cast<const unsigned char*>(buf.data());
      const int pickle_protocol = bytes[0] == 0x80                          ? bytes[1]
                                  : used < buf.size() && bytes[used] == 'I' ? 0
                                                                            : 1;
      pos += used;
      uo.record = "protocol version";
      uo.base_offset = pos;
      auto proto = unpickle(buf.subspan(pos), plain, uo, &used);
      if (proto->kind() != Value::Kind::kInt || proto->as_int() != 1001)
        throw Error(ErrorCode::kUnsupported, "legacy protocol version " + proto->repr(), src, {},
                    pos);
      pos += used;
      uo.record = "sys_info";
      uo.base_offset = pos;
      auto sys = unpickle(buf.subspan(pos), plain, uo, &used);
      if (auto le = sys->get("little_endian");
          le && le->kind() == Value::Kind::kBool && !le->as_bool())
        throw Error(ErrorCode::kUnsupported, "big-endian legacy files are not supported", src);
      pos += used;

      TorchUnpickleOptions to;
      to.source = src;
      to.record = "object pickle";
      to.base_offset = pos;
      to.limits = options.limits;
      to.file_size = source->size();
      to.strict = options.strict;
      TorchPickle tp = unpickle_torch(buf.subspan(pos), to, &used);
      pos += used;

      uo.record = "storage keys";
      uo.base_offset = pos;
      auto keys = unpickle(buf.subspan(pos), plain, uo, &used);
      pos += used;
      if (keys->kind() != Value::Kind::kList)
        throw Error(ErrorCode::kCorrupt, "storage key list is not a list", src, {}, pos);

      std::unordered_map<std::string, size_t> by_key;
      for (size_t i = 0; i < tp.storages.size(); ++i) by_key.emplace(tp.storages[i].key, i);
      uint64_t off = pos;
      std::vector<std::pair<uint64_t, size_t>> counts;  // (offset of count, storage)
      for (auto& k : keys->items()) {
        if (k->kind() != Value::Kind::kString)
          throw Error(ErrorCode::kCorrupt, "storage key is not a string", src);
        auto it = by_key.find(k->str());
        if (it == by_key.end())
          throw Error(ErrorCode::kCorrupt, "storage " + k->str() + " is not used by the object",
                      src);
        StorageInfo& st = tp.storages[it->second];
        if (st.offset != kNoOffset)
          throw Error(ErrorCode::kCorrupt, "storage " + k->str() + " listed twice", src);
        counts.emplace_back(off, it->second);
        auto head_end = checked_add(off, 8);
        auto end = head_end ? checked_add(*head_end, st.nbytes) : std::nullopt;
        if (!end || *end > source->size())
          throw Error(ErrorCode::kTruncated, "storage " + k->str() + " passes the end of the file",
                      src, "storage " + k->str(), off);
        st.offset = off + 8;
        st.record = "storage " + k->str();
        off = *end;
      }
      for (size_t i = 0; i < tp.storages.size(); ++i)
        if (const StorageInfo& st = tp.storages[i];
            st.offset == kNoOffset && !st.meta && !tp.inline_bytes.count(i))
          throw Error(ErrorCode::kCorrupt, "storage " + st.key + " has no data in the file", src);
      // Check each storage's element count against its persistent id (batched reads).
      std::vector<int64_t> got(counts.size());
      std::vector<ReadRequest> reqs;
      for (size_t i = 0; i < counts.size(); ++i)
        reqs.push_back({counts[i].first, std::as_writable_bytes(std::span<int64_t>(&got[i], 1))});
      source->read_batch(reqs);
      std::vector<RecordInfo> records;
      records.reserve(counts.size());
      for (size_t i = 0; i < counts.size(); ++i) {
        const StorageInfo& st = tp.storages[counts[i].second];
        size_t es = storage_element_size(st.dtype);
        if (got[i] < 0 || static_cast<uint64_t>(got[i]) * es != st.nbytes)
          throw Error(ErrorCode::kCorrupt,
                      "element count " + std::to_string(got[i]) + " disagrees with the pickle's " +
                          std::to_string(st.nbytes / es),
                      src, st.record, counts[i].first);
        RecordInfo r;
        r.name = st.record;
        r.header_offset = counts[i].first;
        r.data_offset = st.offset;
        r.size = r.compressed_size = st.nbytes;
        records.push_back(std::move(r));
      }
      data->set_records(std::move(records));
      data->properties["version"] = "1001";
      data->properties["pickle_protocol"] = std::to_string(pickle_protocol);
      data->properties["records"] = std::to_string(counts.size());
      data->decoder = inline_decoder(nullptr, std::move(tp.inline_bytes));
      data->root = std::move(tp.root);
      data->storages = std::move(tp.storages);
      data->tensors = std::move(tp.tensors);
      return data;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTruncated || prefix.complete()) throw;
      want *= 8;
    }
  }
}

}  // namespace ckpt::internal
