// SHA-256 digests of tensors (their logical bytes), files, manifests, and the digests stored in
// safetensors __metadata__ (include/ckpt/digest.h).
//
// This lives in the convert layer, not in api: a digest is named by flatten_state_dict(), the
// names a flat format stores, so that a manifest made from a .pt names the tensors of the
// .safetensors converted from it the same way.

#include "ckpt/digest.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "ckpt/convert.h"
#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "convert/digest_internal.h"
#include "util/arena.h"
#include "util/progress.h"
#include "util/sha256.h"

namespace ckpt {
namespace {

// One SHA-256 computation (util/sha256.h: OpenSSL, else libsodium; refused without either).
using Hasher = internal::Sha256Stream;

// Feeds the elements of a strided tensor in row-major order. The innermost dimensions that are
// laid out contiguously form one block; blocks are gathered into a buffer so that small blocks
// (a transposed matrix: one element each) do not cost a digest call each.
void hash_strided(Hasher& h, const TensorInfo& info, const std::byte* base, size_t es) {
  const auto& shape = info.shape;
  const auto& strides = info.strides;
  const size_t nd = shape.size();
  // Dimensions [inner, nd) are contiguous: block of `block` elements.
  size_t inner = nd;
  uint64_t block = 1;
  while (inner > 0) {
    const size_t d = inner - 1;
    if (shape[d] != 1 && strides[d] != static_cast<int64_t>(block)) break;
    block *= static_cast<uint64_t>(shape[d]);
    inner = d;
  }
  const uint64_t block_bytes = block * es;
  constexpr size_t kBuf = 256 << 10;
  std::vector<std::byte> buf;
  if (block_bytes < kBuf) buf.reserve(kBuf);
  auto flush = [&] {
    h.update(buf.data(), buf.size());
    buf.clear();
  };
  std::vector<int64_t> idx(inner, 0);
  while (true) {
    int64_t off = 0;
    for (size_t d = 0; d < inner; ++d) off += idx[d] * strides[d];
    const std::byte* p = base + static_cast<uint64_t>(off) * es;
    if (block_bytes >= kBuf) {
      h.update(p, block_bytes);
    } else {
      if (buf.size() + block_bytes > kBuf) flush();
      buf.insert(buf.end(), p, p + block_bytes);
    }
    // Next outer index (odometer).
    size_t d = inner;
    while (d > 0) {
      --d;
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
      if (d == 0) {
        d = SIZE_MAX;
        break;
      }
    }
    if (inner == 0 || d == SIZE_MAX) break;
  }
  flush();
}

std::string base_name(const std::string& path) {
  std::string b = std::filesystem::path(path).filename().string();
  return b.empty() ? path : b;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Runs fn(i) for i in [0, n) on up to `threads` threads; the first exception is rethrown.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn) {
  const size_t nt = std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1)));
  if (nt <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(nt - 1);
  for (size_t t = 1; t < nt; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

std::string to_hex(const Sha256& d) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = kDigits[d[i] >> 4];
    s[2 * i + 1] = kDigits[d[i] & 15];
  }
  return s;
}

std::optional<Sha256> sha256_from_hex(std::string_view hex) noexcept {
  if (hex.size() != 64) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Sha256 d{};
  for (size_t i = 0; i < d.size(); ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    d[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return d;
}

Sha256 sha256(std::span<const std::byte> bytes) {
  Hasher h;
  h.update(bytes.data(), bytes.size());
  return h.finish();
}

// Hosts are little-endian (the library loads tensors in native order and assumes it), so a
// loaded tensor's bytes are its little-endian logical bytes.
Sha256 tensor_sha256(const Tensor& t) {
  const TensorInfo& info = t.info();
  Hasher h;
  const uint64_t nbytes = info.nbytes();
  if (nbytes == 0) return h.finish();
  if (!t.data())
    throw Error(ErrorCode::kInvalidArgument, "tensor has no bytes loaded", {}, info.name);
  if (info.is_contiguous()) {
    h.update(t.data(), nbytes);
  } else {
    const size_t es = dtype_size(info.dtype);
    if (es == 0)
      throw Error(ErrorCode::kUnsupported, "a non-contiguous sub-byte tensor cannot be hashed", {},
                  info.name);
    hash_strided(h, info, t.data(), es);
  }
  return h.finish();
}

FileDigest file_digest(const ByteSource& source) {
  std::shared_ptr<const ByteSource> twin = source.memory() ? source.pread_twin() : nullptr;
  const ByteSource& src = twin ? *twin : source;
  FileDigest f;
  f.name = base_name(source.name());
  f.size = source.size();
  Hasher h;
  if (source.memory() && !twin) {
    h.update(source.memory(), f.size);
  } else {
    constexpr uint64_t kPiece = 4 << 20;
    std::vector<std::byte> buf(std::min<uint64_t>(kPiece, f.size));
    for (uint64_t off = 0; off < f.size; off += kPiece) {
      const uint64_t n = std::min(kPiece, f.size - off);
      src.read_into(off, std::span<std::byte>(buf.data(), n));
      h.update(buf.data(), n);
    }
  }
  f.sha256 = h.finish();
  return f;
}

FileDigest file_digest(const std::string& path) { return file_digest(*open_source(path, false)); }

std::vector<TensorDigest> tensor_digests(const Checkpoint& c, const DigestOptions& options) {
  const FlatStateDict flat = flatten_state_dict(c);
  const auto& infos = c.tensors();
  const auto& storages = c.storages();
  // Each distinct tensor once, grouped by storage (each storage is read once).
  std::unordered_map<size_t, size_t> slot_of;  // tensor index -> slot in `digests`
  std::vector<size_t> tensor_of_slot;
  for (const auto& e : flat.entries)
    if (slot_of.emplace(e.tensor, tensor_of_slot.size()).second) tensor_of_slot.push_back(e.tensor);
  std::vector<std::vector<size_t>> by_storage;  // slots per used storage
  std::unordered_map<size_t, size_t> group_of;  // storage -> index in by_storage
  for (size_t slot = 0; slot < tensor_of_slot.size(); ++slot) {
    size_t s = infos[tensor_of_slot[slot]].storage;
    auto [it, added] = group_of.emplace(s, by_storage.size());
    if (added) by_storage.emplace_back();
    by_storage[it->second].push_back(slot);
  }
  std::vector<TensorDigest> digests(tensor_of_slot.size());
  auto digest_of_tensor = [&](size_t index) {
    // Quantization parameters' own tensors (per-channel scales, zero points).
    return tensor_sha256(c.tensor(index, options.load));
  };
  const int threads = options.threads > 0 ? options.threads : internal::default_threads();
  // Progress: the bytes of the storages hashed (LoadOptions::progress).
  uint64_t total = 0;
  if (options.load.progress)
    for (const auto& group : by_storage)
      total += storages.at(infos[tensor_of_slot[group[0]]].storage).nbytes;
  internal::ProgressMeter meter(options.load.progress, total);
  parallel_for(by_storage.size(), threads, [&](size_t g) {
    const size_t s = infos[tensor_of_slot[by_storage[g][0]]].storage;
    StoragePtr st;
    if (!storages.at(s).meta) st = c.storage(s, options.load);
    meter.add(storages.at(s).nbytes);
    for (size_t slot : by_storage[g]) {
      const TensorInfo& info = infos[tensor_of_slot[slot]];
      TensorDigest& d = digests[slot];
      d.dtype = info.dtype;
      d.shape = info.shape;
      if (st) {
        try {
          d.sha256 = tensor_sha256(Tensor(info, st));
        } catch (Error& e) {
          e.with_source(c.source().name()).with_record(info.name);
          throw;
        }
      } else {
        d.meta = true;
      }
      if (info.quantization) {
        const Quantization& q = *info.quantization;
        QuantizationDigest qd;
        qd.scheme = q.scheme;
        qd.scale = q.scale;
        qd.zero_point = q.zero_point;
        qd.axis = q.axis;
        if (q.scales_tensor) qd.scales_sha256 = digest_of_tensor(*q.scales_tensor);
        if (q.zero_points_tensor) qd.zero_points_sha256 = digest_of_tensor(*q.zero_points_tensor);
        d.quantization = std::move(qd);
      }
    }
  });
  meter.finish();
  std::vector<TensorDigest> out;
  out.reserve(flat.entries.size());
  for (const auto& e : flat.entries) {
    out.push_back(digests[slot_of.at(e.tensor)]);
    out.back().name = e.name;
  }
  return out;
}

namespace internal {

std::vector<std::optional<Sha256>> tensor_sha256_all(const std::vector<Tensor>& tensors,
                                                     const std::vector<bool>& want, int threads) {
  std::vector<std::optional<Sha256>> out(tensors.size());
  parallel_for(tensors.size(), threads > 0 ? threads : default_threads(), [&](size_t i) {
    if (want.empty() || want[i]) out[i] = tensor_sha256(tensors[i]);
  });
  return out;
}

}  // namespace internal

// ---------------------------------------------------------------------------------------------
// Manifests

std::string manifest_to_json(const DigestManifest& m) {
  using nlohmann::json;
  std::string s = "{\n  \"ckpt_digest\": 1,\n  \"algorithm\": \"sha256\",\n";
  if (m.file)
    s += "  \"file\": {\"name\": " + json(m.file->name).dump() +
         ", \"size\": " + std::to_string(m.file->size) + ", \"sha256\": \"" +
         to_hex(m.file->sha256) + "\"},\n";
  s += "  \"tensors\": {";
  bool first = true;
  for (const TensorDigest& d : m.tensors) {
    s += first ? "\n    " : ",\n    ";
    first = false;
    s += json(d.name).dump() + ": {\"dtype\": " + json(std::string(dtype_name(d.dtype))).dump() +
         ", \"shape\": " + shape_text(d.shape);
    if (d.meta) s += ", \"meta\": true";
    if (d.sha256) s += ", \"sha256\": \"" + to_hex(*d.sha256) + "\"";
    if (d.quantization) {
      const QuantizationDigest& q = *d.quantization;
      json o = json::object();
      o["scheme"] = q.scheme;
      o["scale"] = q.scale;
      o["zero_point"] = q.zero_point;
      o["axis"] = q.axis;
      if (q.scales_sha256) o["scales_sha256"] = to_hex(*q.scales_sha256);
      if (q.zero_points_sha256) o["zero_points_sha256"] = to_hex(*q.zero_points_sha256);
      s += ", \"quantization\": " + o.dump();
    }
    s += "}";
  }
  s += first ? "}\n}\n" : "\n  }\n}\n";
  return s;
}

DigestManifest manifest_from_json(std::string_view text, const std::string& source) {
  using nlohmann::ordered_json;
  auto bad = [&](const std::string& what, const std::string& tensor = {}) {
    return Error(ErrorCode::kInvalidArgument, "not a ckpt digest manifest: " + what, source,
                 tensor);
  };
  ordered_json j;
  try {
    j = ordered_json::parse(text.begin(), text.end());
  } catch (const std::exception& e) {
    throw bad(std::string("invalid JSON (") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("ckpt_digest")) throw bad("no \"ckpt_digest\" key");
  if (j["ckpt_digest"] != 1) throw bad("unknown version " + j["ckpt_digest"].dump());
  if (j.contains("algorithm") && j["algorithm"] != "sha256")
    throw bad("unknown algorithm " + j["algorithm"].dump());
  auto hex_of = [&](const ordered_json& v, const std::string& what, const std::string& tensor) {
    std::optional<Sha256> d;
    if (v.is_string()) d = sha256_from_hex(v.get<std::string>());
    if (!d) throw bad(what + " is not 64 hex digits", tensor);
    return *d;
  };
  DigestManifest m;
  try {
    if (j.contains("file") && !j["file"].is_null()) {
      const auto& f = j["file"];
      if (!f.is_object()) throw bad("\"file\" is not an object");
      FileDigest fd;
      if (f.contains("name")) fd.name = f["name"].get<std::string>();
      if (f.contains("size")) fd.size = f["size"].get<uint64_t>();
      fd.sha256 = hex_of(f.value("sha256", ordered_json()), "file sha256", {});
      m.file = std::move(fd);
    }
    if (!j.contains("tensors") || !j["tensors"].is_object()) throw bad("no \"tensors\" object");
    for (const auto& [name, t] : j["tensors"].items()) {
      if (!t.is_object()) throw bad("entry is not an object", name);
      TensorDigest d;
      d.name = name;
      if (!t.contains("dtype") || !t["dtype"].is_string()) throw bad("no dtype", name);
      auto dt = dtype_from_name(t["dtype"].get<std::string>());
      if (!dt) throw bad("unknown dtype " + t["dtype"].dump(), name);
      d.dtype = *dt;
      if (!t.contains("shape") || !t["shape"].is_array()) throw bad("no shape", name);
      for (const auto& x : t["shape"]) {
        if (!x.is_number_integer()) throw bad("shape is not a list of integers", name);
        d.shape.push_back(x.get<int64_t>());
      }
      d.meta = t.value("meta", false);
      if (t.contains("sha256")) d.sha256 = hex_of(t["sha256"], "sha256", name);
      if (!d.meta && !d.sha256) throw bad("no sha256", name);
      if (t.contains("quantization")) {
        const auto& q = t["quantization"];
        if (!q.is_object()) throw bad("quantization is not an object", name);
        QuantizationDigest qd;
        qd.scheme = q.value("scheme", std::string());
        qd.scale = q.value("scale", 0.0);
        qd.zero_point = q.value("zero_point", int64_t{0});
        qd.axis = q.value("axis", int64_t{0});
        if (q.contains("scales_sha256"))
          qd.scales_sha256 = hex_of(q["scales_sha256"], "scales_sha256", name);
        if (q.contains("zero_points_sha256"))
          qd.zero_points_sha256 = hex_of(q["zero_points_sha256"], "zero_points_sha256", name);
        d.quantization = std::move(qd);
      }
      m.tensors.push_back(std::move(d));
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("a value of the wrong type (") + e.what() + ")");
  }
  return m;
}

DigestManifest read_manifest(const std::string& path, const Limits& limits) {
  SourcePtr src = open_file_source(path);
  if (src->size() > limits.max_metadata_bytes)
    throw Error(ErrorCode::kLimitExceeded,
                "manifest of " + std::to_string(src->size()) +
                    " bytes exceeds Limits::max_metadata_bytes (" +
                    std::to_string(limits.max_metadata_bytes) + ")",
                path);
  std::string text(src->size(), '\0');
  src->read_into(0, std::span<std::byte>(reinterpret_cast<std::byte*>(text.data()), text.size()));
  return manifest_from_json(text, path);
}

std::vector<DigestMismatch> compare_digests(const std::vector<TensorDigest>& expected,
                                            const std::vector<TensorDigest>& actual) {
  std::unordered_map<std::string_view, const TensorDigest*> have;
  for (const auto& d : actual) have.emplace(d.name, &d);
  std::unordered_map<std::string_view, bool> wanted;
  std::vector<DigestMismatch> out;
  for (const auto& e : expected) {
    wanted.emplace(e.name, true);
    auto it = have.find(e.name);
    if (it == have.end()) {
      out.push_back({e.name, "not in the file"});
      continue;
    }
    const TensorDigest& a = *it->second;
    if (a.dtype != e.dtype) {
      out.push_back({e.name, "dtype " + std::string(dtype_name(a.dtype)) + ", expected " +
                                 std::string(dtype_name(e.dtype))});
      continue;
    }
    if (a.shape != e.shape) {
      out.push_back({e.name, "shape " + shape_text(a.shape) + ", expected " + shape_text(e.shape)});
      continue;
    }
    if (a.meta != e.meta) {
      out.push_back({e.name, a.meta ? "a meta tensor (no bytes), expected bytes"
                                    : "has bytes, expected a meta tensor"});
      continue;
    }
    if (a.quantization != e.quantization) {
      out.push_back({e.name, "quantization parameters differ"});
      continue;
    }
    if (a.sha256 != e.sha256)
      out.push_back({e.name, "SHA-256 " + (a.sha256 ? to_hex(*a.sha256) : std::string("none")) +
                                 ", expected " +
                                 (e.sha256 ? to_hex(*e.sha256) : std::string("none"))});
  }
  for (const auto& a : actual)
    if (!wanted.count(a.name)) out.push_back({a.name, "not in the manifest"});
  return out;
}

// ---------------------------------------------------------------------------------------------
// Digests in safetensors __metadata__

std::string safetensors_digest_metadata(const std::vector<TensorDigest>& digests) {
  std::map<std::string, std::string> sorted;
  for (const auto& d : digests)
    if (d.sha256) sorted[d.name] = to_hex(*d.sha256);
  return nlohmann::json(sorted).dump();
}

std::optional<std::vector<TensorDigest>> stored_digests(const Checkpoint& c) {
  if (!c.shards().empty()) {
    // A set: every shard's own digests (as `convert --max-shard-size --digests` stores them), if
    // every shard has them; a set where some shards have none is not covered.
    std::vector<TensorDigest> all;
    for (const Checkpoint& shard : c.shards()) {
      auto part = stored_digests(shard);
      if (!part) return std::nullopt;
      for (auto& d : *part) all.push_back(std::move(d));
    }
    return all;
  }
  if (!format_traits(c.format()).metadata) return std::nullopt;
  auto it = c.properties().find(std::string("metadata.") + kSafetensorsDigestKey);
  if (it == c.properties().end()) return std::nullopt;
  auto bad = [&](const std::string& what, const std::string& tensor = {}) {
    return Error(ErrorCode::kCorrupt,
                 std::string("__metadata__ \"") + kSafetensorsDigestKey + "\": " + what,
                 c.source().name(), tensor);
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const std::exception&) {
    throw bad("not a JSON object");
  }
  if (!j.is_object()) throw bad("not a JSON object");
  std::vector<TensorDigest> out;
  out.reserve(j.size());
  for (const auto& [name, v] : j.items()) {
    std::optional<Sha256> d;
    if (v.is_string()) d = sha256_from_hex(v.get<std::string>());
    if (!d) throw bad("the digest is not 64 hex digits", name);
    TensorDigest td;
    td.name = name;
    td.sha256 = d;
    if (auto i = c.find(name)) {
      td.dtype = c.tensors()[*i].dtype;
      td.shape = c.tensors()[*i].shape;
    }
    out.push_back(std::move(td));
  }
  return out;
}

}  // namespace ckpt
