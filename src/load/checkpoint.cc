// Checkpoint: format detection, validation of what a format reader produced, and lazy loading of
// storages (zero-copy views into a mapping, or reads into owned memory).

#include "ckpt/checkpoint.h"

#include <algorithm>
#include <cstring>

#include "load/checkpoint_data.h"
#include "util/arena.h"
#include "util/bytes.h"
#include "util/crc32.h"

namespace ckpt {

const char* format_name(Format format) noexcept {
  switch (format) {
    case Format::kTorchZip: return "torch-zip";
    case Format::kTorchLegacy: return "torch-legacy";
    case Format::kTorchScript: return "torchscript";
    case Format::kSafetensors: return "safetensors";
    case Format::kTensorizer: return "tensorizer";
  }
  return "unknown";
}

namespace internal {

void CheckpointData::finalize() {
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
  by_name.reset(tensors.size());
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
        auto step = checked_mul(static_cast<uint64_t>(t.shape[d] - 1),
                                static_cast<uint64_t>(t.strides[d]));
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
        bad(ErrorCode::kCorrupt,
            "view reaches byte " + (end_bytes ? std::to_string(*end_bytes) : std::string("?")) +
                " of a storage of " + std::to_string(st.nbytes) + " bytes");
    }
    by_name.insert(t.name, i, name_of);  // a repeated name keeps its first tensor
  }
  cache.clear();
}

}  // namespace internal

using internal::CheckpointData;

Checkpoint::Checkpoint(std::shared_ptr<CheckpointData> data) : data_(std::move(data)) {}

Checkpoint Checkpoint::open(const std::string& path, const OpenOptions& options) {
  return open(options.mmap ? open_mmap_source(path) : open_file_source(path), options);
}

Checkpoint Checkpoint::open(SourcePtr source, const OpenOptions& options) {
  return Checkpoint(internal::open_checkpoint(std::move(source), options));
}

std::shared_ptr<CheckpointData> internal::open_checkpoint(SourcePtr source,
                                                          const OpenOptions& options,
                                                          const ZipDirectoryHook* zip_hook) {
  std::byte head[16] = {};
  size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof head, source->size()));
  std::shared_ptr<CheckpointData> data;
  std::optional<Error> zip_error;
  if (source->memory()) {
    std::memcpy(head, source->memory(), n);
  } else {
    // Try the zip layout first: its first read (the tail) is one the zip reader needs anyway,
    // so a torch zip opens in at most three reads. Other formats pay one read more.
    try {
      data = internal::open_torch_zip(source, options, zip_hook);
    } catch (const Error& e) {
      zip_error = e;
    }
    if (!data) source->read_into(0, std::span<std::byte>(head, n));
  }
  auto h = reinterpret_cast<const unsigned char*>(head);
  try {
    if (data) {
      // opened as a zip above
    } else if (n >= 4 && h[0] == 'P' && h[1] == 'K' && h[2] == 3 && h[3] == 4) {
      if (zip_error) throw *zip_error;
      data = internal::open_torch_zip(source, options, zip_hook);
    } else if (n >= 4 && h[0] == 0x80 && h[1] == 0x02 && h[2] == 0x8a) {
      data = internal::open_torch_legacy(source, options);
    } else if (n >= 5 && std::memcmp(h, "|TZR|", 5) == 0) {
      data = internal::open_tensorizer(source, options);
    } else if (n >= 9 && (h[8] == '{' || h[8] == ' ')) {
      data = internal::open_safetensors(source, options);
    } else if (n >= 8 && std::memcmp(h, "PYTORCH1", 8) == 0) {
      throw Error(ErrorCode::kUnsupported, "pre-1.0 PYTORCH1 archives are not supported",
                  source->name());
    } else {
      throw Error(ErrorCode::kUnsupported,
                  "unknown format (not a torch zip, legacy torch file, safetensors or tensorizer "
                  "file)",
                  source->name(), {}, 0);
    }
    data->finalize();
  } catch (Error& e) {
    e.with_source(source->name());
    throw;
  }
  return data;
}

Format Checkpoint::format() const { return data_->format; }
const std::map<std::string, std::string>& Checkpoint::properties() const {
  return data_->properties;
}
const std::vector<TensorInfo>& Checkpoint::tensors() const { return data_->tensors; }
const std::vector<StorageInfo>& Checkpoint::storages() const { return data_->storages; }
const std::vector<RecordInfo>& Checkpoint::records() const {
  CheckpointData& d = *data_;
  if (d.make_records) std::call_once(d.records_once, [&d] { d.make_records(d.records); });
  return d.records;
}
const ValuePtr& Checkpoint::root() const { return data_->root; }
const ByteSource& Checkpoint::source() const { return *data_->source; }
SourcePtr Checkpoint::source_ptr() const { return data_->source; }

std::optional<size_t> Checkpoint::find(std::string_view name) const { return data_->find(name); }


StoragePtr Checkpoint::storage(size_t index, const LoadOptions& options) const {
  const CheckpointData& d = *data_;
  if (index >= d.storages.size())
    throw Error(ErrorCode::kInvalidArgument, "no storage #" + std::to_string(index),
                d.source->name());
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.cache.empty()) d.cache.resize(d.storages.size());
    if (auto st = d.cache[index].lock()) return st;
  }
  const StorageInfo& si = d.storages[index];
  auto st = std::make_shared<Storage>();
  st->info = si;
  bool raw = si.offset != kNoOffset && !(d.decoder && d.decode_all);
  if (si.meta) {
    auto buf = internal::allocate_arena(si.nbytes);
    std::memset(buf.get(), 0, si.nbytes);
    st->data = buf.get();
    st->owner = buf;
  } else if (raw && d.source->memory() && !si.byteswap && !options.copy) {
    st->data = const_cast<std::byte*>(d.source->memory()) + si.offset;
    st->owner = d.source->memory_owner();
    if (options.verify && si.crc32) {
      uint32_t crc = internal::crc32(st->bytes());
      if (crc != *si.crc32) throw internal::crc_mismatch(d, &si - d.storages.data(), crc);
    }
  } else {
    auto buf = internal::allocate_arena(si.nbytes);
    internal::load_storage_into(d, index, buf.get(), options.verify);
    st->data = buf.get();
    st->owner = buf;
  }
  std::lock_guard<std::mutex> lock(d.mu);
  if (auto other = d.cache[index].lock()) return other;
  d.cache[index] = st;
  return st;
}

Tensor Checkpoint::tensor(size_t index, const LoadOptions& options) const {
  if (index >= data_->tensors.size())
    throw Error(ErrorCode::kNotFound, "no tensor #" + std::to_string(index), data_->source->name());
  const TensorInfo& t = data_->tensors[index];
  return Tensor(t, storage(t.storage, options));
}

Tensor Checkpoint::tensor(std::string_view name, const LoadOptions& options) const {
  auto i = find(name);
  if (!i)
    throw Error(ErrorCode::kNotFound, "no tensor named '" + std::string(name) + "'",
                data_->source->name());
  return tensor(*i, options);
}

size_t Checkpoint::verify() const {
  const CheckpointData& d = *data_;
  if (d.verify) return d.verify();
  size_t checked = 0;
  std::vector<std::byte> buf;
  for (size_t i = 0; i < d.storages.size(); ++i) {
    const StorageInfo& s = d.storages[i];
    if (!s.crc32 || s.meta) continue;
    LoadOptions o;
    o.verify = true;
    o.copy = false;
    (void)storage(i, o);
    ++checked;
  }
  return checked;
}

}  // namespace ckpt
