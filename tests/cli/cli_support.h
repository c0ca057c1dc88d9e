// Runs the built `flowstate` binary as a user would: in a given directory, with stdout and
// stderr captured, optionally in the background so a test can signal it.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "tests/support/testing.h"

namespace flowstate::testing {

/// Path of the built binary (a compile definition from CMake).
std::string cli_path();
/// Path of the source tree (for examples/ and fuzz/).
std::string source_dir();

/// How a finished command ended.
struct CliResult {
  int status = -1;  ///< exit status; 128 + signal when killed by a signal
  std::string out;  ///< stdout
  std::string err;  ///< stderr
};

/// A running `flowstate` process whose output goes to files in its directory.
class CliProcess {
 public:
  /// Starts `flowstate args...` in `cwd` (or `program args...` when `program` is given).
  /// With `own_session`, the program leads a session of its own (setsid), which every process
  /// it starts inherits, however deep and whatever process group it takes (mpirun's ranks each
  /// lead one): kill_session() reaches them all.
  CliProcess(const std::vector<std::string>& args, const std::string& cwd,
             const std::string& program = "", bool own_session = false);
  ~CliProcess();
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;

  void signal(int sig) const;
  /// Of a process started with `own_session`: SIGKILL to every process of its session, pass
  /// after pass until none is left alive (a zombie is dead: its files are closed), so a process
  /// forked during a pass dies in the next, and none of them runs or writes once this returns.
  /// Fails the test when some survive 30 s. Returns the processes killed.
  int kill_session();
  /// Whether the process has ended (it stays waitable: wait() still reports how).
  bool exited() const;
  /// The process id (-1 once waited for).
  pid_t pid() const { return pid_; }
  /// Waits for the end (killing the process after `timeout_s`, which fails the test).
  CliResult wait(double timeout_s = 60);

 private:
  pid_t pid_ = -1;
  pid_t session_ = -1;  ///< the session it leads (own_session), kept after wait()
  std::string out_path_, err_path_;
};

/// Runs `flowstate args...` in `cwd` to completion.
CliResult run_cli(const std::vector<std::string>& args, const std::string& cwd);
/// Runs `program args...` (another built program, e.g. an example) in `cwd` to completion.
CliResult run_program(const std::string& program, const std::vector<std::string>& args,
                      const std::string& cwd);

/// The whole contents of a file ("" when it does not exist).
std::string read_file(const std::string& path);
/// The lines of a file.
std::vector<std::string> read_lines(const std::string& path);
/// The lines of a digests or provenance file ("STEP ...") with one line per step, in step
/// order: a resumed run repeats the steps after its checkpoint, and the repeats must be
/// identical (a GoogleTest failure otherwise).
std::vector<std::string> by_step(const std::vector<std::string>& lines);
void write_file(const std::string& path, const std::string& text);

}  // namespace flowstate::testing
