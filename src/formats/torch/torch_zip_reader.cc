// torch.save zip checkpoints (and TorchScript archives, which share the container).
//
// Layout (docs/formats/torch.md "torch.save zip": **Container**, **Zip layout**, **Records**): a
// zip whose entries all live under one folder: data.pkl (the pickled object), optional
// .format_version / .storage_alignment / byteorder, data/<key> (raw storage bytes, one per storage,
// 64-byte aligned), version (or .data/version), optional .data/serialization_id. TorchScript
// archives add constants.pkl, constants/, code/.
//
// Opening reads the zip tail and central directory, then data.pkl and the small records; storage
// data offsets are computed from the directory (ZipReader), never found by a read per record.

#include <algorithm>
#include <charconv>
#include <cstring>
#include <iterator>

#include "ckpt/error.h"
#include "formats/open.h"
#include "formats/torch/torch_unpickle.h"
#include "formats/torch/torchscript_reader.h"
#include "pickle/unpickler.h"
#include "util/crc32.h"
#include "util/progress.h"
#include "zip/zip_reader.h"

namespace ckpt::internal {
namespace {

class ZipStorageDecoder final : public StorageDecoder {
 public:
  ZipStorageDecoder(std::shared_ptr<ZipReader> zip, std::vector<size_t> entry_of_storage)
      : zip_(std::move(zip)), entry_(std::move(entry_of_storage)) {}
  // Inflates straight into dst (no copy the size of the record), the CRC computed on the way.
  void read(size_t index, std::span<std::byte> dst, bool verify) const override {
    zip_->read_into(entry_[index], dst, verify);
  }

 private:
  std::shared_ptr<ZipReader> zip_;
  std::vector<size_t> entry_;
};

// Hands the byte ranges of the data/ records to `report` (OpenHooks::storage_ranges) when every
// one of them is stored and located without a read; else reports nothing.
void report_storage_ranges(const ZipReader& zip,
                           const std::function<void(std::span<const ByteRange>)>& report) {
  const std::string data_prefix = zip.prefix() + "data/";
  std::vector<ByteRange> ranges;
  for (size_t i = 0; i < zip.entries().size(); ++i) {
    const ZipEntry& e = zip.entries()[i];
    if (e.size == 0 || !e.name.starts_with(data_prefix)) continue;
    if (e.method != 0 || !zip.offset_is_computed(i)) return;
    ranges.push_back({zip.data_offset(i), e.size});
  }
  if (!ranges.empty()) report(ranges);
}

// The number `name` ends with after `stem` characters (torch's storage keys: "0", "17"; no sign,
// no leading zero, at most 9 digits), or nullopt.
std::optional<uint32_t> decimal_key(std::string_view name, size_t stem) {
  if (name.size() <= stem) return std::nullopt;
  std::string_view k = name.substr(stem);
  if (k.size() > 9 || (k.size() > 1 && k[0] == '0')) return std::nullopt;
  uint32_t v = 0;
  for (char c : k) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  return v;
}

// Entry index of each record named `data_dir` + a decimal key below `count` (UINT32_MAX where
// there is none).
std::vector<uint32_t> numbered_records(const ZipReader& zip, std::string_view data_dir,
                                       size_t count) {
  std::vector<uint32_t> out(count, UINT32_MAX);
  const auto& entries = zip.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string_view name = entries[i].name;
    if (!name.starts_with(data_dir)) continue;
    if (auto n = decimal_key(name, data_dir.size()); n && *n < count)
      out[*n] = static_cast<uint32_t>(i);
  }
  return out;
}

// A deflated pickle record, inflated as a stream into a buffer of its declared size; its first
// opcode is checked on the first piece, so that a record of garbage is refused before the rest
// of it is inflated. The CRC is checked at the end.
Bytes read_pickle_record(const ZipReader& zip, size_t i) {
  const ZipEntry& e = zip.entries()[i];
  std::shared_ptr<std::byte[]> buf(new std::byte[std::max<uint64_t>(e.size, 1)]);
  uint64_t at = 0;
  zip.stream(i, /*verify=*/true, [&](std::span<const std::byte> piece) {
    if (at == 0 && !piece.empty()) check_pickle_start(piece, zip.source().name(), e.name);
    std::memcpy(buf.get() + at, piece.data(), piece.size());  // stream() caps at e.size
    at += piece.size();
  });
  return Bytes{std::span<const std::byte>(buf.get(), e.size), buf};
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

std::shared_ptr<CheckpointModel> open_torch_zip(SourcePtr source, const OpenOptions& options,
                                                const OpenHooks& hooks) {
  auto zip = std::make_shared<ZipReader>(source, options.limits);
  if (hooks.storage_ranges) report_storage_ranges(*zip, hooks.storage_ranges);
  const std::string& prefix = zip->prefix();
  const std::string& src = source->name();
  auto data = std::make_shared<CheckpointModel>();
  data->source = source;
  data->options = options;

  auto pkl = zip->find(prefix + "data.pkl");
  if (!pkl)
    throw Error(ErrorCode::kCorrupt,
                "no data.pkl record" +
                    (prefix.empty() ? std::string(" (and no common folder)") : " under " + prefix),
                src);
  // TorchScript: constants.pkl, or code/ records (then a missing constants.pkl is an error).
  const std::string code_dir = prefix + "code/";
  bool torchscript = zip->find(prefix + "constants.pkl").has_value() ||
                     std::any_of(zip->entries().begin(), zip->entries().end(),
                                 [&](const ZipEntry& e) { return e.name.starts_with(code_dir); });
  data->format = torchscript ? Format::kTorchScript : Format::kTorchZip;
  data->properties["archive"] = prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1);

  // data.pkl and the small records: one or two reads in all (torch writes the small records right
  // after data.pkl and right before the directory, which the zip layer already holds).
  const char* kSmall[] = {".data/version",      "version",   ".format_version",
                          ".storage_alignment", "byteorder", ".data/serialization_id"};
  constexpr size_t kNumSmall = std::size(kSmall);
  std::vector<size_t> want = {*pkl};
  size_t slot[kNumSmall];  // position in `want` of each small record, 0 when absent
  for (size_t k = 0; k < kNumSmall; ++k) {
    slot[k] = 0;
    if (auto i = zip->find(prefix + kSmall[k])) {
      const ZipEntry& e = zip->entries()[*i];
      if (e.size > 4096)
        throw Error(ErrorCode::kCorrupt,
                    "record is " + std::to_string(e.size) + " bytes; expected a short text", src,
                    std::string(e.name));
      slot[k] = want.size();
      want.push_back(*i);
    }
  }
  const ZipEntry& pe = zip->entries()[*pkl];
  if (pe.size > options.limits.max_metadata_bytes)
    throw Error(ErrorCode::kLimitExceeded,
                "data.pkl is " + std::to_string(pe.size) +
                    " bytes; Limits::max_metadata_bytes is " +
                    std::to_string(options.limits.max_metadata_bytes),
                src, std::string(pe.name));
  // A deflated data.pkl is held inflated: it counts against the file's object budget, and is
  // inflated as a stream whose first opcode is checked before the rest is inflated.
  const uint64_t budget = options.limits.object_bytes_for(source->size());
  if (pe.method != 0 && pe.size > budget)
    throw Error(ErrorCode::kLimitExceeded,
                "data.pkl inflates to " + std::to_string(pe.size) + " bytes; a file of " +
                    std::to_string(source->size()) + " bytes may hold " + std::to_string(budget) +
                    " (limits.max_object_bytes + limits.object_bytes_per_byte per byte)",
                src, std::string(pe.name));
  if (pe.method != 0) want[0] = want.back();  // read below, not with the small records
  std::vector<Bytes> got = zip->read_many(want);
  if (pe.method != 0) got[0] = read_pickle_record(*zip, *pkl);
  auto small_record = [&](std::string_view name) -> std::optional<std::string> {
    for (size_t k = 0; k < kNumSmall; ++k)
      if (name == kSmall[k] && slot[k] != 0) return std::string(got[slot[k]].str());
    return std::nullopt;
  };

  // Version: torch requires it; tolerate its absence in archives made by other tools.
  std::optional<std::string> version = small_record(".data/version");
  if (!version) version = small_record("version");
  if (version) {
    std::string v = trim(*version);
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || p != v.data() + v.size())
      throw Error(ErrorCode::kCorrupt, "version record is not a number: '" + v + "'", src,
                  prefix + "version");
    if (n < 1 || n > 10)
      throw Error(ErrorCode::kUnsupported, "file format version " + v + " (supported: 1 to 10)",
                  src, prefix + "version");
    data->properties["version"] = v;
  }
  if (auto fv = small_record(".format_version")) data->properties["format_version"] = trim(*fv);
  if (auto al = small_record(".storage_alignment")) data->properties["alignment"] = trim(*al);
  bool big_endian = false;
  if (auto bo = small_record("byteorder")) {
    std::string b = trim(*bo);
    if (b != "little" && b != "big")
      throw Error(ErrorCode::kCorrupt, "byteorder record says '" + b + "'", src,
                  prefix + "byteorder");
    data->properties["byteorder"] = b;
    big_endian = b == "big";
  }
  if (auto sid = small_record(".data/serialization_id"))
    data->properties["serialization_id"] = trim(*sid);
  const Bytes& pkl_bytes = got[0];

  TorchUnpickleOptions uo;
  uo.source = src;
  uo.record = std::string(pe.name);
  uo.base_offset = pe.method == 0 ? zip->data_offset(*pkl) : 0;
  uo.limits = options.limits;
  uo.file_size = source->size();
  uo.torchscript = torchscript;
  uo.strict = options.strict;
  TorchPickle tp = unpickle_torch(pkl_bytes.data, uo);
  // The object tree holds copies of what it needs: drop data.pkl's mapped pages (if mapped).
  if (pe.method == 0) source->release(zip->data_offset(*pkl), pe.size);
  size_t module_tensors = tp.tensors.size();
  ValuePtr constants;
  if (torchscript) constants = add_torchscript_constants(*zip, tp, options);

  std::vector<size_t> entry_of(tp.storages.size(), SIZE_MAX);
  bool any_deflated = false;
  std::string rec = prefix + "data/";  // "<prefix>data/<key>", rebuilt in place for each storage
  const size_t rec_stem = rec.size();
  // torch writes the records in the string order of their keys (0, 1, 10, 100, ...) and pickles
  // the storages in number order, so a name lookup per storage would mostly hash. The records
  // named <prefix>data/<decimal> are indexed by number instead; a candidate is used only when its
  // full name is the one wanted, so any other name still goes through find().
  std::vector<uint32_t> by_number = numbered_records(*zip, rec, tp.storages.size());
  for (size_t s = 0; s < tp.storages.size(); ++s) {
    StorageInfo& st = tp.storages[s];
    if (st.meta || (!tp.inline_bytes.empty() && tp.inline_bytes.count(s))) continue;
    if (st.record.empty()) {
      rec.resize(rec_stem);
      rec += st.key;
    }
    const std::string& name = st.record.empty() ? rec : st.record;
    std::optional<size_t> i;
    // `rec` is <prefix>data/ and a key that decimal_key read as n, which has one spelling, so
    // the entry indexed under n has that very name; a record name given by the pickle is
    // compared in full.
    if (auto n = decimal_key(name, rec_stem);
        n && *n < by_number.size() && by_number[*n] != UINT32_MAX &&
        (st.record.empty() || zip->entries()[by_number[*n]].name == name)) {
      i = by_number[*n];
    } else {
      i = zip->find(name);
    }
    if (!i)
      throw Error(ErrorCode::kCorrupt,
                  "data.pkl names storage " + st.key + " but the archive has no record " + name,
                  src);
    const ZipEntry& e = zip->entries()[*i];
    if (e.size != st.nbytes)
      throw Error(ErrorCode::kCorrupt,
                  "record holds " + std::to_string(e.size) + " bytes but its storage needs " +
                      std::to_string(st.nbytes),
                  src, std::string(e.name));
    if (st.record.empty()) st.record = e.name;  // else it is the name that found e
    if (e.crc32 != 0 || e.size == 0) st.crc32 = e.crc32;
    st.byteswap = big_endian && dtype_info(st.dtype).bits > 8;
    entry_of[s] = *i;
    if (e.method == 0) {
      st.offset = e.size == 0 ? 0 : zip->data_offset(*i);
    } else {
      any_deflated = true;
    }
  }

  // The record table is built when first asked for: one name string per record (20,000 for a
  // 20,000-tensor checkpoint) that opening and listing never need. Needs no I/O.
  data->make_records = [zip](std::vector<RecordInfo>& records) {
    records.clear();
    records.reserve(zip->entries().size());
    for (size_t i = 0; i < zip->entries().size(); ++i) {
      const ZipEntry& e = zip->entries()[i];
      RecordInfo& r = records.emplace_back();
      r.name = e.name;
      r.header_offset = e.header_offset;
      r.data_offset = e.method == 0 && zip->offset_is_computed(i) ? zip->data_offset(i) : kNoOffset;
      r.size = e.size;
      r.compressed_size = e.compressed_size;
      if (e.crc32 != 0 || e.size == 0) r.crc32 = e.crc32;
      r.deflated = e.method != 0;
    }
  };
  data->properties["records"] = std::to_string(zip->entries().size());
  if (any_deflated) data->decoder = std::make_shared<ZipStorageDecoder>(zip, entry_of);
  data->decoder = inline_decoder(data->decoder, std::move(tp.inline_bytes));

  // Verification reads every record through the zip layer (stored ones in slices).
  data->verify = [zip](const ProgressFn& progress) {
    size_t checked = 0;
    const ByteSource& s = zip->source();
    auto has_crc = [](const ZipEntry& e) { return e.crc32 != 0 || e.size == 0; };
    uint64_t total = 0;
    if (progress)
      for (const ZipEntry& e : zip->entries())
        if (has_crc(e)) total += e.method != 0 ? e.compressed_size : e.size;
    ProgressMeter meter(progress, total);
    for (size_t i = 0; i < zip->entries().size(); ++i) {
      const ZipEntry& e = zip->entries()[i];
      if (!has_crc(e)) continue;  // written without CRC
      if (e.method != 0) {
        // Inflated a piece at a time, the CRC on the way: memory is one piece, whatever the size.
        zip->stream(i, true, [](std::span<const std::byte>) {});
        meter.add(e.compressed_size);
      } else {
        uint64_t off = zip->data_offset(i);
        uint32_t crc = 0;
        constexpr uint64_t kPiece = 4 << 20;
        for (uint64_t done = 0; done < e.size; done += kPiece) {
          uint64_t n = std::min(kPiece, e.size - done);
          Bytes b = s.read(off + done, n);
          crc = crc32(crc, b.data);
          meter.add(n);
        }
        if (crc != e.crc32) {
          throw crc_mismatch(s.name(), std::string(e.name), off, e.crc32, crc);
        }
      }
      ++checked;
    }
    meter.finish();
    return checked;
  };

  data->root = std::move(tp.root);
  data->storages = std::move(tp.storages);
  data->tensors = std::move(tp.tensors);
  if (torchscript) data->extension = finish_torchscript(zip, *data, module_tensors, constants);
  return data;
}

}  // namespace ckpt::internal
