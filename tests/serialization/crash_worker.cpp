// The process crash_test.cpp kills. It resumes from the newest checkpoint under CKPT_DIR (if
// any), re-checkpoints that step at once (which replaces it on disk), then runs the crash
// pipeline to the end, checkpointing every EVERY steps, and appends to LOG — each line
// written and fsynced before the next step:
//
//   R <restored step or -> <checkpoints skipped>    at start
//   B <step> <epoch> <index> <last> <remainder> <digest>    per delivered batch
//   E                                                 after the last batch
//
// With PHASE and NTH, the NTH checkpoint write of this process stops inside
// write_checkpoint at hook phase PHASE: it prints "paused" on stdout and waits to be killed.
//
//   crash_worker GLOB CKPT_DIR LOG EVERY KEEP [PHASE NTH]
//
// GLOB "mix:A,B" runs crash_mix_pipeline(A, B) instead, setting the weights of
// crash_mix_weights() as it reaches their steps (a resumed life sets those due, which its state
// already holds).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "flowstate/graph/loader.h"
#include "tests/serialization/crash_pipeline.h"

namespace {

void write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(std::string("write: ") + std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

/// Appends one line to the log and makes it durable before the program goes on.
void log_line(int fd, const std::string& line) {
  write_all(fd, line + "\n");
  if (::fsync(fd) != 0) throw std::runtime_error(std::string("fsync: ") + std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flowstate;
  if (argc != 6 && argc != 8) {
    std::fprintf(stderr, "usage: crash_worker GLOB CKPT_DIR LOG EVERY KEEP [PHASE NTH]\n");
    return 64;
  }
  const std::string glob = argv[1], dir = argv[2], log_path = argv[3];
  const std::uint64_t every = std::strtoull(argv[4], nullptr, 10);
  const std::size_t keep = std::strtoull(argv[5], nullptr, 10);
  const std::string pause_phase = argc == 8 ? argv[6] : "";
  const int pause_nth = argc == 8 ? std::atoi(argv[7]) : 0;
  try {
    const bool mix = glob.starts_with("mix:");
    const std::size_t comma = glob.find(',');
    Loader loader(
        mix ? testing::crash_mix_pipeline(glob.substr(4, comma - 4), glob.substr(comma + 1))
            : testing::crash_pipeline(glob),
        {.epochs = mix ? 1 : testing::kCrashEpochs});
    MixWeightsSchedule weights(mix ? testing::crash_mix_weights() : std::vector<MixWeightsAt>{});
    auto found = loader.restore(dir);
    for (const auto& s : found ? found->skipped : std::vector<std::string>{})
      std::fprintf(stderr, "crash_worker: skipped %s\n", s.c_str());
    const int log = ::open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log < 0) throw std::runtime_error("cannot open " + log_path);
    log_line(log, "R " + (found ? std::to_string(found->step) : std::string("-")) + " " +
                      std::to_string(found ? found->skipped.size() : 0));

    int writes = 0;
    CheckpointWriteOptions options{.keep = keep};
    options.hook = [&](std::string_view phase) {
      if (phase != pause_phase || writes != pause_nth) return;
      write_all(1, "paused\n");
      for (;;) ::pause();  // until SIGKILL
    };
    auto checkpoint = [&] {
      ++writes;
      loader.save_checkpoint(dir, options);
    };
    if (found) checkpoint();
    for (;;) {
      weights.apply(loader);
      auto b = loader.next();
      if (!b) break;
      log_line(log, "B " + testing::crash_trace(*b));
      if ((b->info.step + 1) % every == 0) checkpoint();
    }
    log_line(log, "E");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crash_worker: %s\n", e.what());
    return 2;
  }
}
