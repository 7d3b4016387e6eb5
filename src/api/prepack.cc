// The pre-pack cache (include/ckpt/prepack.h): one file per entry, mapped shared read-only.
//
//   entry file  "CKPTPACK" | u64 payload offset | u64 payload size | u32 key size | key bytes |
//               zero padding to the payload offset (a multiple of the alignment) | payload
//
// Its name is the SHA-256 of the key; the key stored inside is compared on every hit, so a
// collision or a foreign file is a miss, never a wrong blob.

#include "ckpt/prepack.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "io/temporaries.h"
#include "util/crc32.h"
#include "util/sha256.h"
#include "util/text.h"

namespace ckpt {

namespace {

constexpr char kMagic[8] = {'C', 'K', 'P', 'T', 'P', 'A', 'C', 'K'};
constexpr size_t kFixedHeader = 8 + 8 + 8 + 4;

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw Error(ErrorCode::kIo, what + ": " + std::strerror(errno), path);
}

std::string cpu_features() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  std::string f = "x86_64";
  if (__builtin_cpu_supports("avx2")) f += "+avx2";
  if (__builtin_cpu_supports("fma")) f += "+fma";
  if (__builtin_cpu_supports("avx512f")) f += "+avx512f";
  return f;
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "generic";
#endif
}

using internal::sha256_hex;

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

struct Mapping {
  void* p = nullptr;
  size_t n = 0;
  ~Mapping() {
    if (p && p != MAP_FAILED) ::munmap(p, n);
  }
};

uint64_t load_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Maps an entry whose key is `key`; nullopt when it is absent or not this key's entry.
std::optional<PackedBlob> map_entry(const std::string& path, const std::string& key) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    io_error("cannot open the cache entry", path);
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) io_error("cannot stat the cache entry", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kFixedHeader + key.size()) return std::nullopt;
  std::vector<unsigned char> head(kFixedHeader + key.size());
  if (::pread(f.fd, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size()))
    return std::nullopt;
  if (std::memcmp(head.data(), kMagic, 8) != 0) return std::nullopt;
  uint64_t off = load_u64(head.data() + 8), n = load_u64(head.data() + 16);
  uint32_t klen = static_cast<uint32_t>(load_u64(head.data() + 24) & 0xffffffffu);
  if (klen != key.size() || off > size || n != size - off ||
      std::memcmp(head.data() + kFixedHeader, key.data(), key.size()) != 0)
    return std::nullopt;
  auto m = std::make_shared<Mapping>();
  m->n = static_cast<size_t>(size);
  m->p = ::mmap(nullptr, m->n, PROT_READ, MAP_SHARED, f.fd, 0);
  if (m->p == MAP_FAILED) io_error("cannot map the cache entry", path);
  // Least recently used is by access time: set it (mounts with noatime would not).
  struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
  ::futimens(f.fd, times);
  PackedBlob b;
  b.bytes = {static_cast<const std::byte*>(m->p) + off, static_cast<size_t>(n)};
  b.owner = m;
  b.path = path;
  return b;
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  auto* c = static_cast<const char*>(p);
  while (n) {
    ssize_t k = ::write(fd, c, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      io_error("cannot write the cache entry", path);
    }
    c += k;
    n -= static_cast<size_t>(k);
  }
}

void store_entry(const std::string& dir, const std::string& path, const std::string& key,
                 std::span<const std::byte> payload, uint64_t alignment) {
  // A registered temporary (io/temporaries.h): a SIGINT/SIGTERM/SIGHUP while it is written
  // removes it (remove_temporaries_now), as for every other atomic writer.
  io::Temporary t =
      io::create_temporary(dir, std::filesystem::path(path).filename().string(), false, 0600);
  const std::string tmpl = t.path;
  const int fd = t.fd;
  Fd f(fd);
  struct Release {
    int slot;
    ~Release() { io::release_temporary(slot); }
  } release{t.slot};
  ::flock(fd, LOCK_EX | LOCK_NB);  // the sign of a live writer (sweep_stale_temporaries)
  try {
    // Shared by every process on the machine: readable by all (mkostemp made it 0600; umask is
    // not read: changing it to read it would race with other threads).
    if (::fchmod(fd, 0644) != 0) io_error("cannot set the cache entry's mode", tmpl);
    const uint64_t off = (kFixedHeader + key.size() + alignment - 1) / alignment * alignment;
    std::vector<unsigned char> head(static_cast<size_t>(off), 0);
    std::memcpy(head.data(), kMagic, 8);
    for (int i = 0; i < 8; ++i) {
      head[8 + i] = static_cast<unsigned char>(off >> (8 * i));
      head[16 + i] = static_cast<unsigned char>(uint64_t{payload.size()} >> (8 * i));
    }
    for (int i = 0; i < 4; ++i) head[24 + i] = static_cast<unsigned char>(key.size() >> (8 * i));
    std::memcpy(head.data() + kFixedHeader, key.data(), key.size());
    write_all(fd, head.data(), head.size(), tmpl);
    write_all(fd, payload.data(), payload.size(), tmpl);
    if (::fdatasync(fd) != 0) io_error("cannot sync the cache entry", tmpl);
    if (::rename(tmpl.c_str(), path.c_str()) != 0) io_error("cannot rename the cache entry", path);
  } catch (...) {
    ::unlink(tmpl.c_str());
    throw;
  }
}

template <size_t ES>
void transpose_blocks(const std::byte* src, std::byte* dst, size_t R, size_t C, size_t B) {
  const size_t nb = (C + B - 1) / B;
  for (size_t jb = 0; jb < nb; ++jb)
    for (size_t r = 0; r < R; ++r) {
      const std::byte* row = src + (r * C) * ES;
      for (size_t c = 0; c < B; ++c) {
        size_t col = jb * B + c;
        std::byte* d = dst + ((jb * B + c) * R + r) * ES;
        if (col < C) std::memcpy(d, row + col * ES, ES);
      }
    }
}

std::vector<std::byte> tensor_bytes(const Tensor& t) {
  if (t.info().is_contiguous())
    return std::vector<std::byte>(t.data(), t.data() + t.info().nbytes());
  return t.contiguous_bytes();
}

}  // namespace

Packer transpose_blocks_packer() {
  Packer p;
  p.id = "transpose-blocks64";
  p.version = 1;
  p.pack = [](const Tensor& t) {
    const auto& s = t.shape();
    size_t es = dtype_size(t.dtype());
    if (s.size() != 2 || es == 0 || (es != 1 && es != 2 && es != 4 && es != 8))
      throw Error(ErrorCode::kInvalidArgument,
                  "transpose-blocks64 packs 2-D tensors of 1, 2, 4 or 8-byte elements", {},
                  t.name());
    const size_t R = static_cast<size_t>(s[0]), C = static_cast<size_t>(s[1]), B = 64;
    std::vector<std::byte> in;
    const std::byte* src = t.data();
    if (!t.info().is_contiguous()) {
      in = t.contiguous_bytes();
      src = in.data();
    }
    std::vector<std::byte> out(((C + B - 1) / B) * B * R * es);
    switch (es) {
      case 1:
        transpose_blocks<1>(src, out.data(), R, C, B);
        break;
      case 2:
        transpose_blocks<2>(src, out.data(), R, C, B);
        break;
      case 4:
        transpose_blocks<4>(src, out.data(), R, C, B);
        break;
      default:
        transpose_blocks<8>(src, out.data(), R, C, B);
        break;
    }
    return out;
  };
  return p;
}

Packer int8_rows_packer() {
  Packer p;
  p.id = "int8-rows";
  p.version = 1;
  p.pack = [](const Tensor& t) {
    const auto& s = t.shape();
    if (s.size() != 2 || t.dtype() != DType::kFloat32)
      throw Error(ErrorCode::kInvalidArgument, "int8-rows packs 2-D float32 tensors", {}, t.name());
    const size_t R = static_cast<size_t>(s[0]), C = static_cast<size_t>(s[1]);
    std::vector<std::byte> in;
    const float* x = reinterpret_cast<const float*>(t.data());
    if (!t.info().is_contiguous()) {
      in = t.contiguous_bytes();
      x = reinterpret_cast<const float*>(in.data());
    }
    std::vector<std::byte> out(R * 4 + R * C);
    auto* scales = reinterpret_cast<float*>(out.data());
    auto* q = reinterpret_cast<int8_t*>(out.data() + R * 4);
    for (size_t r = 0; r < R; ++r) {
      const float* row = x + r * C;
      float m = 0;
      for (size_t c = 0; c < C; ++c) m = std::max(m, std::fabs(row[c]));
      float scale = m > 0 ? m / 127.0f : 1.0f;
      float inv = 1.0f / scale;
      std::memcpy(&scales[r], &scale, 4);
      for (size_t c = 0; c < C; ++c) {
        float v = std::nearbyint(row[c] * inv);
        q[r * C + c] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
      }
    }
    return out;
  };
  return p;
}

std::string prepack_cache_dir(const Checkpoint& c, const PrepackCacheOptions& o) {
  if (!o.dir.empty()) return o.dir;
  if (o.xdg) {
    const char* x = std::getenv("XDG_CACHE_HOME");
    if (x && *x) return std::string(x) + "/ckpt";
    const char* home = std::getenv("HOME");
    if (!home || !*home)
      throw Error(ErrorCode::kInvalidArgument, "neither XDG_CACHE_HOME nor HOME is set");
    return std::string(home) + "/.cache/ckpt";
  }
  return c.source().name() + ".ckpt-prepack";
}

PackedBlob prepack(const Checkpoint& c, const std::string& name, const Packer& packer,
                   const PrepackCacheOptions& o) {
  if (o.alignment == 0 || (o.alignment & (o.alignment - 1)) || o.alignment < 64)
    throw Error(ErrorCode::kInvalidArgument,
                "the cache alignment must be a power of two of at least 64");
  auto idx = c.find(name);
  if (!idx)
    throw Error(ErrorCode::kNotFound, "no tensor named \"" + name + "\"", c.source().name());
  const TensorInfo& info = c.tensors()[*idx];
  const StorageInfo& si = c.storages()[info.storage];
  // The digest: the format's CRC32 of the storage when the tensor is all of it, else computed.
  std::string digest;
  Tensor t;
  if (si.crc32 && info.byte_offset() == 0 && info.is_contiguous() && si.nbytes == info.nbytes()) {
    digest = "crc32:" + internal::hex32(*si.crc32);
  } else {
    t = c.tensor(*idx);
    auto b = tensor_bytes(t);
    digest = "crc32:" + internal::hex32(internal::crc32(b));
  }
  std::string shape;
  for (int64_t d : info.shape) shape += std::to_string(d) + ",";
  const std::string key =
      "ckpt-prepack 1\ntensor=" + name + "\ndtype=" + std::string(dtype_name(info.dtype)) +
      "\nshape=" + shape + "\nnbytes=" + std::to_string(info.nbytes()) + "\ndigest=" + digest +
      "\npacker=" + packer.id + "@" + std::to_string(packer.version) + "\ncpu=" + cpu_features() +
      "\nalign=" + std::to_string(o.alignment) + "\n";
  const std::string dir = prepack_cache_dir(c, o);
  const std::string path = dir + "/" + sha256_hex(key) + ".blob";
  if (auto hit = map_entry(path, key)) {
    hit->hit = true;
    return *hit;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot create the cache folder: " + ec.message(), dir);
  // One process packs; the others wait on the lock and then map its entry.
  const std::string lock_path = path + ".lock";
  Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.fd < 0) io_error("cannot open the cache lock", lock_path);
  while (::flock(lock.fd, LOCK_EX) != 0)
    if (errno != EINTR) io_error("cannot lock the cache entry", lock_path);
  if (auto hit = map_entry(path, key)) {
    hit->hit = true;
    return *hit;
  }
  if (!t.storage()) t = c.tensor(*idx);
  std::vector<std::byte> packed = packer.pack(t);
  store_entry(dir, path, key, packed, o.alignment);
  auto b = map_entry(path, key);
  if (!b) throw Error(ErrorCode::kIo, "the cache entry just written cannot be read back", path);
  ::unlink(lock_path.c_str());  // (a waiter holding it still sees the entry once it runs)
  if (o.max_bytes) prepack_gc(dir, o.max_bytes);
  return *b;
}

PrepackGcReport prepack_gc(const std::string& dir, uint64_t max_bytes) {
  PrepackGcReport r;
  struct Entry {
    std::string path;
    uint64_t size;
    struct timespec atime;
  };
  std::vector<Entry> entries;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT) return r;
    io_error("cannot read the cache folder", dir);
  }
  const time_t now = ::time(nullptr);
  for (size_t count = 0; count < 10'000'000; ++count) {
    struct dirent* e = ::readdir(d);
    if (!e) break;
    std::string name = e->d_name;
    std::string p = dir + "/" + name;
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".blob") == 0) {
      entries.push_back({p, static_cast<uint64_t>(st.st_size), st.st_atim});
      r.bytes_before += static_cast<uint64_t>(st.st_size);
    } else if (name[0] == '.' && name.find(".tmp-") != std::string::npos &&
               now - st.st_mtime > 60) {
      if (::unlink(p.c_str()) == 0) ++r.temporaries_removed;
    }
  }
  ::closedir(d);
  r.entries_before = entries.size();
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.atime.tv_sec != b.atime.tv_sec ? a.atime.tv_sec < b.atime.tv_sec
                                            : a.atime.tv_nsec < b.atime.tv_nsec;
  });
  uint64_t total = r.bytes_before;
  size_t left = entries.size();
  for (const Entry& e : entries) {
    if (total <= max_bytes) break;
    if (::unlink(e.path.c_str()) == 0) {
      total -= e.size;
      --left;
    }
  }
  r.entries_after = left;
  r.bytes_after = total;
  return r;
}

}  // namespace ckpt
