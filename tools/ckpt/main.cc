// ckpt: inspect, verify, convert and load model checkpoints.

#include <algorithm>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "common.h"

namespace {

// Edit distance (insertions, deletions, substitutions, adjacent swaps) for "did you mean".
size_t distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// `ckpt lss ...`: the first argument names no command. Says so, with the nearest command when
// one is close. Returns false when the first argument is a flag or a real command.
bool unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  const std::string word = argv[1];
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == word) return false;
    size_t d = distance(word, sub->get_name());
    if (sub->get_name().rfind(word, 0) == 0) d = std::min<size_t>(d, 1);  // a prefix
    if (d < best_d) best_d = d, best = sub->get_name();
  }
  if (best_d <= std::max<size_t>(2, word.size() / 3))
    std::fprintf(stderr, "ckpt: unknown command '%s'; did you mean '%s'? (see ckpt --help)\n",
                 word.c_str(), best.c_str());
  else
    std::fprintf(stderr, "ckpt: unknown command '%s' (see ckpt --help)\n", word.c_str());
  return true;
}

}  // namespace

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
    std::fprintf(stderr, "ckpt: %s (see ckpt --help)\n", e.what());
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
