// What a `flowstate` process loads before it does anything: libcurl (and the ~35 libraries it
// needs) only once a remote path is read (nodes/sources/curl_loader.cpp), Open MPI's libraries
// only under an MPI launcher (cli/mpi_module.h). The dynamic loader says what it loads
// (LD_DEBUG=files, on stderr).
#include <gtest/gtest.h>
#include <stdlib.h>

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
