// What a `flowstate` process loads before it does anything: libcurl (and the ~35 libraries it
// needs) only once a remote path is read (nodes/sources/curl_loader.cpp), Open MPI's libraries
// only under an MPI launcher (cli/mpi_module.h); and how it ends: without the libraries' static
// teardown unless a plugin, MPI or a sanitizer needs it (cli/main.cpp). The dynamic loader says
// what it loads and which libraries' destructors it calls (LD_DEBUG=files, on stderr).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "tests/cli/cli_support.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

/// `flowstate args...` run in `cwd` with the dynamic loader's file log on its stderr.
testing::CliResult run_logging_loads(const std::vector<std::string>& args, const std::string& cwd) {
  ::setenv("LD_DEBUG", "files", 1);
  ::setenv("FLOWSTATE_REMOTE_ATTEMPTS", "1", 1);
  testing::CliResult r = testing::run_cli(args, cwd);
  ::unsetenv("LD_DEBUG");
  ::unsetenv("FLOWSTATE_REMOTE_ATTEMPTS");
  return r;
}

TEST(Startup, LoadsLibcurlOnlyWhenARemotePathIsRead) {
  testing::TempDir dir;
  testing::write_file(dir / "local.yaml",
                      "source: {type: lines, paths: 'a.txt', format: text}\n"
                      "nodes:\n  - batch: {size: 2}\n");
  testing::write_file(dir / "a.txt", "one\ntwo\nsix\nten\n");
  const auto local = run_logging_loads({"run", "local.yaml"}, dir.str());
  ASSERT_EQ(local.status, 0) << local.err;
  EXPECT_NE(local.err.find("file=libtbb.so"), std::string::npos) << "no loader log:\n" << local.err;
  EXPECT_EQ(local.err.find("libcurl"), std::string::npos) << local.err;

  // A remote path (nothing listens on port 1): libcurl is opened, and the error is curl's.
  testing::write_file(dir / "remote.yaml",
                      "source: {type: lines, paths: 'http://127.0.0.1:1/a.txt', format: text}\n"
                      "nodes:\n  - batch: {size: 2}\n");
  const auto remote = run_logging_loads({"run", "remote.yaml"}, dir.str());
  EXPECT_EQ(remote.status, 3) << remote.err;
  EXPECT_NE(remote.err.find("file=libcurl.so.4 [0];  dynamically loaded by"), std::string::npos)
      << remote.err;
  EXPECT_NE(remote.err.find("http://127.0.0.1:1/a.txt"), std::string::npos) << remote.err;
}

// A finished command ends the process without the libraries' destructors (no "calling fini"),
// and its output is all there: every --digests line written through stdio reaches the file.
TEST(Startup, EndsWithoutTheLibrariesTeardownAndLosesNoOutput) {
  testing::TempDir dir;
  testing::write_file(dir / "local.yaml",
                      "source: {type: lines, paths: 'a.txt', format: text}\n"
                      "nodes:\n  - batch: {size: 1}\n");
  std::string lines;
  for (int i = 0; i < 3000; ++i) lines += "line " + std::to_string(i) + "\n";
  testing::write_file(dir / "a.txt", lines);
  const auto r = run_logging_loads({"run", "local.yaml", "--digests", "-"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("file=libtbb.so"), std::string::npos) << "no loader log:\n" << r.err;
  EXPECT_NE(r.err.find("3000 batches"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3000) << r.out.substr(0, 200);
  EXPECT_NE(r.out.find("\n2999 0 2999 "), std::string::npos) << "the last batch's line is missing";
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers report leaks and races at exit: the teardown runs.
  EXPECT_NE(r.err.find("calling fini"), std::string::npos) << r.err;
#else
  EXPECT_EQ(r.err.find("calling fini"), std::string::npos) << r.err;
#endif
}

#ifdef FLOWSTATE_MPI_MODULE
// A run no launcher started loads none of MPI's libraries (they are the module's, which the
// command opens only under one). Under a launcher, a command whose module is missing (a copy
// of it alone) is refused with exit status 2 naming the paths it tried; the module itself is
// opened by every MpiRun test (tests/mpi/).
TEST(Startup, LoadsMpiOnlyUnderALauncher) {
  testing::TempDir dir;
  testing::write_file(dir / "local.yaml",
                      "source: {type: lines, paths: 'a.txt', format: text}\n"
                      "nodes:\n  - batch: {size: 2}\n");
  testing::write_file(dir / "a.txt", "one\ntwo\nsix\nten\n");
  const auto local = run_logging_loads({"run", "local.yaml"}, dir.str());
  ASSERT_EQ(local.status, 0) << local.err;
  EXPECT_NE(local.err.find("file=libtbb.so"), std::string::npos) << "no loader log:\n" << local.err;
  EXPECT_EQ(local.err.find("libmpi"), std::string::npos) << local.err;
  EXPECT_EQ(local.err.find("flowstate-mpi.so"), std::string::npos) << local.err;
  EXPECT_TRUE(std::filesystem::exists(FLOWSTATE_MPI_MODULE));

  std::filesystem::copy_file(testing::cli_path(), dir / "flowstate");
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  const auto alone = testing::run_program(dir / "flowstate", {"run", "local.yaml"}, dir.str());
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(alone.status, 2) << alone.err;
  EXPECT_NE(alone.err.find("flowstate's MPI part"), std::string::npos) << alone.err;
  EXPECT_NE(alone.err.find(dir / "flowstate-mpi.so"), std::string::npos) << alone.err;
}
#endif

}  // namespace
}  // namespace flowstate
