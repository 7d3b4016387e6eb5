// ckpt load FILE [--mode eager|mmap|stream] [--device cuda:N [--gds]] [--budget-mb N] [--verify]
// [--drop-cache] [--json]: loads every tensor once and reports time, throughput, the device path
// and this process's peak RSS (used by `ckpt bench` to measure memory and the first load in a
// fresh process). With --rank/--world/--plan: the dry run of one rank's load (rank_plan_print.cc).

#include <sys/resource.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common.h"
#include "progress.h"
#include "rank_plan_print.h"

namespace ckpt::cli {
namespace {

// What the flags say.
struct LoadFlags {
  std::vector<std::string> files;  // one checkpoint, an index, or shards
  std::string file, mode = "eager";
  double budget_mb = 64;
  bool verify = false, json = false, digest = false, gds = false, drop_cache = false;
  int threads = 0;
  std::string device = "cpu";
  double staging_mb = 64;
  double max_device_mb = 0;
  Common common;
  ProgressMode progress = ProgressMode::kAuto;
  RankDryRun ranks;
};

// What a load saw: the tensors listed, their bytes, a checksum of touched bytes (so that the
// compiler cannot skip the touching), and with --digest each tensor's CRC32.
struct Tally {
  uint64_t bytes = 0, checksum = 0;
  size_t tensors = 0;
  nlohmann::ordered_json digests = nlohmann::ordered_json::object();
};

// The library's options; refuses a device with another mode, and --gds without a device.
LoadOptions load_options_of(const LoadFlags& f) {
  LoadOptions lo;
  lo.verify = f.verify;
  lo.drop_cache = f.drop_cache;
  lo.threads = f.threads;
  lo.device = Device::parse(f.device);
  lo.staging_bytes = static_cast<uint64_t>(f.staging_mb * 1024 * 1024);
  lo.max_device_bytes = static_cast<uint64_t>(f.max_device_mb * 1024 * 1024);
  if (!lo.device.is_cpu() && f.mode != "eager")
    throw Error(ErrorCode::kInvalidArgument,
                "--device " + f.device + " loads eagerly: it cannot be used with --mode " + f.mode);
  if (f.gds) {
    if (lo.device.is_cpu())
      throw Error(ErrorCode::kInvalidArgument, "--gds reads into a CUDA device: add --device cuda");
    lo.gds = true;
    std::string why;  // why GPUDirect Storage is not used
    if (device_unavailable(lo.device).empty()) why = gds_unavailable(lo.device);
    if (!why.empty())
      std::fprintf(stderr,
                   "ckpt: note: GPUDirect Storage is not used (%s); reading through pinned "
                   "staging\n",
                   why.c_str());
  }
  return lo;
}

// With --digest: the CRC32 of a tensor's elements (row-major), a device tensor's through a copy
// to the host. Per-channel scales and zero points go with their tensor, not on their own.
void digest(const LoadFlags& f, const Tensor& t, Tally& tally) {
  if (!f.digest || !listed(t.info())) return;
  std::vector<std::byte> b;
  if (t.storage()->on_host()) {
    b = t.contiguous_bytes();
  } else {
    auto host = std::make_shared<Storage>();
    host->info = t.storage()->info;
    std::vector<std::byte> copy(host->info.nbytes);
    copy_to_host(*t.storage(), 0, copy);
    host->data = copy.data();
    b = Tensor(t.info(), host).contiguous_bytes();
  }
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08lx",
                ::crc32(0, reinterpret_cast<const Bytef*>(b.data()), static_cast<uInt>(b.size())));
  tally.digests[t.name()] = hex;
}

// Adds one byte of every page of [p, p + n) to the checksum, as a consumer touching them would.
void touch(const std::byte* p, uint64_t n, Tally& tally) {
  for (uint64_t off = 0; off < n; off += 4096) tally.checksum += std::to_integer<uint8_t>(p[off]);
}

void load_eager(const LoadFlags& f, const LoadOptions& lo, Tally& tally) {
  // Opening and loading overlapped: reads start once the zip directory is known.
  LoadedCheckpoint l = f.files.size() == 1
                           ? Checkpoint::open_and_load(f.files[0], open_options(f.common), lo)
                           : load_set(f.files, f.common, lo);
  tally.tensors = std::count_if(l.tensors.begin(), l.tensors.end(),
                                [](const Tensor& t) { return listed(t.info()); });
  for (const auto& s : l.checkpoint.storages()) tally.bytes += s.nbytes;
  for (auto& t : l.tensors) {
    if (t.storage()->on_host())
      tally.checksum += t.info().nbytes() ? std::to_integer<uint8_t>(t.data()[0]) : 0;
    digest(f, t, tally);
  }
}

void load_mmap(const LoadFlags& f, const Checkpoint& c, const LoadOptions& lo, ProgressLine& line,
               Tally& tally) {
  // Views read nothing in the library: the pages touched here are the progress.
  for (const auto& s : c.storages()) tally.bytes += s.nbytes;
  uint64_t touched = 0;
  for (size_t i = 0; i < c.tensors().size(); ++i) {
    Tensor t = c.tensor(i, lo);
    touch(t.storage()->data, t.storage()->info.nbytes, tally);
    digest(f, t, tally);
    tally.tensors += listed(t.info());
    touched += t.info().nbytes();
    line.update(std::min(touched, tally.bytes), tally.bytes);
  }
  line.finish(tally.bytes);
}

void load_stream(const LoadFlags& f, const Checkpoint& c, const LoadOptions& lo, Tally& tally) {
  c.stream(
      static_cast<uint64_t>(f.budget_mb * 1024 * 1024),
      [&](const Tensor& t) {
        tally.tensors += listed(t.info());
        tally.bytes += t.info().nbytes();
        touch(t.data(), t.info().nbytes(), tally);  // as a consumer copying them elsewhere
        digest(f, t, tally);
      },
      lo);
}

// How a device load's bytes reached the device: "gds", "unified" or "staged" ("host": none).
struct DevicePath {
  uint64_t direct_before = gds_bytes_read(), unified_before = unified_bytes_loaded();
  std::string name(const Device& d) const {
    if (d.is_cpu()) return "host";
    if (gds_bytes_read() > direct_before) return "gds";
    return unified_bytes_loaded() > unified_before ? "unified" : "staged";
  }
};

void print_load(const LoadFlags& f, const LoadOptions& lo, Tally& tally, double seconds,
                uint64_t direct_bytes, const std::string& path, double context_seconds) {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  const uint64_t rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  if (f.json) {
    nlohmann::ordered_json j{{"mode", f.mode},
                             {"device", lo.device.str()},
                             {"gds", direct_bytes > 0},
                             {"gds_bytes", direct_bytes},
                             {"path", path},
                             {"tensors", tally.tensors},
                             {"bytes", tally.bytes},
                             {"seconds", seconds},
                             {"context_seconds", context_seconds},
                             {"peak_rss_bytes", rss},
                             {"checksum", tally.checksum}};
    if (f.digest) j["digests"] = std::move(tally.digests);
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("%s load%s%s: %zu tensors, %s in %.3f s (%.2f GB/s), peak RSS %s\n", f.mode.c_str(),
              lo.device.is_cpu() ? "" : " into ", lo.device.is_cpu() ? "" : lo.device.str().c_str(),
              tally.tensors, human_bytes(tally.bytes).c_str(), seconds, tally.bytes / seconds / 1e9,
              human_bytes(rss).c_str());
}

void run_load(LoadFlags& f) {
  f.common.download_whole = true;  // every byte is read: a server without ranges is no obstacle
  f.file = files_name(f.files);
  // A device's context is made before the timing starts (as a process that uses the device has
  // made it before it loads): `seconds` is the load's own.
  double context_seconds = 0;
  if (const Device d = Device::parse(f.device); !d.is_cpu() && f.mode == "eager") {
    const double c0 = now_seconds();
    (void)describe_device(d);
    context_seconds = now_seconds() - c0;
  }
  const double t0 = now_seconds();
  const uint64_t direct_before = gds_bytes_read();
  const DevicePath path;
  LoadOptions lo = load_options_of(f);
  ProgressLine line(f.progress);
  lo.progress = line.fn();
  Tally tally;
  if (f.mode == "eager") {
    load_eager(f, lo, tally);
  } else {
    Checkpoint c = open_checkpoint(f.files, f.common);
    if (f.mode == "mmap")
      load_mmap(f, c, lo, line, tally);
    else
      load_stream(f, c, lo, tally);
  }
  line.end_line();
  const double seconds = now_seconds() - t0;
  print_load(f, lo, tally, seconds, gds_bytes_read() - direct_before, path.name(lo.device),
             context_seconds);
}

}  // namespace

void add_load(CLI::App& app) {
  auto o = std::make_shared<LoadFlags>();
  auto* cmd = app.add_subcommand("load", "load every tensor once; report time and peak memory");
  cmd->add_option("FILE", o->files, "checkpoint, shard index, or shard files")->required();
  cmd->add_option("--mode", o->mode, "eager (owned memory), mmap (views, pages touched) or stream")
      ->check(CLI::IsMember({"eager", "mmap", "stream"}));
  cmd->add_option("--budget-mb", o->budget_mb, "stream: bytes in flight (MiB, default 64)")
      ->check(more_than(0));
  cmd->add_option("--threads", o->threads, "eager: reader threads (default: per machine)")
      ->check(at_least(0));
  cmd->add_option("--device", o->device,
                  "eager: load into this device's memory: cpu (default), cuda, cuda:N");
  cmd->add_option("--staging-mb", o->staging_mb,
                  "with --device cuda: pinned staging memory (MiB, default 64)")
      ->check(more_than(0));
  cmd->add_option("--max-device-mb", o->max_device_mb,
                  "with --device cuda: refuse (before reading) a load that needs more device "
                  "memory than this (MiB; the device's free memory is always checked)")
      ->check(at_least(0));
  cmd->add_flag("--gds", o->gds,
                "with --device cuda: read a local file straight into device memory with "
                "GPUDirect Storage (cuFile) where available; else through pinned staging, "
                "with a note");
  cmd->add_flag("--verify", o->verify, "check CRC32 while loading");
  cmd->add_flag("--drop-cache", o->drop_cache,
                "eager: drop the file's pages from the page cache once read, those that were "
                "not cached before the load (another process's warm cache stays)");
  auto* json = cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->add_flag("--digest", o->digest,
                "with --json: CRC32 of each tensor's elements (row-major), by name, to compare "
                "load paths with each other and with torch")
      ->needs(json);
  auto* rank = cmd->add_option("--rank", o->ranks.rank, "dry run: this rank (default 0)")
                   ->check(at_least(0));
  auto* world = cmd->add_option("--world", o->ranks.world, "dry run: ranks in the group")
                    ->check(more_than(0));
  auto* plan = cmd->add_option("--plan", o->ranks.plan_file,
                               "dry run: a JSON plan of pattern -> \"shard:DIM\" or "
                               "\"replicate\"; prints each tensor's box and byte ranges for "
                               "--rank and the bytes it would read, and reads none");
  add_common(*cmd, o->common);
  add_progress_flags(*cmd, o->progress);
  cmd->callback([o, rank, world, plan] {
    if (*rank || *world || *plan) {
      o->ranks.json = o->json;
      return print_rank_plan(o->files, o->common, o->ranks);
    }
    run_load(*o);
  });
}

}  // namespace ckpt::cli
