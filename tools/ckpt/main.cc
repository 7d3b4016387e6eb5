// ckpt: inspect, verify, convert and load model checkpoints.

#include <algorithm>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "common.h"

namespace {

// `ckpt lss ...`: the first argument names no command. Says so, with the nearest command when
// one is close. Returns false when the first argument is a flag or a real command.
bool unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  const std::string word = argv[1];
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == word) return false;
    names.push_back(sub->get_name());
  }
  const std::string best = ckpt::cli::nearest(word, names);
  if (!best.empty())
    std::fprintf(stderr, "ckpt: unknown command '%s'; did you mean '%s'? (see ckpt --help)\n",
                 word.c_str(), best.c_str());
  else
    std::fprintf(stderr, "ckpt: unknown command '%s' (see ckpt --help)\n", word.c_str());
  return true;
}

// "; did you mean '--max-shard-size'?" for the first argument that looks like an option and is
// none of the subcommand's, when one of them is close; else "".
std::string unknown_option_hint(const CLI::App& app, int argc, char** argv) {
  const CLI::App* sub = nullptr;
  for (const CLI::App* s : app.get_subcommands({}))
    if (argc > 1 && s->get_name() == argv[1]) sub = s;
  if (!sub) return {};
  std::vector<std::string> names;
  for (const CLI::Option* o : sub->get_options({}))
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) continue;
    a = a.substr(0, a.find('='));
    if (std::find(names.begin(), names.end(), a) != names.end()) continue;
    const std::string best = ckpt::cli::nearest(a, names);
    if (!best.empty()) return "; did you mean '" + best + "'?";
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  ckpt::cli::install_interrupt_cleanup();
  CLI::App app{
      "ckpt: read, verify, convert and load model checkpoints (torch, safetensors, "
      "tensorizer) without Python"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ckpt 0.1.0\nfeatures: ") + ckpt::build_features());
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
  ckpt::cli::add_prepack(app);
  if (unknown_command(app, argc, argv)) return ckpt::cli::kUsageExit;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ckpt: %s%s (see ckpt --help)\n", e.what(),
                 unknown_option_hint(app, argc, argv).c_str());
    return ckpt::cli::kUsageExit;
  } catch (const ckpt::cli::ExitStatus& e) {
    return e.code;
  } catch (const ckpt::Error& e) {
    std::fprintf(stderr, "ckpt: error: %s\n", ckpt::cli::error_line(e).c_str());
    return ckpt::cli::exit_code(e.code());
  } catch (const std::bad_alloc&) {
    // The library names the file where it can (a pickle's objects, a tensor's memory); this is
    // the last resort.
    std::fprintf(stderr, "ckpt: error: out of memory [limit_exceeded]\n");
    return ckpt::cli::exit_code(ckpt::ErrorCode::kLimitExceeded);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
