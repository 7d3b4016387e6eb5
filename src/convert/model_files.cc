// Model files copied beside converted weights (convert/model_files.h).

#include "convert/model_files.h"

#include <filesystem>

#include "api/checkpoint_impl.h"
#include "ckpt/error.h"
#include "ckpt/remote.h"

namespace ckpt::internal {
namespace {

// What save_pretrained and a tokenizer's save_pretrained write beside the weights.
constexpr const char* kModelFiles[] = {"config.json",
                                       "generation_config.json",
                                       "tokenizer.json",
                                       "tokenizer_config.json",
                                       "special_tokens_map.json",
                                       "tokenizer.model",
                                       "vocab.json",
                                       "vocab.txt",
                                       "merges.txt",
                                       "added_tokens.json",
                                       "chat_template.jinja",
                                       "chat_template.json",
                                       "preprocessor_config.json"};

}  // namespace

void copy_model_files(const Checkpoint& c, const std::string& out_path, ConvertReport& report) {
  namespace fs = std::filesystem;
  std::string in = CheckpointAccess::folder(c);
  std::error_code ec;
  // verl keeps the model's config and tokenizer in huggingface/ beside its per-rank files.
  if (!in.empty() && !fs::exists(fs::path(in) / "config.json", ec) &&
      fs::is_regular_file(fs::path(in) / "huggingface" / "config.json", ec))
    in = (fs::path(in) / "huggingface").string();
  if (in.empty() || out_path.empty() || is_url(out_path) || !fs::is_directory(in, ec) ||
      !fs::is_directory(out_path, ec) || fs::equivalent(in, out_path, ec))
    return;
  for (const char* name : kModelFiles) {
    const fs::path from = fs::path(in) / name, to = fs::path(out_path) / name;
    if (!fs::is_regular_file(from, ec)) continue;
    const fs::path tmp = to.string() + ".ckpt-tmp";
    if (!fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec) ||
        (fs::rename(tmp, to, ec), ec)) {
      fs::remove(tmp, ec);
      throw Error(ErrorCode::kIo, "cannot copy " + from.string() + ": " + ec.message(),
                  to.string());
    }
    report.model_files_copied.push_back(name);
  }
  if (!report.model_files_copied.empty()) report.model_files_from = in;
}

}  // namespace ckpt::internal
