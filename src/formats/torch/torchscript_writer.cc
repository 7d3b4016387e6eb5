// Rewrites a TorchScript archive that ckpt has read (TorchScriptArchive::rewrite).
//
// Output layout: torch's zip layout (ZipWriter: zip64 end records, "FB" padding extra, data
// descriptors), every record of the input in the input's order (local header order) under the
// same folder. Stored records are copied stored (streamed in pieces), deflated records are
// inflated and deflated again with libdeflate at level 6: the content of every record equals the
// input's, the compressed bytes need not equal what torch's miniz wrote. Because ZipWriter and
// libdeflate are deterministic, rewriting an output again gives identical bytes.
// debug_pkl records (code/<file>.py.debug_pkl) are kept, re-encoded from the per-range layout to
// the string-table one (debug_pkl.h), or dropped, per options; torch.jit.load reads either layout
// and does not need them.

#include <algorithm>
#include <numeric>

#include "ckpt/error.h"
#include "ckpt/torchscript_types.h"
#include "formats/torch/debug_pkl.h"
#include "formats/torch/torchscript_reader.h"
#include "util/progress.h"
#include "zip/zip_writer.h"

namespace ckpt {

TorchScriptRewriteReport internal::rewrite_torchscript(const TorchScriptModel& m,
                                                       const std::string& path,
                                                       const TorchScriptRewriteOptions& options) {
  const internal::ZipReader& zip = *m.zip;
  const std::string& src = zip.source().name();
  if (m.prefix.empty())
    throw Error(ErrorCode::kUnsupported, "archive records are not under one folder", src);
  const auto& entries = zip.entries();
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries[a].header_offset < entries[b].header_offset;
  });

  TorchScriptRewriteReport report;
  report.records_in = entries.size();
  FileSinkOptions fo;
  fo.atomic = options.atomic;
  fo.fsync = options.fsync;
  auto sink = create_file_sink(path, fo);
  internal::ZipWriter out(*sink, m.prefix, options.alignment);
  std::vector<std::string> converted_names;
  uint64_t total = 0;
  if (options.progress)
    for (const internal::ZipEntry& e : entries) total += e.size;
  internal::ProgressMeter meter(options.progress, total);
  for (size_t i : order) {
    const internal::ZipEntry& e = entries[i];
    if (e.name.compare(0, m.prefix.size(), m.prefix) != 0)
      throw Error(ErrorCode::kUnsupported, "record outside the archive folder", src,
                  std::string(e.name));
    std::string name(e.name.substr(m.prefix.size()));
    bool is_debug = name.size() > 10 && name.compare(0, 5, "code/") == 0 &&
                    name.compare(name.size() - 10, 10, ".debug_pkl") == 0;
    if (e.method == 0 && !is_debug) {
      // Stored: stream the bytes (tensor records can be large).
      uint64_t off = e.size == 0 ? 0 : zip.data_offset(i);
      out.begin(name, e.size);
      constexpr uint64_t kPiece = 16 << 20;
      for (uint64_t done = 0; done < e.size; done += kPiece) {
        Bytes b = zip.source().read(off + done, std::min(kPiece, e.size - done));
        out.write(b.data);
        meter.add(b.data.size());
      }
      out.end();
      ++report.records_out;
      continue;
    }
    Bytes b = internal::read_record(zip, i, m.limits.max_inflated_bytes);
    std::string_view data = b.str();
    std::string converted;
    if (is_debug && options.debug == TorchScriptRewriteOptions::Debug::kStrip) {
      ++report.debug_stripped;
      report.debug_bytes_before += e.size;
      report.debug_stored_before += e.compressed_size;
      continue;
    }
    if (is_debug && options.debug == TorchScriptRewriteOptions::Debug::kTable) {
      internal::DebugPklOptions o;
      o.source = src;
      o.record = std::string(e.name);
      o.limits = m.limits;
      internal::DebugInfo info = internal::parse_debug_pkl(b.data, o);
      if (!info.string_table) {
        converted = internal::write_debug_pkl_table(info);
        data = converted;
        ++report.debug_converted;
        report.debug_bytes_before += e.size;
        report.debug_stored_before += e.compressed_size;
        report.debug_bytes_after += converted.size();
      }
    }
    auto bytes = std::as_bytes(std::span<const char>(data.data(), data.size()));
    if (e.method == 0) {
      out.add(name, bytes);
    } else {
      out.add_deflated(name, bytes);
    }
    if (!converted.empty()) converted_names.emplace_back(e.name);
    ++report.records_out;
    meter.add(e.size);
  }
  out.finish();
  sink->commit();
  meter.finish();
  if (!converted_names.empty()) {
    // Deflated sizes of the converted records, as written (ZipWriter does not report them).
    internal::ZipReader written(open_file_source(path), m.limits);
    for (const std::string& n : converted_names)
      if (auto k = written.find(n))
        report.debug_stored_after += written.entries()[*k].compressed_size;
  }
  return report;
}

}  // namespace ckpt
