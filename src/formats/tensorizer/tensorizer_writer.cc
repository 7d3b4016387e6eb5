// tensorizer writer, data versions 1-4 (layout: tensorizer_format.h). Produces what tensorizer
// 2.11.1's TensorSerializer produces for the same tensors in the same order: prologue, a 256 KiB
// index block, then header + data per tensor and a closing u64 0. Offsets are all computable up
// front (header sizes depend only on names, dtypes, shapes and chunk counts), so the prologue and
// index are written first and each header is complete before its data, except for encrypted
// tensors, whose MACs are known only after the data is written: their headers are patched.

#include <cstring>
#include <unordered_set>

#include "ckpt/error.h"
#include "ckpt/tensorizer.h"
#include "formats/tensorizer/tensorizer_crypt.h"
#include "formats/tensorizer/tensorizer_format.h"
#include "formats/tensorizer/tensorizer_key.h"
#include "formats/writer.h"
#include "io/gather.h"
#include "util/bytes.h"
#include "util/crc32.h"
#include "util/host_check.h"
#include "util/text.h"

namespace ckpt {
namespace {

using namespace internal;
using namespace internal::tzr;

struct Planned {
  const TensorizerEntry* entry = nullptr;
  std::string name, dtype;
  std::vector<uint32_t> shape;
  bool meta = false;
  bool encrypt = false;
  uint64_t nbytes = 0;
  uint64_t header_off = 0;
  CryptInfo crypt;
  BuiltHeader header;
};

[[noreturn]] void invalid(const ByteSink& sink, const std::string& tensor, const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, msg, sink.name(), tensor);
}

// save_tensorizer, with the tensors' bytes from `feed` when it is set.
std::string write_tensorizer(ByteSink& sink, const std::vector<TensorizerEntry>& tensors,
                             const TensorizerSaveOptions& opt, const internal::TensorFeed* feed) {
  const bool enc = opt.encryption != TensorizerEncryption::kNone;
  Key key{};
  std::optional<KdfParams> kdf;
  if (enc) {
    ensure_sodium();
    if (opt.crypt_chunk_size < 1024 || opt.crypt_chunk_size % 64 != 0)
      invalid(sink, {}, "crypt_chunk_size must be a multiple of 64 of at least 1024");
  }
  // Every header holds a SHA-256: without a provider, refuse before anything is written.
  if (!sha256_available()) Sha256Hasher{};
  switch (opt.encryption) {
    case TensorizerEncryption::kNone:
      break;
    case TensorizerEncryption::kRandomKey:
      random_bytes(key);
      break;
    case TensorizerEncryption::kKey: {
      auto k = parse_key(opt.key);
      if (!k) invalid(sink, {}, "encryption key must be 32 raw bytes or 64 hex digits");
      key = *k;
      break;
    }
    case TensorizerEncryption::kPassword: {
      if (opt.password.empty()) invalid(sink, {}, "password encryption needs a password");
      KdfParams p;
      p.opslimit = opt.pwhash_opslimit;
      p.memlimit = opt.pwhash_memlimit;
      p.alg = kPwhashArgon2id13;
      p.salt.resize(kPwhashSaltBytes);
      random_bytes({reinterpret_cast<unsigned char*>(p.salt.data()), p.salt.size()});
      key = derive_key(opt.password, p);
      kdf = std::move(p);
      break;
    }
    case TensorizerEncryption::kKeyFile:  // resolve_key made it kKey or kRandomKey
      invalid(sink, {}, "a key file is read before writing");
  }

  // Plan: names, dtypes, versions, sizes.
  uint32_t version = kVersionNumpy;
  std::vector<Planned> plan(tensors.size());
  std::unordered_set<std::string> seen;
  uint64_t index_needed = 0, tensor_size = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorizerEntry& e = tensors[i];
    Planned& p = plan[i];
    p.entry = &e;
    const Tensor& t = e.tensor;
    if (e.path.empty()) {
      p.name = t.name();
    } else {
      for (const auto& c : e.path)
        if (auto* n = std::get_if<int64_t>(&c); n && *n < 0)
          invalid(sink, t.name(), "negative index in a tensor path");
      p.name = serialize_tensor_name(e.path);
    }
    if (p.name.empty()) invalid(sink, t.name(), "empty tensor name");
    if (p.name.size() > UINT16_MAX) invalid(sink, t.name(), "tensor name over 65535 bytes");
    if (!is_utf8(p.name)) invalid(sink, t.name(), "tensor name is not valid UTF-8");
    if (!seen.insert(p.name).second) invalid(sink, t.name(), "duplicate tensor name");
    bool opaque = false;
    auto ds = dtype_string(t.dtype(), &opaque);
    if (!ds)
      throw Error(ErrorCode::kUnsupported,
                  "tensorizer cannot store dtype " + std::string(dtype_name(t.dtype())),
                  sink.name(), t.name());
    p.dtype = *ds;
    if (opaque) version = std::max(version, kVersionOpaque);
    if (t.shape().size() > 255) invalid(sink, t.name(), "more than 255 dimensions");
    for (int64_t d : t.shape()) {
      if (d < 0 || static_cast<uint64_t>(d) > UINT32_MAX)
        invalid(sink, t.name(), "dimension " + std::to_string(d) + " does not fit a u32");
      p.shape.push_back(static_cast<uint32_t>(d));
    }
    internal::require_host_tensor(t, sink.name());
    p.meta = e.meta || (t.storage() && t.storage()->info.meta);
    if (p.meta) version = std::max(version, kVersionMeta);
    p.nbytes = p.meta ? 0 : t.info().nbytes();
    if (p.nbytes > 0 && !t.data() && !feed) invalid(sink, t.name(), "tensor has no bytes loaded");
    p.encrypt = enc && !p.meta;
    tensor_size += p.nbytes;
    index_needed += 2 + p.name.size() + 1 + 1 + p.dtype.size() + 1 + 4 * p.shape.size() + 24;
  }
  if (enc) version = std::max(version, kVersionEncryption);
  const uint64_t index_len = std::max(kIndexReserve, align_up(index_needed, kIndexReserve));

  // Layout: every header's size is known now (MACs are fixed-size placeholders).
  uint64_t offset = kPrologueBytes + index_len;
  for (Planned& p : plan) {
    if (p.encrypt) {
      p.crypt.kdf = kdf;
      CipherParams c;
      c.chunk_size = opt.crypt_chunk_size;
      random_bytes(c.nonce);
      c.macs.resize(chunk_count(c, p.nbytes));
      p.crypt.cipher = std::move(c);
    }
    p.header = build_tensor_header(p.entry->module_index, static_cast<uint8_t>(p.entry->type),
                                   p.name, p.dtype, p.shape, /*with_crc=*/!p.encrypt,
                                   /*with_sha=*/true, enc ? &p.crypt : nullptr,
                                   static_cast<int64_t>(p.nbytes));
    p.header_off = offset;
    offset += p.header.bytes.size() + p.nbytes;
  }

  // Small pieces are gathered into 1 MiB writes; big tensors go straight from their memory.
  Gather out(sink);
  const uint64_t base = sink.position();
  std::string pro(kMagic);
  append_le<uint32_t>(pro, version);
  std::string flags(32, '\0');
  if (enc && version >= kVersionMeta) flags[0] = static_cast<char>(kFlagEncrypted);
  pro += flags;
  append_le<uint64_t>(pro, tensor_size);
  append_le<uint64_t>(pro, 0);
  append_le<uint64_t>(pro, plan.size());
  append_le<uint64_t>(pro, index_len);
  out.write(pro);
  std::string index;
  index.reserve(index_len);
  for (const Planned& p : plan) {
    append_le<uint16_t>(index, static_cast<uint16_t>(p.name.size()));
    index += p.name;
    append_le<uint8_t>(index, static_cast<uint8_t>(p.entry->type));
    append_le<uint8_t>(index, static_cast<uint8_t>(p.dtype.size()));
    index += p.dtype;
    append_le<uint8_t>(index, static_cast<uint8_t>(p.shape.size()));
    for (uint32_t d : p.shape) append_le<uint32_t>(index, d);
    append_le<uint64_t>(index, base + p.header_off);
    append_le<uint64_t>(index, base + p.header_off + p.header.bytes.size());
    append_le<uint64_t>(index, p.nbytes);
  }
  index.resize(index_len, '\0');
  out.write(index);

  std::vector<std::byte> chunk;
  std::vector<const Tensor*> order(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) order[i] = &plan[i].entry->tensor;
  internal::feed_each(feed, order, [&](size_t i, const Tensor& t) {
    Planned& p = plan[i];
    std::vector<std::byte> copy;
    std::span<const std::byte> bytes;
    if (p.nbytes > 0) {
      if (t.info().is_contiguous()) {
        bytes = {t.data(), p.nbytes};
      } else {
        copy = t.contiguous_bytes();
        bytes = copy;
      }
    }
    std::string& hb = p.header.bytes;
    if (!p.encrypt) {
      uint32_t crc = crc32_update(crc32(as_bytes(p.header.hashable)), bytes);
      Sha256Hasher sha;
      sha.update(p.header.hashable);
      sha.update(bytes);
      Sha256 digest = sha.finish();
      store_le<uint32_t>(reinterpret_cast<std::byte*>(hb.data() + p.header.crc_at), crc);
      std::memcpy(hb.data() + p.header.sha_at, digest.data(), digest.size());
      out.write(hb);
      out.write(bytes);
      return;
    }
    // Encrypted: hash the plaintext, encrypt chunk by chunk through a buffer, then patch the
    // header with the hash and the MACs.
    out.write(hb);
    out.flush();
    Sha256Hasher sha;
    sha.update(p.header.hashable);
    sha.update(bytes);
    CipherParams& c = *p.crypt.cipher;
    chunk.resize(std::min<uint64_t>(c.chunk_size, p.nbytes));
    for (uint64_t i = 0, done = 0; done < p.nbytes; ++i) {
      uint64_t n = std::min<uint64_t>(c.chunk_size, p.nbytes - done);
      c.macs[i] = encrypt_chunk(key, nonce_at(c.nonce, i), bytes.data() + done, chunk.data(), n);
      sink.write({chunk.data(), n});
      done += n;
    }
    BuiltHeader final_header = build_tensor_header(
        p.entry->module_index, static_cast<uint8_t>(p.entry->type), p.name, p.dtype, p.shape, false,
        true, &p.crypt, static_cast<int64_t>(p.nbytes));
    Sha256 digest = sha.finish();
    std::memcpy(final_header.bytes.data() + final_header.sha_at, digest.data(), digest.size());
    sink.patch(base + p.header_off, as_bytes(final_header.bytes));
  });
  std::string end;
  append_le<uint64_t>(end, 0);
  out.write(end);
  out.flush();
  wipe(chunk.data(), chunk.size());
  return enc ? std::string(reinterpret_cast<const char*>(key.data()), key.size()) : std::string();
}

}  // namespace

std::string save_tensorizer(ByteSink& sink, const std::vector<TensorizerEntry>& tensors,
                            const TensorizerSaveOptions& options) {
  return write_tensorizer(sink, tensors, resolve_key(options).options, nullptr);
}

std::string save_tensorizer(const std::string& path, const std::vector<TensorizerEntry>& tensors,
                            const TensorizerSaveOptions& options) {
  ResolvedKey r = resolve_key(options);
  TensorizerSaveOptions& opt = r.options;
  const FileSinkOptions fso{options.atomic, options.fsync};
  if (opt.encryption == TensorizerEncryption::kRandomKey) {
    if (r.new_key_file.empty())
      throw Error(ErrorCode::kInvalidArgument, "random-key encryption needs a key_file", path);
    // The key is written (and committed) first: a file whose key was lost is unreadable.
    Key key;
    random_bytes(key);
    auto ks = create_file_sink(r.new_key_file, fso);
    ks->write(to_hex(key) + "\n");
    ks->commit();
    opt.encryption = TensorizerEncryption::kKey;
    opt.key.assign(reinterpret_cast<const char*>(key.data()), key.size());
  }
  auto sink = create_file_sink(path, fso);
  std::string key = write_tensorizer(*sink, tensors, opt, nullptr);
  sink->commit();
  return key;
}

std::string save_tensorizer(const std::string& path, const std::vector<Tensor>& tensors,
                            const TensorizerSaveOptions& options) {
  std::vector<TensorizerEntry> entries(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) entries[i].tensor = tensors[i];
  return save_tensorizer(path, entries, options);
}

namespace internal {
namespace {

class TensorizerWriter final : public Writer {
 public:
  explicit TensorizerWriter(const TensorizerSaveOptions& o) : o_(o) {}
  const WriterCaps& caps() const override {
    static const WriterCaps caps = [] {
      WriterCaps c;
      c.format = "tensorizer";
      c.copies_shared = true;  // every tensor is stored on its own
      c.meta_tensors = true;
      c.encryption = true;
      c.patches = true;  // encrypted tensors' headers, once their MACs are known
      return c;
    }();
    return caps;
  }
  bool holds(DType dtype) const override {
    bool opaque = false;
    return tzr::dtype_string(dtype, &opaque).has_value();
  }
  bool encrypts() const override { return o_.encryption != TensorizerEncryption::kNone; }
  // A tensor's TensorInfo::type "param" or "buffer" becomes its TensorType; a tensor whose
  // storage is meta is stored as a meta tensor.
  WriteResult write(WriteOutput& out, WriteContent& content) override {
    std::vector<TensorizerEntry> entries;
    entries.reserve(content.tensors.size());
    for (auto& t : content.tensors) {
      TensorizerEntry e;
      if (t.info().type == "param") e.type = TensorizerTensorType::kParam;
      if (t.info().type == "buffer") e.type = TensorizerTensorType::kBuffer;
      e.meta = t.storage() && t.storage()->info.meta;
      e.tensor = std::move(t);
      entries.push_back(std::move(e));
    }
    content.tensors.clear();
    WriteResult r;
    r.key = write_tensorizer(out.file(), entries, o_, content.feed.get());
    return r;
  }

 private:
  TensorizerSaveOptions o_;
};

}  // namespace

std::unique_ptr<Writer> make_tensorizer_writer(const TensorizerSaveOptions& options) {
  return std::make_unique<TensorizerWriter>(options);
}

}  // namespace internal

}  // namespace ckpt
