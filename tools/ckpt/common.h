#pragma once
// Shared pieces of the ckpt command-line tool: opening files, formatting, exit codes.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/ckpt.h"

namespace ckpt::cli {

// Exit statuses: 0 success; one per error code; 64 for usage errors.
int exit_code(ErrorCode code);
inline constexpr int kUsageExit = 64;

struct Common {
  bool no_mmap = false;
  std::string key_file, password_file;  // tensorizer decryption
};
void add_common(CLI::App& cmd, Common& c);
Checkpoint open_checkpoint(const std::string& path, const Common& c);

std::string shape_str(const std::vector<int64_t>& v);
std::string human_bytes(uint64_t n);
// Tensors a listing shows (quantization parameters are part of their tensor).
bool listed(const TensorInfo& t);
// Absolute file offset of a tensor's first element, or nullopt when not stored raw.
std::optional<uint64_t> file_offset(const Checkpoint& c, const TensorInfo& t);
double now_seconds();

// Subcommands: each registers itself and sets the callback that runs it.
void add_ls(CLI::App& app);
void add_info(CLI::App& app);
void add_show(CLI::App& app);
void add_extract(CLI::App& app);
void add_convert(CLI::App& app);
void add_verify(CLI::App& app);
void add_sample(CLI::App& app);
void add_bench(CLI::App& app);

}  // namespace ckpt::cli
