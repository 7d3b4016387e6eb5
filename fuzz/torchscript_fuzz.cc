// Fuzz target: TorchScript archives (torch.jit.save): Checkpoint::open (which detects them among
// torch zips), then the TorchScript view: code files, their debug_pkl line tables, extra files,
// and the tensors as for any checkpoint (checkpoint_fuzz.h). The input is also handed to the
// debug_pkl parser on its own, so that seeds of bare debug_pkl records reach it directly.

#include "checkpoint_fuzz.h"
#include "ckpt/torchscript.h"
#include "formats/torch/debug_pkl.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  try {
    internal::DebugPklOptions dopt;
    dopt.limits = fuzz::fuzz_limits();
    internal::DebugInfo info = internal::parse_debug_pkl(fuzz::as_span(data, size), dopt);
    internal::debug_origin(info, 0, 1 << 20);
  } catch (const Error&) {
  }
  if (size < 4 || data[0] != 'P' || data[1] != 'K') return 0;
  OpenOptions opt;
  opt.limits = fuzz::fuzz_limits();
  try {
    Checkpoint c = Checkpoint::open(
        memory_source(std::string_view(reinterpret_cast<const char*>(data), size)), opt);
    if (c.format() != Format::kTorchScript) return 0;
    TorchScriptArchive a = TorchScriptArchive::from(c);
    a.constants();
    a.state_dict();
    for (const auto& f : a.code_files()) {
      try {
        a.code(f.path);
        a.debug_format(f.path);
        a.source_lines(f.path);
      } catch (const Error&) {
      }
    }
    for (const auto& name : a.extra_files()) {
      try {
        a.extra_file(name);
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  fuzz::run_checkpoint(data, size, nullptr);
  return 0;
}
