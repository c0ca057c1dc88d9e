// Shared pieces of the `flowstate` command: the command signature, exit statuses, a small
// argument parser and helpers every command uses. One command per file (cli/cmd_NAME.cpp
// defines `int cmd_NAME(std::span<const std::string> args)`); cli/main.cpp holds the table.
#pragma once

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/config/yaml.h"
#include "flowstate/tools/mix_weights.h"

namespace flowstate::cli {

/// Exit statuses of every command.
enum ExitStatus : int {
  kExitOk = 0,
  kExitFailed = 1,      ///< the command ran and found a problem (verify: a mismatch)
  kExitUsage = 2,       ///< bad command line or configuration (ConfigError)
  kExitData = 3,        ///< DataError
  kExitCheckpoint = 4,  ///< CheckpointError
};

/// A command's entry point: `args` are the arguments after the command's name. Returns the
/// exit status; throws UsageError or a flowstate::Error, which main() maps to a status.
using CommandFn = int (*)(std::span<const std::string> args);

/// A mistake on the command line (unknown flag, missing or malformed value): exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parses `--flag value`, `--flag=value`, repeated flags, switches and positionals. `--`
/// ends the flags.
class Args {
 public:
  /// `with_value` lists the flags that take a value, `switches` those that do not. Throws
  /// UsageError naming an unknown flag (with the closest known one: "unknown option
  /// '--chekpoint-dir'; did you mean '--checkpoint-dir'?") or a flag without its value.
  Args(std::span<const std::string> args, std::initializer_list<std::string_view> with_value,
       std::initializer_list<std::string_view> switches = {});

  /// True when -h or --help was given.
  bool help() const { return help_; }
  bool has(std::string_view flag) const;
  /// The last value of `flag`.
  std::optional<std::string> value(std::string_view flag) const;
  /// Every value of `flag`, in order.
  std::vector<std::string> values(std::string_view flag) const;
  /// The value of `flag` as an unsigned integer in [min, max]; throws UsageError otherwise.
  std::optional<std::uint64_t> uint(std::string_view flag, std::uint64_t min = 0,
                                    std::uint64_t max = UINT64_MAX) const;
  /// The value of a required flag.
  std::string required(std::string_view flag) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::vector<std::pair<std::string, std::string>> flags_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

/// Parses an unsigned integer; throws UsageError naming `what`.
std::uint64_t parse_uint(std::string_view text, std::string_view what);

/// --workers N|auto|inline of `run` and `bench`: N in 1..1024, kAuto or kInline; none if unset.
std::optional<std::uint64_t> parse_workers(const Args& args);

/// The mix weights schedule of `run` and `verify`: every --mix-weights, then the lines of
/// --weights-schedule FILE (tools/mix_weights.h).
std::vector<MixWeightsAt> mix_weights_flags(const Args& args);

/// Loads a YAML pipeline with `--set` overrides (ConfigError on any problem).
PipelineConfig load_pipeline(const std::string& path, const std::vector<std::string>& sets);

/// The same, with batches kept in host memory (where they are hashed): a device_copy to an
/// accelerator is pointed at the cpu. Its device is a free parameter, so the fingerprint and
/// the batches' bytes are unchanged. `moved` is set when that happened.
PipelineConfig load_pipeline_on_host(const std::string& path, std::vector<std::string> sets,
                                     bool* moved = nullptr);

/// Why each step-N directory under `dir` is not a valid checkpoint ("path: reason"), for
/// reports when no checkpoint verifies.
std::vector<std::string> invalid_checkpoints(const std::string& dir);

/// The message main() prints for an exception: its what(), plus the file, key or offset the
/// error carries when the message does not already say them.
std::string error_message(const std::exception& e);

/// Prints "flowstate: MESSAGE" on stderr.
void note(const std::string& message);

/// Bytes as "2.62 MB"; rates as "1.23 M" etc.
std::string format_bytes(double bytes);
std::string format_count(double n);

}  // namespace flowstate::cli
