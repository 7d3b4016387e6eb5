// ckpt convert IN OUT [--align N]: read any supported checkpoint, write a torch.save zip.

#include <cstdio>

#include "common.h"

namespace ckpt::cli {

void add_convert(CLI::App& app) {
  struct Opts {
    std::string in, out;
    uint32_t align = 64;
    Common common;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("convert", "convert a checkpoint (output: torch zip)");
  cmd->add_option("IN", o->in, "input checkpoint")->required();
  cmd->add_option("OUT", o->out, "output file (.pt, .pth, .bin)")->required();
  cmd->add_option("--align", o->align, "alignment of tensor data in the output (default 64)");
  add_common(*cmd, o->common);
  cmd->callback([o] {
    double t0 = now_seconds();
    Checkpoint c = open_checkpoint(o->in, o->common);
    // Views (zero-copy with mmap); the vector keeps storages shared while writing.
    std::vector<Tensor> tensors;
    tensors.reserve(c.tensors().size());
    uint64_t bytes = 0;
    for (size_t i = 0; i < c.tensors().size(); ++i) tensors.push_back(c.tensor(i));
    for (const auto& s : c.storages()) bytes += s.nbytes;
    SaveOptions so;
    so.alignment = o->align;
    ValuePtr root = c.root() ? c.root() : state_dict_value(tensors);
    save_torch(o->out, root, tensors, so);
    double dt = now_seconds() - t0;
    std::printf("wrote %s: %zu tensors, %s in %.3f s\n", o->out.c_str(), tensors.size(),
                human_bytes(bytes).c_str(), dt);
  });
}

}  // namespace ckpt::cli
