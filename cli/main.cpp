// The `flowstate` command: `flowstate [--plugin PATH.so]... COMMAND [ARGS...]`,
// `flowstate --version`, `flowstate help [COMMAND]`. Each command lives
// in cli/cmd_NAME.cpp and defines `int flowstate::cli::cmd_NAME(std::span<const std::string>)`.
// Errors are exceptions up to here, where they become `flowstate: error: ...` on stderr and an
// exit status: 2 usage or configuration, 3 data, 4 checkpoint, 1 anything else.
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cli/command.h"
#include "flowstate/config/plugins.h"
#include "flowstate/config/yaml_support.h"
#include "flowstate/core/error.h"
#include "flowstate/core/version.h"
#ifdef FLOWSTATE_HAVE_MPI
#include "cli/mpi_module.h"
#endif

// The command table: adding a command is one line here (plus its cli/cmd_NAME.cpp, which
// cli/CMakeLists.txt picks up). X(name, one-line summary).
#define FLOWSTATE_CLI_COMMANDS(X)                                                    \
  X(gen, "write a synthetic data set: records, text lines or tar shards")            \
  X(run, "run a YAML pipeline as a trainer would, with checkpoints and resume")      \
  X(validate, "check a YAML pipeline; print the resolved graph and its fingerprint") \
  X(inspect, "print what a checkpoint holds")                                        \
  X(verify, "prove exact resume for a pipeline through real checkpoint files")       \
  X(bench, "measure a YAML pipeline's throughput and where its time goes")           \
  X(report, "turn a run's metrics (and trace) into one self-contained HTML page")    \
  X(schema, "list the node types and map transforms with their parameters")

namespace flowstate::cli {

#define FLOWSTATE_DECLARE(name, summary) int cmd_##name(std::span<const std::string> args);
FLOWSTATE_CLI_COMMANDS(FLOWSTATE_DECLARE)
#undef FLOWSTATE_DECLARE

namespace {

struct Command {
  std::string_view name;
  std::string_view summary;
  CommandFn run;
};

#define FLOWSTATE_ENTRY(name, summary) Command{#name, summary, &cmd_##name},
constexpr Command kCommands[] = {FLOWSTATE_CLI_COMMANDS(FLOWSTATE_ENTRY)};
#undef FLOWSTATE_ENTRY

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: flowstate [--plugin PATH.so]... COMMAND [ARGS...]   (flowstate help "
               "COMMAND\n       or flowstate COMMAND --help for details)\n\n"
               "  --plugin PATH.so   load a plugin library that adds node types and map\n"
               "                     transforms (repeatable; a YAML's `plugins:` does the same)\n"
               "  --version          print the version and exit\n\n"
               "commands:\n");
  for (const auto& c : kCommands)
    std::fprintf(out, "  %-10.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  std::fprintf(
      out,
      "\nexit status: 0 success, 1 failure found (verify), 2 usage or configuration "
      "error,\n3 data error, 4 checkpoint error; run stopped by SIGTERM or SIGINT: "
      "128 + the signal\n(143, 130) after its final checkpoint; killed by signal N: 128 + N. The "
      "README lists\nevery status\n");
}

int fail(int status, const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "flowstate: error: %s\n", message.c_str());
  return status;
}

/// Whether a finished command may end the process without the libraries' static teardown.
/// Where a destructor may still matter, no: a plugin's statics are its author's, MPI's
/// libraries tear their job down at exit, and the sanitizers report leaks and races then.
bool may_skip_teardown() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr bool kSanitized = true;
#else
  constexpr bool kSanitized = false;
#endif
#ifdef FLOWSTATE_HAVE_MPI
  if (under_mpi_launcher()) return false;
#endif
  return !kSanitized && loaded_plugins().empty();
}

}  // namespace

/// glibc's malloc serves blocks above its mmap threshold (128 kB at first, raised to the
/// largest block freed) with fresh mappings, and gives memory at the top of a heap back to the
/// kernel beyond its trim threshold: a pipeline whose samples are hundreds of kB (a decoded
/// image, a float [3, 224, 224]) then faults in every sample's pages anew — a fifth of the
/// image benchmark's CPU time (perf; bench/RESULTS.md, issue 24). The command keeps blocks up
/// to 64 MB in its heaps and their pages mapped. Set before any thread starts; a
/// GLIBC_TUNABLES setting from the environment wins (mallopt is skipped when one is given).
void keep_sample_memory_mapped() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr &&
      std::string_view(tunables).find("glibc.malloc.") != std::string_view::npos)
    return;
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int main(int argc, char** argv) {
  keep_sample_memory_mapped();
  std::vector<std::string> args(argv + 1, argv + argc);
  // Options of the command itself come before the command's name.
  std::size_t first = 0;
  while (first < args.size() &&
         (args[first] == "--plugin" || args[first].rfind("--plugin=", 0) == 0)) {
    std::string path;
    if (args[first] == "--plugin") {
      if (first + 1 >= args.size()) return fail(kExitUsage, "--plugin needs a library path");
      path = args[first + 1];
      first += 2;
    } else {
      path = args[first].substr(9);
      first += 1;
    }
    try {
      load_plugin(path);
    } catch (const ConfigError& e) {
      return fail(kExitUsage, e.what());
    }
  }
  args.erase(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(first));
  if (args.empty()) {
    usage(stderr);
    return kExitUsage;
  }
  if (args[0] == "--version") {
    std::printf("flowstate %s\n", version());
    return kExitOk;
  }
  // `flowstate help COMMAND` is `flowstate COMMAND --help`.
  if (args[0] == "help" && args.size() > 1) args = {args[1], "--help"};
  if (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    usage(stdout);
    return kExitOk;
  }
  const Command* command = nullptr;
  std::vector<std::string> names;
  for (const auto& c : kCommands) {
    if (c.name == args[0]) command = &c;
    names.emplace_back(c.name);
  }
  if (command == nullptr) {
    usage(stderr);
    return fail(kExitUsage,
                "unknown command '" + args[0] + "'" + yaml_support::suggestion(args[0], names));
  }
  try {
    return command->run(std::span<const std::string>(args).subspan(1));
  } catch (const UsageError& e) {
    return fail(kExitUsage, std::string(e.what()) + " (see 'flowstate " + args[0] + " --help')");
  } catch (const ConfigError& e) {
    return fail(kExitUsage, error_message(e));
  } catch (const DataError& e) {
    return fail(kExitData, error_message(e));
  } catch (const CheckpointError& e) {
    return fail(kExitCheckpoint, error_message(e));
  } catch (const std::exception& e) {
    return fail(kExitFailed, error_message(e));
  } catch (...) {
    // Not a std::exception (a plugin's `throw 42` outside a node): a status, never an abort.
    return fail(kExitFailed, current_exception_text());
  }
}

}  // namespace flowstate::cli

int main(int argc, char** argv) {
  const int status = flowstate::cli::main(argc, argv);
  // The command's own objects are gone (its Loader, threads and files end in its scope, its
  // output is written); what exit() would still run is the libraries' static teardown — TBB
  // joining its worker threads, the tokenizer's and image libraries' globals: ~0.4 ms of a
  // run without threads and ~1 ms of one with them (bench/RESULTS.md, "Issue 26: smaller
  // groups"). The stdio buffers are flushed first; std::cout and std::cerr write through them.
  if (!flowstate::cli::may_skip_teardown()) return status;
  std::fflush(nullptr);
  std::_Exit(status);
}
