#pragma once
// Converting a checkpoint to another format (what `ckpt convert` does), and the flat view of a
// checkpoint's object tree that the flat formats (safetensors, tensorizer) store.
//
//   ckpt::Checkpoint c = ckpt::Checkpoint::open("model.pt");
//   ckpt::ConvertOptions o;                       // format from the extension: .safetensors
//   ckpt::ConvertReport r = ckpt::convert(c, "model.safetensors", o);
//
// What is preserved, reported and refused is described in docs/cli.md (`ckpt convert`), which
// is a thin layer over this header. Thread-safety: conversions of different checkpoints, or of
// one checkpoint to different outputs, may run at once.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/dcp.h"
#include "ckpt/options.h"
#include "ckpt/safetensors.h"
#include "ckpt/sink.h"
#include "ckpt/tensorizer.h"
#include "ckpt/transform.h"

namespace ckpt {

// ---------------------------------------------------------------------------------------------
// Target formats

enum class ConvertFormat {
  kAuto,   // from the output's name (see convert_format_for_path)
  kTorch,  // a torch.save zip
  kSafetensors,
  kTensorizer,
  kDcp,  // a torch.distributed.checkpoint folder (never from a path: name it)
};

// The table of target formats (src/convert/target_format.cc): one row per format. Every answer
// about a format below (its name, the format a name or an extension gives, which settings apply)
// comes from it.
struct TargetFormatInfo {
  ConvertFormat format;
  std::string_view name;                         // "pt" (convert_format_name)
  std::span<const std::string_view> names;       // what parse_convert_format takes: "pt", "torch"
  std::span<const std::string_view> extensions;  // ".pt" ...; none for a folder (named only)
  bool folder;                                   // a folder of files (ConvertReport::files)
  bool shards;                                   // ConvertOptions::max_shard_size applies
  // Its file in a model folder (an output path that is a folder): "model.safetensors" as
  // save_pretrained names it, "pytorch_model.bin"; none for a folder format.
  std::string_view folder_file;
};
// The rows, in the order pt, safetensors, tensorizer, dcp.
std::span<const TargetFormatInfo> target_formats() noexcept;
// The row of `format`; Error{kInvalidArgument} for kAuto.
const TargetFormatInfo& target_format_info(ConvertFormat format);

// "pt", "safetensors", "tensorizer", "dcp" ("auto" for kAuto).
const char* convert_format_name(ConvertFormat format) noexcept;
// "pt" or "torch", "safetensors", "tensorizer", "dcp". Throws Error{kInvalidArgument} for
// anything else.
ConvertFormat parse_convert_format(std::string_view name);
// The format a path's extension names: .pt .pth .bin .ckpt -> kTorch, .safetensors ->
// kSafetensors, .tensors -> kTensorizer. Throws Error{kInvalidArgument} (naming the extension
// and the path) for any other (a DCP folder has no extension: its format is named).
ConvertFormat convert_format_for_path(const std::string& path);

// ---------------------------------------------------------------------------------------------
// The flat view: every name a flat format would store, and how the tensors share bytes

// One name under which a tensor is stored in a flat format.
struct StateDictEntry {
  std::string name;   // the dotted path ("model.layers.0.weight", "state.0.exp_avg")
  size_t tensor = 0;  // index into Checkpoint::tensors()
  // A tensor reached under several paths (a tied weight: torch.save writes it once and refers to
  // it from "encoder.weight" and "decoder.weight"): the later paths are entries of their own,
  // with `alias_of` = the index in `entries` of the tensor's first entry.
  std::optional<size_t> alias_of;
  // Set when this entry's bytes are bytes of an earlier entry too: the same tensor (an alias),
  // a view of the same storage, or a storage stored at the same place. The index in `entries` of
  // the first such entry. A flat format cannot express this: safetensors refuses it unless told
  // to copy, tensorizer writes copies.
  std::optional<size_t> shares_with;
};

struct FlatStateDict {
  // The checkpoint's tensors in its order under their names (Checkpoint::tensors()[i].name;
  // a TorchScript archive: its parameters and buffers by module path, as
  // TorchScriptArchive::state_dict() lists them), then the further paths of tied tensors in tree
  // order. Quantization parameters (TensorInfo::type "qparams") are part of their tensor and
  // not listed.
  std::vector<StateDictEntry> entries;
  // Paths of the values that are not tensors (numbers, strings, None, empty containers,
  // "<attributes of OrderedDict>" for a state dict's _metadata, objects), in tree order: what a
  // flat format drops. Filled for torch zip and legacy checkpoints only (a safetensors or
  // tensorizer file holds tensors only; a TorchScript archive is exported as its state dict).
  std::vector<std::string> non_tensors;
};

struct FlattenOptions {
  // Unset (the default): the tree is walked to any depth. Set: a tree nested deeper than
  // limits->max_pickle_depth is refused with Error{kLimitExceeded} naming
  // Limits::max_pickle_depth.
  std::optional<Limits> limits;
};

// The flat view of a checkpoint. The object tree is walked with an explicit stack and one path
// buffer (no recursion, memory linear in the depth), so that any depth is walked whole, never
// silently cut short; options.limits bounds it when set. (Checkpoint::open already refuses a
// tree nested deeper than the Limits::max_pickle_depth it was opened with.) A container reached
// twice is walked once, as the pickle memo shares it. Reads metadata only.
FlatStateDict flatten_state_dict(const Checkpoint& checkpoint, const FlattenOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Converting

// tensorizer output's key as a caller's flags or keywords give it (TargetSettings::encryption):
// parse_target puts these fields in TensorizerSaveOptions, whose comments say what each does.
// Set at most one of key, key_file, password, password_file.
struct ConvertEncryption {
  std::string key;
  std::string key_file;  // read when it exists, else a new random key is written there
  std::string password;
  std::string password_file;
  // Argon2id cost (libsodium's MODERATE profile, as tensorizer: ~0.5 s, 256 MiB).
  uint64_t pwhash_opslimit = 3;
  uint64_t pwhash_memlimit = 256ull << 20;

  bool enabled() const noexcept {
    return !key.empty() || !key_file.empty() || !password.empty() || !password_file.empty();
  }
};

// "refuse", "zeros", "skip"; parse_meta_tensors throws Error{kInvalidArgument} for another name.
const char* meta_tensors_name(MetaTensors m) noexcept;
MetaTensors parse_meta_tensors(std::string_view name);

// The options of each target format are the type its save_* function takes (one type per
// format: TorchSaveOptions in include/ckpt/options.h, SafetensorsSaveOptions,
// TensorizerSaveOptions, DcpSaveOptions), so an option of another format cannot be set by
// mistake. Their atomic and fsync are the save_* functions'; convert() commits as
// ConvertOptions::atomic and ::fsync say. The names a conversion's target had are kept:
using PtTarget = TorchSaveOptions;
using SafetensorsTarget = SafetensorsSaveOptions;
using TensorizerTarget = TensorizerSaveOptions;
using DcpTarget = DcpSaveOptions;

// The target: a format and its options. std::monostate (the default): the format the output's
// name gives (convert_format_for_path; the sink overload: the sink's name), with that format's
// default options.
// The alternatives are in the order of the table of target formats (target_formats()).
using ConvertTarget = std::variant<std::monostate, TorchSaveOptions, SafetensorsSaveOptions,
                                   TensorizerSaveOptions, DcpSaveOptions>;
// The format a target names (kAuto for std::monostate).
ConvertFormat target_format(const ConvertTarget& target) noexcept;
// A target of `format` with its default options (std::monostate for kAuto).
ConvertTarget default_target(ConvertFormat format) noexcept;

// The settings of a target as a caller's flags or keywords give them (the CLI's --align,
// Python's alignment=). Each belongs to the formats that have it; an unset one (0, false,
// nullopt, no encryption) is the format's default.
struct TargetSettings {
  uint32_t alignment = 0;           // pt, safetensors (TorchSaveOptions / SafetensorsSaveOptions)
  bool copy_shared = false;         // safetensors
  std::optional<MetaTensors> meta;  // safetensors
  bool store_digests = false;       // safetensors
  ConvertEncryption encryption;     // tensorizer
  uint32_t dcp_files = 0;           // dcp
};
// The target of a format and settings. `format_or_path`: a format name (parse_convert_format)
// or an output path whose extension names the format (convert_format_for_path; a trailing
// ".index.json" is ignored). A setting given for a format that does not have it is refused,
// never ignored: Error{kInvalidArgument} "TargetSettings::meta is only available for safetensors
// output, not pt" (the CLI and the Python module put their flag or keyword in its place).
ConvertTarget parse_target(std::string_view format_or_path, const TargetSettings& settings = {});

struct ConvertOptions {
  ConvertTarget target;
  // The path overload: write a temporary beside the output and rename it over the output at the
  // end (nothing appears under the output's name unless the conversion succeeds), and fsync.
  bool atomic = true;
  bool fsync = true;
  // The path overload with an "s3://bucket/key" output: an S3 upload (create_s3_sink,
  // include/ckpt/remote.h) with these options. pt and safetensors stream as they are written;
  // tensorizer (its writer patches headers already written) is written to a temporary file in
  // $TMPDIR first and then uploaded. The object appears only when complete. Not with shards.
  RemoteOptions remote;
  // How tensor bytes are read from the checkpoint. A mapped checkpoint is written from views of
  // the mapping (no copy; `verify` checks each storage's CRC32 first). An unmapped one (a
  // torch.distributed.checkpoint folder, a URL, a compressed or encrypted file) is streamed:
  // `threads` readers read its storages ahead of the writer, in the order the writer writes
  // them, into a ring of memory_budget bytes. With `copy`, the checkpoint is loaded whole first
  // with Checkpoint::load_all.
  LoadOptions load;
  // The streamed case above: bytes of tensor data held at once. A storage larger than it is
  // held alone, so the tensor data held is at most max(memory_budget, the largest storage).
  // SafetensorsSaveOptions::store_digests reads a streamed checkpoint twice (the digests go in the
  // header, before the data).
  uint64_t memory_budget = 128ull << 20;
  // Flat targets: bounds the depth of the tree walk (FlattenOptions::limits). Unset: any depth.
  std::optional<Limits> limits;
  // Called as the output is written: `done` bytes written so far, `total` the expected size (the
  // tensor bytes, raised to `done` when headers and padding pass it, so done <= total). Called
  // on the thread that called convert() (never from a writer thread), with `done` never going
  // back, at most once per `progress_interval` while writing, and once more at the end with
  // done == total == the size of the output, after it was committed. An exception thrown by the
  // callback aborts the conversion (the path overload leaves nothing under the output's name).
  // Counting the bytes keeps the sink's fast paths (reserve, write_sliced) in use.
  std::function<void(uint64_t done, uint64_t total)> progress;
  std::chrono::milliseconds progress_interval{100};
  // pt and safetensors, the path overload: more than 0 writes the checkpoint as shards of at
  // most this many tensor bytes plus an index, in the Hugging Face layout. For an output
  // "DIR/model.safetensors" (or "DIR/model.safetensors.index.json"): shards
  // "DIR/model-00001-of-00003.safetensors"... and "DIR/model.safetensors.index.json"
  // ({"metadata": {"total_size": N}, "weight_map": {name: shard file}}, names sorted), written
  // last; "pytorch_model.bin" gives "pytorch_model-00001-of-00002.bin". Tensors are taken in
  // order into the current shard until the next would pass the size; a tensor larger than the
  // size goes alone in a shard of its own; tensors that share bytes go in the shard of the first
  // of them. Each pt shard is a plain state dict (name -> tensor, flatten_state_dict's names;
  // non-tensor values are reported in not_written). When everything fits one shard, the one
  // file is written under the output's name and no index (as Hugging Face does). Each shard is
  // written to a temporary beside it (with `atomic`); they are renamed into place together once
  // all are written, the index last, and on failure the shards this call renamed are removed.
  // Everything a one-file conversion refuses is refused for shards too. 0: one file.
  uint64_t max_shard_size = 0;
  // Renames, keeps and drops, casts, dequantizes, splits, fuses, transposes
  // (include/ckpt/transform.h) between reading and writing. Not empty: the output is the flat
  // state dict (flatten_state_dict's names; pt and dcp: a plain state dict), and max_shard_size
  // is refused (Error{kInvalidArgument}).
  TransformRecipe transforms;
};

// "5GB", "500MB", "10GiB", "2048", "1.5GB": a size in bytes (kB/MB/GB/TB are powers of 1000,
// KiB/MiB/GiB/TiB of 1024; case-insensitive; "B" optional). Throws Error{kInvalidArgument} for
// anything else, or 0.
uint64_t parse_byte_size(std::string_view text);

struct ConvertReport {
  ConvertFormat format = ConvertFormat::kAuto;  // the format written
  // Tensors in the output (a flat format: every name, tied aliases included) and their bytes
  // (pt: the bytes of every storage).
  size_t tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t bytes_written = 0;  // size of the output
  // Converting to a flat format: paths of the non-tensor values not written
  // (FlatStateDict::non_tensors).
  std::vector<std::string> not_written;
  // Converting safetensors to another format: keys of its __metadata__ other than "format",
  // which neither pt nor tensorizer has a place for.
  std::vector<std::string> metadata_not_written;
  // Converting to a flat format: (tensor, the tensor it shares bytes with) for every name whose
  // bytes were written as a separate copy (safetensors with copy_shared, tensorizer).
  std::vector<std::pair<std::string, std::string>> copied_shared;
  // Encrypting: the raw 32-byte key used, and whether it was a new random key written to
  // TensorizerSaveOptions::key_file.
  std::string key;
  bool key_file_written = false;
  // Meta tensors written as zeros (MetaTensors::kZeros) or left out (kSkip), by name.
  std::vector<std::string> meta_zeroed, meta_skipped;
  // With SafetensorsSaveOptions::store_digests: the number of tensor digests stored.
  size_t digests_stored = 0;
  // With max_shard_size: the files written (shards, in order) and the index ("" when everything
  // fit one file, which is then `files[0]`, the output's name). DCP: the folder's files, in the
  // order written ("__0_0.distcp", ..., ".metadata"), index "".
  std::vector<std::string> files;
  std::string index;
  // What each transform rule did, and the rules that matched nothing (ConvertOptions::transforms).
  TransformReport transforms;
  // safetensors without copy_shared: names left out because they are another name's tensor
  // (tied weights), as (left out, kept); also in the file's __metadata__ as {left out: kept}.
  std::vector<std::pair<std::string, std::string>> aliases_dropped;
  // A checkpoint opened from a local folder, converted into a local folder: the files beside the
  // weights that serving needs, copied from the input folder (model_files_from) as they are
  // (config.json, generation_config.json, the tokenizer's files: kModelFiles in
  // src/convert/model_files.cc), by name.
  std::string model_files_from;
  std::vector<std::string> model_files_copied;
};

// Converts `checkpoint` to `out_path` (format: options.target's, or the path's extension).
//
// To pt: the whole object tree (dicts, lists, tuples, numbers, strings, OrderedDict _metadata,
// Parameters, requires_grad), storage sharing and tied weights are kept; a safetensors file
// becomes an OrderedDict of name -> tensor, a TorchScript archive its state dict. To safetensors
// or tensorizer: the tensors of flatten_state_dict() under their dotted names; tensorizer keeps
// param/buffer types and meta tensors; safetensors keeps the input's __metadata__
// ({"format": "pt"} when there is none). Tensor bytes are written bit-exact (non-contiguous
// tensors contiguous) straight from the checkpoint's memory (views of a mapped file), through
// the sink's fast paths (reserve, write_sliced) as save_torch does: `ckpt bench` compares a
// pt -> pt conversion with save_torch of the same tensors loaded.
//
// To dcp: a folder at out_path (DcpSaveOptions); `progress` is called once, at the end.
//
// A checkpoint opened from a local folder (a model folder, a DCP folder) written into a local
// folder (an existing one or a path ending in '/', any format) gets the input folder's
// config.json, generation_config.json and tokenizer files (from its huggingface/ subfolder when
// only that has a config.json, as verl saves) beside its weights, each copied through
// a temporary and a rename (ConvertReport::model_files_copied), so that the output loads with
// from_pretrained as the input did.
//
// Throws Error: kInvalidArgument (no format for the path, tensors sharing part of a storage to
// safetensors without copy_shared, a transform that cannot apply (include/ckpt/transform.h),
// max_shard_size for tensorizer or dcp, dcp to a sink or a URL, a checkpoint that is one unnamed
// tensor to a flat format), kUnsupported (a dtype the target cannot hold: quantized and sub-byte
// dtypes in a flat format, complex128/complex32 in safetensors; a meta tensor to safetensors with
// MetaTensors::kRefuse), kLimitExceeded (a tree deeper than options.limits, see flatten_state_dict;
// pt: save_torch's pickler refuses trees nested deeper than Limits{}.max_pickle_depth), kNotFound
// (an encryption key_file/password_file that cannot be read), and whatever reading the checkpoint
// or writing throws. On failure nothing is left under out_path (with options.atomic; the key file
// of a new random key may remain).
ConvertReport convert(const Checkpoint& checkpoint, const std::string& out_path,
                      const ConvertOptions& options = {});
// Same, into a sink (format: options.target's, or the sink's name): the sink is committed at
// the end (after a new random key's key file). dcp (a folder) is refused: Error{kInvalidArgument}.
// options.atomic and fsync do not apply (the sink decides); they do for the key file.
ConvertReport convert(const Checkpoint& checkpoint, ByteSink& sink,
                      const ConvertOptions& options = {});

}  // namespace ckpt
