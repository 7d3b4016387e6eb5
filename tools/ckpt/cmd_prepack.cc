// ckpt prepack FILE --packer transpose-blocks64|int8-rows [--tensor NAME]... [--cache-dir DIR |
// --xdg] [--align SIZE] [--max-size SIZE] [--json]: the packed bytes of each tensor from ckpt's
// pre-pack cache (ckpt/prepack.h), packed and stored on a miss.
// ckpt prepack --gc (--cache-dir DIR | --xdg) --max-size SIZE: bound the cache.

#include <chrono>
#include <cstdio>
#include <thread>

#include "common.h"

namespace ckpt::cli {

namespace {

struct PrepackOptions {
  std::string file, packer = "transpose-blocks64", dir;
  std::vector<std::string> tensors;
  bool xdg = false, gc = false, json = false;
  uint64_t align = 4096, max_size = 0;
  int hold_ms = 0;
  Common common;
};

// --gc: bound the cache folder to --max-size.
void run_gc(const PrepackOptions& o) {
  std::string dir = o.dir;
  if (dir.empty() && o.xdg) {
    const char* x = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    dir = x && *x ? std::string(x) + "/ckpt" : std::string(home ? home : "") + "/.cache/ckpt";
  }
  if (dir.empty() && !o.file.empty()) dir = o.file + ".ckpt-prepack";
  if (dir.empty())
    throw Error(ErrorCode::kInvalidArgument, "--gc needs --cache-dir, --xdg or FILE");
  PrepackGcReport r = prepack_gc(dir, o.max_size);
  std::printf("%s: %zu entries (%s) -> %zu entries (%s); %zu temporaries removed\n", dir.c_str(),
              r.entries_before, human_bytes(r.bytes_before).c_str(), r.entries_after,
              human_bytes(r.bytes_after).c_str(), r.temporaries_removed);
}

// --hold-ms: touches every page of the blobs, waits, and reads the process's PSS and RSS (kB).
std::pair<uint64_t, uint64_t> hold_and_measure(const std::vector<PackedBlob>& held, int hold_ms) {
  uint64_t pss_kb = 0, rss_kb = 0;
  volatile uint8_t sink = 0;
  for (const PackedBlob& b : held)
    for (size_t i = 0; i < b.bytes.size(); i += 4096)
      sink = sink ^ std::to_integer<uint8_t>(b.bytes[i]);
  std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  if (FILE* f = std::fopen("/proc/self/smaps_rollup", "r")) {
    char line[256];
    unsigned long long v = 0;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "Pss: %llu kB", &v) == 1) pss_kb = v;
      if (std::sscanf(line, "Rss: %llu kB", &v) == 1) rss_kb = v;
    }
    std::fclose(f);
  }
  return {pss_kb, rss_kb};
}

void run_prepack(const PrepackOptions& o) {
  if (o.gc) return run_gc(o);
  if (o.file.empty()) throw Error(ErrorCode::kInvalidArgument, "FILE is required");
  Checkpoint c = open_checkpoint(o.file, o.common);
  Packer packer = o.packer == "int8-rows" ? int8_rows_packer() : transpose_blocks_packer();
  PrepackCacheOptions po;
  po.dir = o.dir;
  po.xdg = o.xdg;
  po.alignment = o.align;
  po.max_bytes = o.max_size;
  std::vector<std::string> names = o.tensors;
  if (names.empty())
    for (const TensorInfo& t : c.tensors())
      if (t.shape.size() == 2 && (o.packer != "int8-rows" || t.dtype == DType::kFloat32))
        names.push_back(t.name);
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  size_t hits = 0;
  uint64_t bytes = 0;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<PackedBlob> held;
  for (const std::string& n : names) {
    auto s = std::chrono::steady_clock::now();
    PackedBlob b = prepack(c, n, packer, po);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count();
    hits += b.hit;
    if (o.hold_ms > 0) held.push_back(b);
    bytes += b.bytes.size();
    if (o.json) {
      j.push_back(
          {{"tensor", n}, {"hit", b.hit}, {"bytes", b.bytes.size()}, {"path", b.path}, {"ms", ms}});
    } else {
      std::printf("%-6s %s  %llu bytes  %.1f ms  %s\n", b.hit ? "hit" : "packed", n.c_str(),
                  static_cast<unsigned long long>(b.bytes.size()), ms, b.path.c_str());
    }
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto [pss_kb, rss_kb] =
      o.hold_ms > 0 ? hold_and_measure(held, o.hold_ms) : std::pair<uint64_t, uint64_t>{0, 0};
  if (o.json) {
    std::printf("%s\n", nlohmann::ordered_json({{"packer", packer.id},
                                                {"tensors", j},
                                                {"hits", hits},
                                                {"bytes", bytes},
                                                {"seconds", total},
                                                {"pss_kb", pss_kb},
                                                {"rss_kb", rss_kb}})
                            .dump(1)
                            .c_str());
  } else {
    std::printf("%zu tensors (%zu from the cache), %s packed bytes in %.3f s (%s)\n", names.size(),
                hits, human_bytes(bytes).c_str(), total, packer.id.c_str());
  }
}

}  // namespace

void add_prepack(CLI::App& app) {
  auto o = std::make_shared<PrepackOptions>();
  auto* cmd = app.add_subcommand(
      "prepack", "pack tensors for a kernel through ckpt's shared pre-pack cache (or --gc it)");
  cmd->add_option("FILE", o->file, "checkpoint (any format)");
  cmd->add_option("--packer", o->packer, "transpose-blocks64 (GEMM column blocks) or int8-rows")
      ->check(CLI::IsMember({"transpose-blocks64", "int8-rows"}));
  cmd->add_option("--tensor", o->tensors,
                  "tensor to pack (repeatable; default every 2-D one "
                  "the packer takes)");
  cmd->add_option("--cache-dir", o->dir, "cache folder (default FILE.ckpt-prepack beside it)");
  cmd->add_flag("--xdg", o->xdg, "cache in $XDG_CACHE_HOME/ckpt (~/.cache/ckpt)");
  cmd->add_option("--align", o->align, "payload alignment (4096; 2MiB for huge pages)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--max-size", o->max_size,
                  "bound the cache to this size (least recently "
                  "used entries go)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_flag("--gc", o->gc, "only bound the cache folder to --max-size");
  cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->add_option("--hold-ms", o->hold_ms,
                  "benchmarks: keep the blobs mapped (every page touched) this long, then report "
                  "the process's PSS and RSS");
  add_common(*cmd, o->common);
  cmd->callback([o] { run_prepack(*o); });
}

}  // namespace ckpt::cli
