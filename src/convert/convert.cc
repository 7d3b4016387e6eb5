// convert(): one write pipeline for every output — read -> content -> writer (with its
// decorators: digests, shards) -> output -> commit. Only the output differs: one file (a path, a
// caller's sink, an upload), a folder (dcp), or a shard set (outputs.h, shard_files.h).

#include "ckpt/convert.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "ckpt/checkpoint.h"
#include "ckpt/digest.h"
#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "convert/encryption.h"
#include "convert/model_files.h"
#include "convert/outputs.h"
#include "convert/shard_files.h"
#include "convert/shards.h"
#include "convert/transform.h"
#include "convert/writing.h"

namespace ckpt {
namespace {

using internal::ConvertOutput;

// Where the output goes: a path (a file, a folder, a set's name, a URL) or a caller's sink.
struct Destination {
  std::string path;
  ByteSink* sink = nullptr;
  bool make_folders = false;  // a model folder that may not exist yet
};

// The shard set of a sharded conversion, when it is more than one file.
struct Sharding {
  internal::ShardNames names;
  internal::ShardPlan plan;
};

// The output for `d`, made once everything that can be refused was refused.
std::unique_ptr<ConvertOutput> open_output(const Destination& d, const internal::WriterCaps& caps,
                                           const std::optional<Sharding>& shards, uint64_t total,
                                           const ConvertOptions& o) {
  if (d.sink) return internal::one_file_output(*d.sink, nullptr, total, o);
  if (caps.several_files) return internal::folder_output(d.path, o);
  if (shards)
    return std::make_unique<internal::ShardFiles>(shards->names.dir, shards->names.index, total, o);
  if (is_url(d.path)) {
    if (caps.patches) return internal::upload_via_file(d.path, total, o);
    std::unique_ptr<ByteSink> upload = create_s3_sink(d.path, o.remote);
    ByteSink& sink = *upload;
    return internal::one_file_output(sink, std::move(upload), total, o);
  }
  // A set of one is the one file, in folders made for it as for a set.
  const bool one_of_set = o.max_shard_size != 0;
  return internal::file_output(one_of_set ? internal::shard_names(d.path, caps).one_file : d.path,
                               total, o, one_of_set || d.make_folders);
}

// The local files the output will replace, each refused when it is one of the input's.
void refuse_own_input(const Checkpoint& c, const Destination& d, const internal::WriterCaps& caps,
                      const std::optional<Sharding>& shards, const ConvertOptions& o) {
  if (d.sink || is_url(d.path) || caps.several_files) return;  // a used folder is refused anyway
  if (!shards) {
    internal::refuse_own_input(
        c, o.max_shard_size ? internal::shard_names(d.path, caps).one_file : d.path);
    return;
  }
  internal::refuse_own_input(c, (shards->names.dir / shards->names.index).string());
  for (size_t k = 0; k < shards->plan.shards; ++k)
    internal::refuse_own_input(
        c, (shards->names.dir / shards->names.shard(k, shards->plan.shards)).string());
}

// The one write: read -> content -> writer -> output -> commit.
ConvertReport write(const Checkpoint& c, const ConvertOptions& o, const Destination& d) {
  ConvertReport r;
  r.format = target_format(o.target);
  internal::TargetWriter target = internal::make_target(o);
  std::unique_ptr<internal::Writer> writer = std::move(target.writer);
  const internal::WriterCaps caps = writer->caps();
  r.metadata_not_written = internal::metadata_not_written(c, *writer);
  // Flat entries (checked against the writer), and the shard plan made from them. A plan of one
  // shard is the one file, as without max_shard_size (the whole tree for pt). With transforms the
  // plan is made from the tensors the writer will see (renamed, cast, split, fused).
  std::optional<FlatStateDict> flat;
  std::optional<Sharding> shards;
  auto shard = [&](internal::ShardPlan plan) {
    if (plan.shards > 1) {
      r.tensor_bytes = plan.total;
      shards = Sharding{internal::shard_names(d.path, caps), std::move(plan)};
    } else if (caps.object_tree && o.transforms.empty()) {
      flat.reset();
      r.not_written.clear();
    }
  };
  if (!caps.object_tree || o.max_shard_size || !o.transforms.empty())
    flat = internal::flat_state(c, *writer, o, r);
  if (o.max_shard_size && o.transforms.empty())
    shard(internal::plan_shards(c, *flat, caps, o.max_shard_size));
  internal::TensorSource source(c, o.load, o.memory_budget);
  internal::WriteContent content = flat ? internal::flat_content(c, *flat, source, *writer)
                                        : internal::tree_content(c, source, r);
  // Dropped aliases and the transforms (src/convert/transform.h): the content the writer sees.
  if (flat) internal::finish_flat_content(o.transforms, *writer, c.source().name(), content, r);
  if (o.max_shard_size && !o.transforms.empty())
    shard(internal::plan_content_shards(content.tensors, o.max_shard_size));
  refuse_own_input(c, d, caps, shards, o);
  // The decorators, in one place: digests around the format's writer, shards around both.
  const auto* st = std::get_if<SafetensorsSaveOptions>(&o.target);
  if (st && st->store_digests)
    writer = internal::with_digests(std::move(writer), o.load.threads, r.digests_stored);
  if (shards) {
    content.metadata.erase(kSafetensorsDigestKey);  // an input's list would not match a shard
    writer = internal::shard_writer(std::move(writer), shards->plan, shards->names);
  }
  std::unique_ptr<ConvertOutput> out = open_output(d, caps, shards, r.tensor_bytes, o);
  // The one point where the content (and its feed) goes to the writer.
  internal::WriteResult written = writer->write(*out, content);
  r.key = std::move(written.key);
  r.tensors -= std::min(r.tensors, written.tensors_left_out);
  r.tensor_bytes -= std::min(r.tensor_bytes, written.bytes_left_out);
  if (!target.new_key_file.empty()) {
    // The key is committed before the output: an output whose key was lost is unreadable.
    internal::write_key_file(target.new_key_file, r.key, o.atomic, o.fsync);
    r.key_file_written = true;
  }
  out->commit(r);
  return r;
}

// Out of memory (a ring, a copy, a header) names the input and the output.
[[noreturn]] void out_of_memory(const Checkpoint& c, const std::string& out) {
  throw Error(ErrorCode::kLimitExceeded,
              "out of memory converting it to " + (is_url(out) ? redact_url(out) : out),
              c.source().name());
}

// A model folder (an existing folder, or a path ending in '/') given as the output of a one-file
// format: the file in it that save_pretrained would write (model.safetensors, pytorch_model.bin),
// whose shards and index are then named as transformers names them.
std::string in_model_folder(const std::string& out_path, ConvertFormat format) {
  std::error_code ec;
  const TargetFormatInfo& row = target_format_info(format);
  if (out_path.empty() || is_url(out_path) || row.folder ||
      (out_path.back() != '/' && !std::filesystem::is_directory(out_path, ec)))
    return out_path;
  return (std::filesystem::path(out_path) / std::string(row.folder_file)).string();
}

}  // namespace

ConvertReport convert(const Checkpoint& c, const std::string& out_path_given,
                      const ConvertOptions& options) try {
  ConvertOptions o = options;
  if (std::holds_alternative<std::monostate>(o.target))
    o.target = default_target(convert_format_for_path(
        o.max_shard_size ? internal::shard_names(out_path_given, {}).one_file : out_path_given));
  const std::string out_path = in_model_folder(out_path_given, target_format(o.target));
  const bool folder = target_format_info(target_format(o.target)).folder;
  if (is_url(out_path) && (folder || o.max_shard_size))
    throw Error(ErrorCode::kInvalidArgument,
                folder ? "a DCP folder is written to a local path only"
                       : "shards are written to local files only",
                redact_url(out_path));
  ConvertReport r = write(c, o, Destination{out_path, nullptr, out_path != out_path_given});
  internal::copy_model_files(c, out_path_given, r);
  return r;
} catch (const std::bad_alloc&) {
  out_of_memory(c, out_path_given);
}

ConvertReport convert(const Checkpoint& c, ByteSink& sink, const ConvertOptions& options) try {
  ConvertOptions o = options;
  if (std::holds_alternative<std::monostate>(o.target))
    o.target = default_target(convert_format_for_path(sink.name()));
  if (target_format_info(target_format(o.target)).folder)
    throw Error(ErrorCode::kInvalidArgument,
                "a DCP output is a folder of files: use the path overload", sink.name());
  if (auto* pt = std::get_if<TorchSaveOptions>(&o.target); pt && pt->archive_name.empty())
    pt->archive_name = "archive";  // not the sink's name
  if (o.max_shard_size)
    throw Error(ErrorCode::kInvalidArgument,
                "shards (max_shard_size) are written to files: use the path overload");
  return write(c, o, Destination{"", &sink});
} catch (const std::bad_alloc&) {
  out_of_memory(c, sink.name());
}

}  // namespace ckpt
