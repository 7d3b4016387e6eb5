// ckpt load FILE [--mode eager|mmap|stream] [--device cuda:N [--gds]] [--budget-mb N] [--verify]
// [--json]: loads every tensor once and reports time, throughput and this process's peak RSS (used
// by `ckpt bench` to measure memory in a fresh process). With --rank/--world/--plan: the dry run of
// one rank's load (rank_plan_print.cc).

#include <sys/resource.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common.h"
#include "progress.h"
#include "rank_plan_print.h"

namespace ckpt::cli {

void add_load(CLI::App& app) {
  struct Opts {
    std::vector<std::string> files;  // one checkpoint, an index, or shards
    std::string file, mode = "eager";
    double budget_mb = 64;
    bool verify = false, json = false, digest = false, gds = false;
    int threads = 0;
    std::string device = "cpu";
    double staging_mb = 256;
    double max_device_mb = 0;
    Common common;
    ProgressMode progress = ProgressMode::kAuto;
    RankDryRun ranks;
  };
  auto o = std::make_shared<Opts>();
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
                  "with --device cuda: pinned staging memory (MiB, default 256)")
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
    o->common.download_whole = true;  // every byte is read: a server without ranges is no obstacle
    o->file = files_name(o->files);
    double t0 = now_seconds();
    const uint64_t direct_before = gds_bytes_read();
    LoadOptions lo;
    lo.verify = o->verify;
    lo.threads = o->threads;
    lo.device = Device::parse(o->device);
    lo.staging_bytes = static_cast<uint64_t>(o->staging_mb * 1024 * 1024);
    lo.max_device_bytes = static_cast<uint64_t>(o->max_device_mb * 1024 * 1024);
    if (!lo.device.is_cpu() && o->mode != "eager")
      throw Error(
          ErrorCode::kInvalidArgument,
          "--device " + o->device + " loads eagerly: it cannot be used with --mode " + o->mode);
    std::string gds_note;  // why GPUDirect Storage is not used, when asked for
    if (o->gds) {
      if (lo.device.is_cpu())
        throw Error(ErrorCode::kInvalidArgument,
                    "--gds reads into a CUDA device: add --device cuda");
      lo.gds = true;
      if (device_unavailable(lo.device).empty()) gds_note = gds_unavailable(lo.device);
      if (!gds_note.empty())
        std::fprintf(stderr,
                     "ckpt: note: GPUDirect Storage is not used (%s); reading through "
                     "pinned staging\n",
                     gds_note.c_str());
    }
    ProgressLine line(o->progress);
    lo.progress = line.fn();
    uint64_t bytes = 0, checksum = 0;
    size_t tensors = 0;
    nlohmann::ordered_json digests = nlohmann::ordered_json::object();
    // Per-channel scales and zero points are loaded with their tensor, not counted as tensors.
    auto digest = [&](const Tensor& t) {
      if (!o->digest || !listed(t.info())) return;
      std::vector<std::byte> b;
      if (t.storage()->on_host()) {
        b = t.contiguous_bytes();
      } else {
        // A device tensor: its storage's bytes back to the host, then the same elements.
        auto host = std::make_shared<Storage>();
        host->info = t.storage()->info;
        std::vector<std::byte> copy(host->info.nbytes);
        copy_to_host(*t.storage(), 0, copy);
        host->data = copy.data();
        b = Tensor(t.info(), host).contiguous_bytes();
      }
      char hex[9];
      std::snprintf(
          hex, sizeof hex, "%08lx",
          ::crc32(0, reinterpret_cast<const Bytef*>(b.data()), static_cast<uInt>(b.size())));
      digests[t.name()] = hex;
    };
    if (o->mode == "eager") {
      // Opening and loading overlapped: reads start once the zip directory is known.
      LoadedCheckpoint l = o->files.size() == 1
                               ? Checkpoint::open_and_load(o->files[0], open_options(o->common), lo)
                               : load_set(o->files, o->common, lo);
      const Checkpoint& c = l.checkpoint;
      auto& all = l.tensors;
      tensors =
          std::count_if(all.begin(), all.end(), [](const Tensor& t) { return listed(t.info()); });
      for (const auto& s : c.storages()) bytes += s.nbytes;
      for (auto& t : all) {
        if (t.storage()->on_host())
          checksum += t.info().nbytes() ? std::to_integer<uint8_t>(t.data()[0]) : 0;
        digest(t);
      }
    } else if (Checkpoint c = open_checkpoint(o->files, o->common); o->mode == "mmap") {
      // Views read nothing in the library: the pages touched here are the progress.
      for (const auto& s : c.storages()) bytes += s.nbytes;
      uint64_t touched = 0;
      for (size_t i = 0; i < c.tensors().size(); ++i) {
        Tensor t = c.tensor(i, lo);
        const std::byte* p = t.storage()->data;
        for (uint64_t off = 0; off < t.storage()->info.nbytes; off += 4096)
          checksum += std::to_integer<uint8_t>(p[off]);
        digest(t);
        tensors += listed(t.info());
        touched += t.info().nbytes();
        line.update(std::min(touched, bytes), bytes);
      }
      line.finish(bytes);
    } else {
      uint64_t budget = static_cast<uint64_t>(o->budget_mb * 1024 * 1024);
      c.stream(
          budget,
          [&](const Tensor& t) {
            tensors += listed(t.info());
            bytes += t.info().nbytes();
            // Touch the bytes the way a consumer copying them elsewhere would.
            const std::byte* p = t.data();
            for (uint64_t off = 0; off < t.info().nbytes(); off += 4096)
              checksum += std::to_integer<uint8_t>(p[off]);
            digest(t);
          },
          lo);
    }
    line.end_line();
    double dt = now_seconds() - t0;
    struct rusage ru;
    ::getrusage(RUSAGE_SELF, &ru);
    uint64_t rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
    if (o->json) {
      nlohmann::ordered_json j{{"mode", o->mode},
                               {"device", lo.device.str()},
                               {"gds", gds_bytes_read() > direct_before},
                               {"gds_bytes", gds_bytes_read() - direct_before},
                               {"tensors", tensors},
                               {"bytes", bytes},
                               {"seconds", dt},
                               {"peak_rss_bytes", rss},
                               {"checksum", checksum}};
      if (o->digest) j["digests"] = std::move(digests);
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s load%s%s: %zu tensors, %s in %.3f s (%.2f GB/s), peak RSS %s\n",
                  o->mode.c_str(), lo.device.is_cpu() ? "" : " into ",
                  lo.device.is_cpu() ? "" : lo.device.str().c_str(), tensors,
                  human_bytes(bytes).c_str(), dt, bytes / dt / 1e9, human_bytes(rss).c_str());
    }
  });
}

}  // namespace ckpt::cli
