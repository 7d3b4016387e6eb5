// tensorizer reader, data versions 1-4. Byte layout: tensorizer_format.h; spec:
// docs/formats/tensorizer.md "tensorizer" (**Layout**, **Versions**, **Encryption**, **Read
// validation**), checked against the tensorizer 2.11.1 files listed under **Fixtures** there.
//
// Reads: one read for the prologue and the index (the first 73 + 256 KiB, the index size every
// tensorizer writer reserves; a second read only when the index is larger). The index alone
// gives every tensor's name, type, dtype, shape and data range, which is all that listing,
// plans and plain loads need; a per-tensor header adds only its hashes (and the header bytes
// they cover) and, in an encrypted file, its cipher parameters and key-derivation parameters.
// Headers interleave with data in v1-4, so they cannot be one contiguous read: they are read
// in one batched read whose ranges come from the index (a remote source fetches them in
// parallel, a mapped source hands out views), either
//   - eagerly, at open, for local sources (pread, mmap): a damaged header fails the open, and
//     plaintext storages carry their data CRC32 for the load plan to check; or
//   - lazily, for remote sources (ByteSource::preferred_read_size() > 0, no mapping), where
//     each range is a request and headers of large tensors are one range each: TzrState reads
//     them once (std::call_once) when a decode, a verified load or verify first needs them.
//     The model then has no CRC32 in its StorageInfo (it is immutable after open), so it sets
//     CheckpointModel::hashes_in_decoder and verified loads read through TzrDecoder, which
//     checks CRC32 and SHA-256; the "key_derivation" property is absent (it is in the headers).
// Tensor bytes are read only on demand.
//
// Names: a structured name (0x1E + JSON path) becomes its components joined with '.', and the
// root object is the nested dict/list tree it describes. write_module labels tensors of the root
// module ".name" (module name "" + "." + name); for PARAM/BUFFER tensors that leading dot is
// dropped, as tensorizer's load_into_module resolves it to the root module.
//
// Tensor order: the index order (the order tensorizer wrote them, also the data order).

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/error.h"
#include "ckpt/sink.h"  // checkpoint.h needs it (until it includes it itself)
#include "formats/open.h"
#include "formats/tensorizer/tensorizer_crypt.h"
#include "formats/tensorizer/tensorizer_format.h"
#include "util/bytes.h"
#include "util/crc32.h"
#include "util/progress.h"

namespace ckpt::internal {
namespace {

using namespace tzr;

struct IndexEntry {
  std::string name;  // raw
  uint8_t type = 0;
  std::string dtype;
  std::vector<uint32_t> shape;
  uint64_t header_off = 0, data_off = 0, data_len = 0;
};

// Every per-tensor header, [header_off, data_off) of each entry: views of a mapped source, else
// read into `buf` with one read_batch (a remote source fetches them in parallel).
std::vector<std::span<const std::byte>> header_spans(const ByteSource& src,
                                                     const std::vector<IndexEntry>& index,
                                                     std::vector<std::byte>& buf) {
  std::vector<std::span<const std::byte>> headers(index.size());
  if (const std::byte* base = src.memory()) {
    for (size_t i = 0; i < index.size(); ++i)
      headers[i] = {base + index[i].header_off, index[i].data_off - index[i].header_off};
    return headers;
  }
  uint64_t total = 0;
  for (const auto& e : index) total += e.data_off - e.header_off;
  buf.resize(total);
  std::vector<ReadRequest> reqs(index.size());
  uint64_t pos = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    const uint64_t len = index[i].data_off - index[i].header_off;
    reqs[i] = {index[i].header_off, {buf.data() + pos, len}};
    headers[i] = {buf.data() + pos, len};
    pos += len;
  }
  src.read_batch(reqs);
  return headers;
}

// What the index says of a tensor: known at open.
struct TzrTensor {
  uint64_t data_off = 0, data_len = 0;
  bool meta = false;
};

// What a tensor's header adds to its index entry: the hashes and the bytes they cover, and
// the encryption parameters.
struct TzrHeader {
  std::string hashable;
  std::optional<uint32_t> crc;
  std::optional<Sha256> sha;
  std::optional<CipherParams> cipher;
  int key = -1;  // index into TzrHeaders::keys, -1 when no key is available
};

struct TzrHeaders {
  std::vector<TzrHeader> tensors;
  std::vector<Key> keys;
  std::string no_key_reason;
  bool any_kdf = false;
};

// Shared by the decoder and verify. The per-tensor headers are read either at open (eager:
// set_headers) or by the first call that needs them (lazy: headers(), once, one read_batch).
struct TzrState {
  SourcePtr src;
  std::string source;  // src->name()
  bool encrypted = false;
  std::optional<Key> given_key;  // OpenOptions::decrypt_key, parsed at open
  std::string password;          // OpenOptions::decrypt_password
  std::vector<TzrTensor> tensors;
  std::vector<std::string> names;

  [[noreturn]] void fail(ErrorCode code, size_t i, const std::string& msg,
                         std::optional<uint64_t> off = std::nullopt) const {
    throw Error(code, msg, source, names[i], off);
  }

  // Parses tensor i's header and checks it against its index entry.
  TensorHeader parse_header(size_t i, std::span<const std::byte> bytes) const {
    const IndexEntry& e = index_[i];
    TensorHeader h = parse_tensor_header(bytes, encrypted, source, names[i], e.header_off);
    if (h.name != e.name || h.type != e.type || h.dtype != e.dtype || h.shape != e.shape ||
        h.data_length < 0 || static_cast<uint64_t>(h.data_length) != e.data_len)
      fail(ErrorCode::kCorrupt, i, "tensor header disagrees with the index", e.header_off);
    return h;
  }

  // Takes tensor i's hashes and encryption parameters from its parsed header.
  void take_header(size_t i, TensorHeader&& h, TzrHeaders& out,
                   std::vector<std::optional<KdfParams>>& kdfs) const {
    const TzrTensor& t = tensors[i];
    TzrHeader& th = out.tensors[i];
    th.crc = h.crc32;
    th.sha = h.sha256;
    th.hashable = std::move(h.hashable);
    if (!h.crypt) return;
    kdfs[i] = h.crypt->kdf;
    out.any_kdf |= kdfs[i].has_value();
    if (h.crypt->cipher && !t.meta) {
      th.cipher = std::move(h.crypt->cipher);
      if (th.cipher->macs.size() != chunk_count(*th.cipher, t.data_len))
        fail(ErrorCode::kCorrupt, i,
             std::to_string(th.cipher->macs.size()) + " MACs for " +
                 std::to_string(chunk_count(*th.cipher, t.data_len)) + " encrypted chunks",
             index_[i].header_off);
    } else if (!t.meta && t.data_len > 0) {
      fail(ErrorCode::kCorrupt, i, "encrypted file without encryption parameters for a tensor",
           index_[i].header_off);
    }
  }

  // The keys for encrypted tensors: the given key, or one derived per distinct set of key
  // derivation parameters from the password.
  void resolve_keys(TzrHeaders& h, const std::vector<std::optional<KdfParams>>& kdfs) const {
    if (given_key) {
      h.keys.push_back(*given_key);
      for (auto& t : h.tensors) t.key = 0;
      return;
    }
    if (password.empty()) {
      h.no_key_reason =
          "tensor is encrypted: give the key (OpenOptions::decrypt_key) or the password "
          "(OpenOptions::decrypt_password)";
      return;
    }
    h.no_key_reason =
        "tensor stores no key derivation parameters, so a password cannot decrypt it: give the "
        "key (OpenOptions::decrypt_key)";
    std::vector<KdfParams> seen;
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      if (!kdfs[i] || !h.tensors[i].cipher) continue;
      auto it = std::find(seen.begin(), seen.end(), *kdfs[i]);
      if (it == seen.end()) {
        try {
          h.keys.push_back(derive_key(password, *kdfs[i]));
        } catch (Error& e) {
          e.with_source(source).with_record(names[i]);
          throw;
        }
        seen.push_back(*kdfs[i]);
        it = seen.end() - 1;
      }
      h.tensors[i].key = static_cast<int>(it - seen.begin());
    }
  }

  // Reads every header (views of a mapped source, else one read_batch) and parses them.
  TzrHeaders read_headers() const {
    const size_t count = index_.size();
    std::vector<std::byte> buf;
    const std::vector<std::span<const std::byte>> headers = header_spans(*src, index_, buf);
    TzrHeaders out;
    out.tensors.resize(count);
    std::vector<std::optional<KdfParams>> kdfs(count);
    for (size_t i = 0; i < count; ++i) take_header(i, parse_header(i, headers[i]), out, kdfs);
    if (encrypted) resolve_keys(out, kdfs);
    return out;
  }

  void set_index(std::vector<IndexEntry> index) { index_ = std::move(index); }
  const std::vector<IndexEntry>& index() const { return index_; }

  // Eager: the headers as parsed at open.
  void set_headers(TzrHeaders h) {
    std::call_once(once_, [&] { headers_ = std::move(h); });
    index_.clear();
    index_.shrink_to_fit();
  }

  // The headers, read now if they are not yet. Thread-safe; a failure is kept and thrown
  // (as a copy) to this and every later caller, so a bad header costs one read, not one per
  // thread.
  const TzrHeaders& headers() const {
    std::call_once(once_, [this] {
      try {
        headers_ = read_headers();
        index_.clear();
        index_.shrink_to_fit();
      } catch (...) {
        error_ = std::current_exception();
      }
    });
    if (error_) {
      try {
        std::rethrow_exception(error_);
      } catch (const Error& e) {
        throw Error(e);  // each caller its own copy (callers may add context to it)
      }
    }
    return headers_;
  }

  // Throws Error{kCorrupt} when `data` does not match the tensor's stored hashes.
  void check_hashes(size_t i, std::span<const std::byte> data) const {
    const TzrHeader& t = headers().tensors[i];
    const uint64_t off = tensors[i].data_off;
    if (t.crc) {
      uint32_t c = crc32_update(crc32(as_bytes(t.hashable)), data);
      if (c != *t.crc) throw crc_mismatch(source, names[i], off, *t.crc, c);
    }
    if (t.sha) {
      Sha256Hasher h;
      h.update(t.hashable);
      h.update(data);
      if (h.finish() != *t.sha) fail(ErrorCode::kCorrupt, i, "SHA-256 mismatch", off);
    }
  }

  void read(size_t i, std::span<std::byte> dst, bool verify) const {
    const TzrTensor& t = tensors[i];
    const uint64_t want = t.meta ? dst.size() : t.data_len;
    if (dst.size() != want)
      fail(ErrorCode::kInvalidArgument, i,
           "destination has " + std::to_string(dst.size()) + " bytes, tensor has " +
               std::to_string(want));
    if (t.meta) {
      std::memset(dst.data(), 0, dst.size());
      if (verify) check_hashes(i, {});
      return;
    }
    // A plaintext tensor read without verification needs nothing from its header.
    const TzrHeaders* hs = encrypted || verify ? &headers() : nullptr;
    const TzrHeader* h = hs ? &hs->tensors[i] : nullptr;
    if (h && h->cipher && h->key < 0) fail(ErrorCode::kAuth, i, hs->no_key_reason);
    src->read_into(t.data_off, dst);
    if (h && h->cipher && !decrypt_in_place(hs->keys[h->key], *h->cipher, dst))
      fail(ErrorCode::kAuth, i,
           "decryption failed: wrong key or password, or the data or its MACs were altered",
           t.data_off);
    if (verify) check_hashes(i, dst);
  }

  // Streams a plaintext tensor through the hashes without holding it whole.
  void verify_raw(size_t i, ProgressMeter& meter) const {
    const TzrTensor& t = tensors[i];
    const TzrHeader& th = headers().tensors[i];
    constexpr uint64_t kBlock = 16 << 20;
    uint32_t c = crc32(as_bytes(th.hashable));
    std::optional<Sha256Hasher> h;  // only when there is a SHA-256 to check
    if (th.sha) h.emplace().update(th.hashable);
    for (uint64_t done = 0; done < t.data_len;) {
      uint64_t n = std::min(kBlock, t.data_len - done);
      Bytes b = src->read(t.data_off + done, n);
      if (th.crc) c = crc32_update(c, b.data);
      if (h) h->update(b.data);
      done += n;
      meter.add(n);
    }
    if (th.crc && c != *th.crc) throw crc_mismatch(source, names[i], t.data_off, *th.crc, c);
    if (h && h->finish() != *th.sha) fail(ErrorCode::kCorrupt, i, "SHA-256 mismatch", t.data_off);
  }

  size_t verify_all(const ProgressFn& progress) const {
    const TzrHeaders& hs = headers();
    uint64_t total = 0;
    if (progress)
      for (const TzrTensor& t : tensors)
        if (!t.meta) total += t.data_len;
    ProgressMeter meter(progress, total);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TzrTensor& t = tensors[i];
      if (t.meta) {
        check_hashes(i, {});
      } else if (hs.tensors[i].cipher) {
        std::vector<std::byte> buf(t.data_len);
        read(i, buf, true);
        meter.add(t.data_len);
      } else {
        verify_raw(i, meter);
      }
    }
    meter.finish();
    return tensors.size();
  }

 private:
  mutable std::vector<IndexEntry> index_;  // until the headers are read
  mutable std::once_flag once_;
  mutable TzrHeaders headers_;
  mutable std::exception_ptr error_;
};

class TzrDecoder final : public StorageDecoder {
 public:
  explicit TzrDecoder(std::shared_ptr<const TzrState> s) : s_(std::move(s)) {}
  void read(size_t index, std::span<std::byte> dst, bool verify) const override {
    if (index >= s_->tensors.size())
      throw Error(ErrorCode::kInvalidArgument, "no storage " + std::to_string(index),
                  s_->src->name());
    s_->read(index, dst, verify);
  }

 private:
  std::shared_ptr<const TzrState> s_;
};

// Builds the nested object tree that structured names describe (dict for string keys, list for
// index keys, like tensorizer's restructure).
class TreeBuilder {
 public:
  // Throws Error{kCorrupt} (message only) on conflicting paths.
  void add(const std::vector<PathComponent>& path, size_t tensor) {
    Node* n = &root_;
    for (size_t k = 0; k < path.size(); ++k) {
      if (n->leaf) throw Error(ErrorCode::kCorrupt, "tensor path is both a leaf and a prefix");
      Node* child = n->child(path[k]);
      if (k + 1 == path.size()) {
        if (child->leaf || !child->order.empty())
          throw Error(ErrorCode::kCorrupt, "tensor path is used twice or is also a prefix");
        child->leaf = tensor;
      }
      n = child;
    }
  }
  ValuePtr build() { return to_value(root_); }

 private:
  struct Node {
    std::optional<size_t> leaf;
    std::vector<std::pair<PathComponent, std::unique_ptr<Node>>> order;
    std::unordered_map<std::string, size_t> by_str;
    std::map<int64_t, size_t> by_int;
    Node* child(const PathComponent& key) {
      bool is_int = std::holds_alternative<int64_t>(key);
      if (!order.empty() && std::holds_alternative<int64_t>(order[0].first) != is_int)
        throw Error(ErrorCode::kCorrupt, "tensor paths mix dict keys and list indices");
      if (is_int) {
        auto [it, fresh] = by_int.try_emplace(std::get<int64_t>(key), order.size());
        if (!fresh) return order[it->second].second.get();
      } else {
        auto [it, fresh] = by_str.try_emplace(std::get<std::string>(key), order.size());
        if (!fresh) return order[it->second].second.get();
      }
      order.emplace_back(key, std::make_unique<Node>());
      return order.back().second.get();
    }
  };
  ValuePtr to_value(const Node& n) {
    if (n.leaf) return Value::tensor(*n.leaf);
    if (!n.by_int.empty()) {
      ValuePtr list = Value::list();
      for (const auto& [k, idx] : n.by_int) list->items().push_back(to_value(*n.order[idx].second));
      return list;
    }
    ValuePtr dict = Value::dict();
    dict->entries().reserve(n.order.size());
    for (const auto& [k, child] : n.order)
      dict->entries().emplace_back(Value::string(std::get<std::string>(k)), to_value(*child));
    return dict;
  }
  Node root_;
};

class Reader {
 public:
  Reader(SourcePtr src, const OpenOptions& opt)
      : src_(std::move(src)), opt_(opt), name_(src_->name()) {}
  std::shared_ptr<CheckpointModel> run();

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& msg, const std::string& tensor = {},
                         std::optional<uint64_t> off = std::nullopt) const {
    throw Error(code, msg, name_, tensor, off);
  }
  std::vector<IndexEntry> parse_index(std::span<const std::byte> index, uint64_t count);

  SourcePtr src_;
  const OpenOptions& opt_;
  std::string name_;
  uint64_t index_end_ = 0;
};

std::vector<IndexEntry> Reader::parse_index(std::span<const std::byte> index, uint64_t count) {
  // The smallest entry: u16 name length, type, dtype length, ndim, three u64.
  constexpr uint64_t kMinEntry = 2 + 1 + 1 + 1 + 24;
  if (count > index.size() / kMinEntry)
    fail(ErrorCode::kCorrupt,
         std::to_string(count) + " tensors cannot fit in an index of " +
             std::to_string(index.size()) + " bytes",
         {}, 65);
  Cursor c(index, name_, {}, kPrologueBytes);
  std::vector<IndexEntry> out(count);
  const uint64_t size = src_->size();
  for (uint64_t i = 0; i < count; ++i) {
    IndexEntry& e = out[i];
    const uint64_t at = c.abs_pos();
    e.name = std::string(c.take_str(c.get<uint16_t>()));
    e.type = c.get<uint8_t>();
    e.dtype = std::string(c.take_str(c.get<uint8_t>()));
    const uint8_t ndim = c.get<uint8_t>();
    if (ndim > opt_.limits.max_dims)
      fail(ErrorCode::kLimitExceeded,
           std::to_string(ndim) + " dimensions exceed Limits::max_dims (" +
               std::to_string(opt_.limits.max_dims) + ")",
           e.name, at);
    e.shape.resize(ndim);
    for (auto& d : e.shape) d = c.get<uint32_t>();
    e.header_off = c.get<uint64_t>();
    e.data_off = c.get<uint64_t>();
    e.data_len = c.get<uint64_t>();
    if (e.type > 2)
      fail(ErrorCode::kCorrupt, "unknown tensor type " + std::to_string(e.type), e.name, at);
    if (e.header_off < index_end_ || e.data_off <= e.header_off)
      fail(ErrorCode::kCorrupt,
           "header offset " + std::to_string(e.header_off) + " and data offset " +
               std::to_string(e.data_off) + " are out of order or inside the index",
           e.name, at);
    auto end = checked_add(e.data_off, e.data_len);
    if (!end || *end > size)
      fail(ErrorCode::kTruncated,
           "tensor data [" + std::to_string(e.data_off) + ", +" + std::to_string(e.data_len) +
               ") passes the end of the file (" + std::to_string(size) + " bytes)",
           e.name, e.data_off);
  }
  return out;
}

std::shared_ptr<CheckpointModel> Reader::run() {
  const uint64_t size = src_->size();
  const uint64_t first_len = std::min<uint64_t>(size, kPrologueBytes + kIndexReserve);
  Bytes first = src_->read(0, first_len);
  if (first_len < kMagic.size() || first.str().substr(0, kMagic.size()) != kMagic)
    fail(first_len < kMagic.size() ? ErrorCode::kTruncated : ErrorCode::kCorrupt,
         "not a tensorizer file (no |TZR| magic)", {}, 0);
  Cursor c(first.data, name_);
  c.seek(kMagic.size());
  const uint32_t version = c.get<uint32_t>();
  if (version < kVersionNumpy || version > kVersionMeta)
    fail(ErrorCode::kUnsupported,
         "tensorizer data version " + std::to_string(version) + " (supported: 1-4)", {}, 5);
  auto flags = c.take(32);
  bool encrypted = version == kVersionEncryption;
  if (version >= kVersionMeta) {
    for (size_t i = 0; i < flags.size(); ++i) {
      auto b = static_cast<uint8_t>(flags[i]);
      if (i == 0) {
        encrypted = b & kFlagEncrypted;
        b &= static_cast<uint8_t>(~kFlagEncrypted);
      }
      if (b) fail(ErrorCode::kUnsupported, "unknown feature flags", {}, 9 + i);
    }
  }
  c.get<uint64_t>();  // tensor_size: nominal, unused by readers
  c.get<uint64_t>();  // unused
  const uint64_t count = c.get<uint64_t>();
  const uint64_t index_len = c.get<uint64_t>();
  if (count > opt_.limits.max_tensors)
    fail(ErrorCode::kLimitExceeded,
         std::to_string(count) + " tensors exceed Limits::max_tensors (" +
             std::to_string(opt_.limits.max_tensors) + ")",
         {}, 57);
  if (index_len > opt_.limits.max_metadata_bytes)
    fail(ErrorCode::kLimitExceeded,
         "index of " + std::to_string(index_len) + " bytes exceeds Limits::max_metadata_bytes", {},
         65);
  if (index_len > size - kPrologueBytes)
    fail(ErrorCode::kTruncated,
         "index of " + std::to_string(index_len) + " bytes passes the end of the file", {}, 65);
  index_end_ = kPrologueBytes + index_len;
  Bytes index_bytes = index_end_ <= first_len
                          ? Bytes{first.data.subspan(kPrologueBytes, index_len), first.owner}
                          : src_->read(kPrologueBytes, index_len);
  std::vector<IndexEntry> index = parse_index(index_bytes.data, count);

  // The per-tensor headers hold only hashes and encryption parameters (everything else is in
  // the index). Eager (a local file): read and checked now, all in one batch (or as views of a
  // mapped source). Lazy (a remote source, where each range is a request and the headers sit
  // between the tensors' data): read by the first decode or verify that needs them.
  const bool lazy = src_->memory() == nullptr && src_->preferred_read_size() > 0;
  uint64_t header_total = 0;
  for (const auto& e : index) {
    header_total += e.data_off - e.header_off;
    if (header_total > opt_.limits.max_metadata_bytes)
      fail(ErrorCode::kLimitExceeded, "tensor headers exceed Limits::max_metadata_bytes", e.name,
           e.header_off);
  }

  auto state = std::make_shared<TzrState>();
  state->src = src_;
  state->source = name_;
  state->encrypted = encrypted;
  state->tensors.resize(count);
  state->names.resize(count);
  if (encrypted && !opt_.decrypt_key.empty()) {
    state->given_key = parse_key(opt_.decrypt_key);
    if (!state->given_key)
      throw Error(ErrorCode::kInvalidArgument,
                  "decryption key must be 32 raw bytes or 64 hex digits", name_);
  }
  if (encrypted) state->password = opt_.decrypt_password;
  state->set_index(std::move(index));
  const std::vector<IndexEntry>& entries = state->index();

  std::vector<std::span<const std::byte>> headers(lazy ? 0 : count);
  std::vector<std::byte> header_buf;
  TzrHeaders parsed;
  std::vector<std::optional<KdfParams>> kdfs;
  if (!lazy) {
    headers = header_spans(*src_, entries, header_buf);
    parsed.tensors.resize(count);
    kdfs.resize(count);
  }

  auto data = std::make_shared<CheckpointModel>();
  data->format = Format::kTensorizer;
  data->source = src_;
  data->options = opt_;
  data->tensors.resize(count);
  data->storages.resize(count);
  TreeBuilder tree;
  std::unordered_set<std::string> names;

  for (uint64_t i = 0; i < count; ++i) {
    const IndexEntry& e = entries[i];
    std::vector<PathComponent> path;
    try {
      path = parse_tensor_name(e.name);
    } catch (Error& err) {
      err.with_source(name_).with_record(e.name).with_offset(e.header_off);
      throw;
    }
    if (path.size() == 1 && e.type != 2 && e.name[0] == '.')
      path[0] = std::get<std::string>(path[0]).substr(1);
    std::string display = dotted_name(path);
    state->names[i] = display;
    std::optional<TensorHeader> h;
    if (!lazy) h = state->parse_header(i, headers[i]);

    auto dt = parse_dtype_string(e.dtype);
    std::string shown(e.dtype);
    std::replace(shown.begin(), shown.end(), '\0', ' ');
    if (!dt || dtype_info(dt->dtype).is_quantized)
      fail(ErrorCode::kUnsupported, "unsupported dtype \"" + shown + "\"", display, e.header_off);
    if (dt->opaque && version < kVersionOpaque)
      fail(ErrorCode::kCorrupt, "opaque dtype in a data version 1 file", display, e.header_off);
    uint64_t numel = 1;
    bool overflow = false;
    for (uint32_t d : e.shape) {
      auto m = checked_mul(numel, d);
      if (!m) {
        overflow = true;
        break;
      }
      numel = *m;
    }
    auto nbytes = overflow ? std::nullopt : checked_mul(numel, dtype_size(dt->dtype));
    if (!nbytes) fail(ErrorCode::kCorrupt, "tensor byte size overflows", display, e.header_off);

    TzrTensor& t = state->tensors[i];
    t.data_off = e.data_off;
    t.data_len = e.data_len;
    t.meta = version >= kVersionMeta && e.data_len == 0 && *nbytes > 0;
    if (!t.meta && *nbytes != e.data_len)
      fail(ErrorCode::kCorrupt,
           "shape and dtype need " + std::to_string(*nbytes) + " bytes but the tensor stores " +
               std::to_string(e.data_len),
           display, e.data_off);
    // Lazy: every non-meta tensor of an encrypted file is decoded (the cipher is in its header).
    bool decoded = encrypted && !t.meta;
    if (h) {
      state->take_header(i, std::move(*h), parsed, kdfs);
      decoded = parsed.tensors[i].cipher.has_value();
    }

    StorageInfo& s = data->storages[i];
    s.key = display;
    s.dtype = dt->dtype;
    s.nbytes = t.meta ? *nbytes : e.data_len;
    s.byteswap = dt->byteswap;
    s.meta = t.meta;
    if (!t.meta && !decoded) {
      s.offset = e.data_off;
      // The stored CRC covers header + data; dividing out the header leaves the CRC of the data
      // alone, which a loader can check while it copies. (Lazy: unknown at open; a verified
      // load reads through the decoder instead, see hashes_in_decoder.)
      if (h && parsed.tensors[i].crc)
        s.crc32 = *parsed.tensors[i].crc ^
                  crc32_shift(crc32(as_bytes(parsed.tensors[i].hashable)), t.data_len);
    }
    TensorInfo& ti = data->tensors[i];
    ti.name = display;
    ti.dtype = dt->dtype;
    ti.shape.assign(e.shape.begin(), e.shape.end());
    ti.strides = contiguous_strides(ti.shape);
    ti.storage = i;
    ti.type = tensor_type_name(e.type);
    ti.is_parameter = e.type == 0;
    if (!names.insert(display).second)
      fail(ErrorCode::kCorrupt, "duplicate tensor name", display, e.header_off);
    try {
      tree.add(path, i);
    } catch (Error& err) {
      err.with_source(name_).with_record(display).with_offset(e.header_off);
      throw;
    }
  }
  bool any_kdf = false;
  if (!lazy) {
    if (encrypted) state->resolve_keys(parsed, kdfs);
    any_kdf = parsed.any_kdf;
    state->set_headers(std::move(parsed));
  }

  data->root = tree.build();
  data->properties["version"] = std::to_string(version);
  data->properties["encrypted"] = encrypted ? "true" : "false";
  data->properties["index_bytes"] = std::to_string(index_len);
  if (encrypted) data->properties["encryption"] = "xsalsa20-poly1305";
  // Known from the headers only: absent when they are read lazily (a remote source).
  if (any_kdf) data->properties["key_derivation"] = "argon2";
  std::shared_ptr<const TzrState> cstate = state;
  data->decoder = std::make_shared<TzrDecoder>(cstate);
  data->hashes_in_decoder = lazy;
  data->verify = [cstate](const ProgressFn& progress) { return cstate->verify_all(progress); };
  return data;
}

}  // namespace

std::shared_ptr<CheckpointModel> open_tensorizer(SourcePtr source, const OpenOptions& options) {
  return Reader(std::move(source), options).run();
}

}  // namespace ckpt::internal
