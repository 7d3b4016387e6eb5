// ckpt: inspect, verify, convert and load model checkpoints.

#include <cstdio>

#include "common.h"

int main(int argc, char** argv) {
  ckpt::cli::install_interrupt_cleanup();
  CLI::App app{"ckpt: read, verify, convert and load model checkpoints (torch, safetensors, "
               "tensorizer) without Python"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ckpt 0.1.0");
  ckpt::cli::add_ls(app);
  ckpt::cli::add_info(app);
  ckpt::cli::add_show(app);
  ckpt::cli::add_extract(app);
  ckpt::cli::add_convert(app);
  ckpt::cli::add_verify(app);
  ckpt::cli::add_digest(app);
  ckpt::cli::add_bench(app);
  ckpt::cli::add_load(app);
  ckpt::cli::add_sample(app);
  ckpt::cli::add_code(app);
  ckpt::cli::add_rewrite(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ckpt: %s (see ckpt --help)\n", e.what());
    return ckpt::cli::kUsageExit;
  } catch (const ckpt::cli::ExitStatus& e) {
    return e.code;
  } catch (const ckpt::Error& e) {
    std::fprintf(stderr, "ckpt: error: %s\n", ckpt::cli::error_line(e).c_str());
    return ckpt::cli::exit_code(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
