// The table of target formats: one row per format with its names, its file extensions, the
// settings it owns, how it makes its target (its save options) from them and its writer from
// the target. Every question about a target format
// (its name, the format a name or extension gives, whether a setting applies) is answered here.

#include <filesystem>
#include <string>
#include <variant>

#include "ckpt/convert.h"
#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "convert/writing.h"
#include "formats/dcp/dcp_writer.h"
#include "formats/tensorizer/tensorizer_key.h"

namespace ckpt {
namespace {

// The settings of TargetSettings, as bits of a row's `owns`.
enum : unsigned {
  kAlignment = 1u << 0,
  kCopyShared = 1u << 1,
  kMeta = 1u << 2,
  kDigests = 1u << 3,
  kEncryption = 1u << 4,
  kDcpFiles = 1u << 5,
};

struct Setting {
  unsigned bit;
  const char* name;  // as messages name it (the CLI and Python put their flag or keyword there)
  bool (*given)(const TargetSettings&);
};
constexpr Setting kSettings[] = {
    {kAlignment, "TargetSettings::alignment",
     [](const TargetSettings& s) { return s.alignment != 0; }},
    {kCopyShared, "TargetSettings::copy_shared",
     [](const TargetSettings& s) { return s.copy_shared; }},
    {kMeta, "TargetSettings::meta", [](const TargetSettings& s) { return s.meta.has_value(); }},
    {kDigests, "TargetSettings::store_digests",
     [](const TargetSettings& s) { return s.store_digests; }},
    {kEncryption, "TargetSettings::encryption",
     [](const TargetSettings& s) { return s.encryption.enabled(); }},
    {kDcpFiles, "TargetSettings::dcp_files",
     [](const TargetSettings& s) { return s.dcp_files != 0; }},
};

constexpr std::string_view kPtNames[] = {"pt", "torch"},
                           kPtExt[] = {".pt", ".pth", ".bin", ".ckpt"};
constexpr std::string_view kStNames[] = {"safetensors"}, kStExt[] = {".safetensors"};
constexpr std::string_view kTzNames[] = {"tensorizer"}, kTzExt[] = {".tensors"};
constexpr std::string_view kDcpNames[] = {"dcp"};

struct Row {
  TargetFormatInfo info;
  unsigned owns;  // the settings that apply; any other given is refused
  ConvertTarget (*make)(const TargetSettings&);
  internal::TargetWriter (*writer)(const ConvertTarget&);
};

// The rows, in the order of ConvertTarget's alternatives (after std::monostate).
const Row kRows[] = {
    {{ConvertFormat::kTorch, "pt", kPtNames, kPtExt, false, true, "pytorch_model.bin"},
     kAlignment,
     [](const TargetSettings& s) -> ConvertTarget {
       TorchSaveOptions t;
       if (s.alignment) t.alignment = s.alignment;
       return t;
     },
     [](const ConvertTarget& t) -> internal::TargetWriter {
       return {internal::make_torch_writer(std::get<TorchSaveOptions>(t)), {}};
     }},
    {{ConvertFormat::kSafetensors, "safetensors", kStNames, kStExt, false, true,
      "model.safetensors"},
     kAlignment | kCopyShared | kMeta | kDigests,
     [](const TargetSettings& s) -> ConvertTarget {
       SafetensorsSaveOptions t;
       if (s.alignment) t.alignment = s.alignment;
       t.copy_shared = s.copy_shared;
       t.meta = s.meta.value_or(MetaTensors::kRefuse);
       t.store_digests = s.store_digests;
       return t;
     },
     [](const ConvertTarget& t) -> internal::TargetWriter {
       return {internal::make_safetensors_writer(std::get<SafetensorsSaveOptions>(t)), {}};
     }},
    {{ConvertFormat::kTensorizer, "tensorizer", kTzNames, kTzExt, false, false, "model.tensors"},
     kEncryption,
     [](const TargetSettings& s) -> ConvertTarget {
       TensorizerSaveOptions t;
       t.key = s.encryption.key;
       t.key_file = s.encryption.key_file;
       t.password = s.encryption.password;
       t.password_file = s.encryption.password_file;
       t.pwhash_opslimit = s.encryption.pwhash_opslimit;
       t.pwhash_memlimit = s.encryption.pwhash_memlimit;
       return t;
     },
     [](const ConvertTarget& t) -> internal::TargetWriter {
       // Keys and passwords are read before anything is written.
       internal::ResolvedKey k = internal::resolve_key(std::get<TensorizerSaveOptions>(t));
       return {internal::make_tensorizer_writer(k.options), k.new_key_file};
     }},
    {{ConvertFormat::kDcp, "dcp", kDcpNames, {}, true, false, {}},
     kDcpFiles,
     [](const TargetSettings& s) -> ConvertTarget {
       DcpSaveOptions t;
       if (s.dcp_files) t.files = s.dcp_files;
       return t;
     },
     [](const ConvertTarget& t) -> internal::TargetWriter {
       return {internal::make_dcp_writer(std::get<DcpSaveOptions>(t)), {}};
     }},
};
static_assert(std::size(kRows) + 1 == std::variant_size_v<ConvertTarget>);

const Row* find_row(ConvertFormat format) noexcept {
  for (const Row& r : kRows)
    if (r.info.format == format) return &r;
  return nullptr;
}

const Row* find_named(std::string_view name) noexcept {
  for (const Row& r : kRows)
    for (std::string_view n : r.info.names)
      if (n == name) return &r;
  return nullptr;
}

// "pt, safetensors, tensorizer or dcp"; with `bit`, only the formats that own it.
std::string format_list(unsigned bit = ~0u) {
  std::vector<std::string_view> names;
  for (const Row& r : kRows)
    if (r.owns & bit) names.push_back(r.info.name);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + std::string(names[i]);
  return s;
}

}  // namespace

std::span<const TargetFormatInfo> target_formats() noexcept {
  static const std::vector<TargetFormatInfo> infos = [] {
    std::vector<TargetFormatInfo> v;
    for (const Row& r : kRows) v.push_back(r.info);
    return v;
  }();
  return infos;
}

const TargetFormatInfo& target_format_info(ConvertFormat format) {
  if (const Row* r = find_row(format)) return r->info;
  throw Error(ErrorCode::kInvalidArgument, "no output format (auto: from the output's name)");
}

const char* convert_format_name(ConvertFormat format) noexcept {
  const Row* r = find_row(format);
  return r ? r->info.name.data() : "auto";
}

ConvertFormat parse_convert_format(std::string_view name) {
  if (const Row* r = find_named(name)) return r->info.format;
  std::string all = format_list();
  all.replace(all.rfind(" and "), 5, " or ");
  throw Error(ErrorCode::kInvalidArgument,
              "unknown output format '" + std::string(name) + "': the format must be " + all);
}

const char* meta_tensors_name(MetaTensors m) noexcept {
  switch (m) {
    case MetaTensors::kRefuse:
      return "refuse";
    case MetaTensors::kZeros:
      return "zeros";
    case MetaTensors::kSkip:
      return "skip";
  }
  return "?";
}

MetaTensors parse_meta_tensors(std::string_view name) {
  if (name == "refuse") return MetaTensors::kRefuse;
  if (name == "zeros") return MetaTensors::kZeros;
  if (name == "skip") return MetaTensors::kSkip;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown meta tensor policy '" + std::string(name) + "': zeros, skip or refuse");
}

ConvertFormat target_format(const ConvertTarget& target) noexcept {
  return target.index() == 0 ? ConvertFormat::kAuto : kRows[target.index() - 1].info.format;
}

ConvertTarget default_target(ConvertFormat format) noexcept {
  const Row* r = find_row(format);
  return r ? r->make({}) : ConvertTarget{};
}

ConvertFormat convert_format_for_path(const std::string& path) {
  // A folder (an existing one, or a path ending in '/'): a model folder of safetensors, as
  // save_pretrained writes it (convert() puts model.safetensors, or its shards, in it).
  std::error_code ec;
  if (!path.empty() && !is_url(path) &&
      (path.back() == '/' || std::filesystem::is_directory(path, ec)))
    return ConvertFormat::kSafetensors;
  const std::string ext = std::filesystem::path(path).extension().string();
  std::string known;
  for (const Row& r : kRows)
    for (std::string_view e : r.info.extensions) {
      if (e == ext) return r.info.format;
      known += (known.empty() ? "" : " ") + std::string(e);
    }
  std::string all = format_list();
  all.replace(all.rfind(" and "), 5, " or ");
  throw Error(
      ErrorCode::kInvalidArgument,
      "cannot tell the output format from '" + ext + "' (" + known + "); name it (" + all + ")",
      path);
}

ConvertTarget parse_target(std::string_view format_or_path, const TargetSettings& settings) {
  const Row* r = find_named(format_or_path);
  if (!r) {
    // A path; a sharded output may be named by its index ("model.safetensors.index.json").
    std::string named(format_or_path);
    if (named.ends_with(".index.json")) named.resize(named.size() - 11);
    r = find_row(convert_format_for_path(named));
  }
  // A setting of another format is refused, never ignored: the caller asked for something this
  // format does not do.
  for (const Setting& s : kSettings)
    if (s.given(settings) && !(r->owns & s.bit))
      throw Error(ErrorCode::kInvalidArgument, std::string(s.name) + " is only available for " +
                                                   format_list(s.bit) + " output, not " +
                                                   std::string(r->info.name));
  return r->make(settings);
}

namespace internal {

TargetWriter target_writer(const ConvertTarget& target) {
  if (target.index() == 0) throw Error(ErrorCode::kInvalidArgument, "no output format");
  return kRows[target.index() - 1].writer(target);
}

}  // namespace internal

}  // namespace ckpt
