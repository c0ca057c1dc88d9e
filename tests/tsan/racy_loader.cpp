// Negative test for the ThreadSanitizer setup (tests/support/tsan_tbb_shim.cpp): runs a real
// flowstate Loader whose user code contains a deliberate data race and must be reported by
// TSan. Built and registered with ctest only when FLOWSTATE_SANITIZE=thread; see
// tests/tsan/CMakeLists.txt. NOT part of the normal suites.
//
//   racy_loader map       sample-map workers increment a plain global concurrently
//   racy_loader consumer  map workers store (atomically) to a global that the consumer reads
//                         with a plain load between next() calls, while later batches are
//                         still being assembled: only the consumer's read is racy
//   racy_loader clean     same graph, the shared counter is atomic: must be report-free
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/testing.h"

namespace {

// Named, non-inlined accessors so the expected report's top frame is recognisable.
std::uint64_t g_plain_counter = 0;
std::atomic<std::uint64_t> g_atomic_counter{0};
std::uint64_t g_last_write = 0;  // atomically stored by workers, plainly read by the consumer

__attribute__((noinline)) void flowstate_tsan_racy_write() { ++g_plain_counter; }
__attribute__((noinline)) void flowstate_tsan_atomic_store(std::uint64_t v) {
  __atomic_store_n(&g_last_write, v, __ATOMIC_RELAXED);
}
__attribute__((noinline)) std::uint64_t flowstate_tsan_racy_read() { return g_last_write; }

// Makes two map bodies overlap in time (once) so that the race is exercised even when the
// scheduler would otherwise run the bodies one after another. Relaxed atomics only: TSan
// derives no happens-before from them, so the rendezvous does not order the racy accesses.
std::atomic<int> g_inside{0};
std::atomic<bool> g_met{false};
void overlap_once() {
  if (g_met.load(std::memory_order_relaxed)) return;
  g_inside.fetch_add(1, std::memory_order_relaxed);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (g_inside.load(std::memory_order_relaxed) < 2 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  if (g_inside.load(std::memory_order_relaxed) >= 2) g_met.store(true, std::memory_order_relaxed);
  flowstate_tsan_racy_write();
  g_inside.fetch_sub(1, std::memory_order_relaxed);
}

int run(const std::string& mode) {
  using namespace flowstate;
  testing::TempDir dir;
  std::string glob = testing::write_records(dir.str(), 400, 64, 2);
  Pipeline pipeline = Pipeline::Builder()
                          .seed(1)
                          .records({.paths = {glob}, .record_bytes = 64})
                          .map(
                              [mode](Sample&, MapContext&) {
                                if (mode == "map")
                                  overlap_once();
                                else if (mode == "consumer")
                                  flowstate_tsan_atomic_store(g_atomic_counter.fetch_add(1) + 1);
                                else
                                  g_atomic_counter.fetch_add(1, std::memory_order_relaxed);
                              },
                              {.name = "count"})
                          .batch({.size = 4})
                          .build();
  Loader loader(std::move(pipeline), {.epochs = 1, .workers = 4, .prefetch = 4});
  std::uint64_t batches = 0, seen = 0;
  while (auto b = loader.next()) {
    ++batches;
    if (mode == "consumer") seen += flowstate_tsan_racy_read();
  }
  std::printf("mode=%s batches=%llu plain=%llu atomic=%llu seen=%llu\n", mode.c_str(),
              static_cast<unsigned long long>(batches),
              static_cast<unsigned long long>(g_plain_counter),
              static_cast<unsigned long long>(g_atomic_counter.load()),
              static_cast<unsigned long long>(seen));
  return batches == 100 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "map" && mode != "consumer" && mode != "clean") {
    std::fprintf(stderr, "usage: %s map|consumer|clean\n", argv[0]);
    return 2;
  }
  return run(mode);
}
