#include "tests/support/testing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "flowstate/nodes/sources/records.h"
#include "flowstate/serialization/atomic_file.h"

namespace flowstate::testing {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "flowstate-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string write_records(const std::string& dir, std::uint64_t records, std::size_t record_bytes,
                          std::size_t shards, std::uint64_t seed) {
  std::filesystem::create_directories(dir);
  for (std::size_t s = 0; s < shards; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "part-%05zu.bin", s);
    write_synthetic_records((std::filesystem::path(dir) / name).string(), records * s / shards,
                            records * (s + 1) / shards, record_bytes, seed);
  }
  return (std::filesystem::path(dir) / "part-*.bin").string();
}

std::uint64_t record_index(const std::byte* record) {
  std::uint64_t v;
  std::memcpy(&v, record, 8);
  return v;
}

void expect_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                         LoaderOptions restore_options) {
  const OracleReport report = check_save_restore(make, options, restore_options);
  EXPECT_TRUE(report.ok()) << report.summary();
}

// A generation-counting rendezvous: each call leaves its message, the last to arrive
// publishes them all and starts the next generation.
struct ThreadGroup::Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t world = 1;
  std::uint64_t arrived = 0;
  std::uint64_t generation = 0;
  std::vector<std::string> slots, published;
};

namespace {

class ThreadCoordinator final : public Coordinator {
 public:
  ThreadCoordinator(std::shared_ptr<ThreadGroup::Shared> s, std::uint64_t rank)
      : s_(std::move(s)), rank_(rank) {}
  std::uint64_t rank() const override { return rank_; }
  std::uint64_t world() const override { return s_->world; }
  std::vector<std::string> all_gather(std::string_view message) override {
    std::unique_lock lock(s_->mu);
    s_->slots[rank_] = std::string(message);
    const std::uint64_t gen = s_->generation;
    if (++s_->arrived == s_->world) {
      s_->published = s_->slots;
      s_->arrived = 0;
      ++s_->generation;
      s_->cv.notify_all();
    } else {
      s_->cv.wait(lock, [&] { return s_->generation != gen; });
    }
    return s_->published;
  }
  void barrier() override { all_gather(""); }

 private:
  std::shared_ptr<ThreadGroup::Shared> s_;
  std::uint64_t rank_;
};

}  // namespace

ThreadGroup::ThreadGroup(std::uint64_t world) : shared_(std::make_shared<Shared>()), world_(world) {
  shared_->world = world;
  shared_->slots.resize(world);
}

std::shared_ptr<Coordinator> ThreadGroup::rank(std::uint64_t r) {
  return std::make_shared<ThreadCoordinator>(shared_, r);
}

std::vector<std::string> ThreadGroup::run(
    const std::function<void(std::uint64_t, std::shared_ptr<Coordinator>)>& fn) {
  std::vector<std::string> errors(world_);
  std::vector<std::thread> threads;
  for (std::uint64_t r = 0; r < world_; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r, rank(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(error without a message)";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void ConcurrencyProbe::call(std::chrono::microseconds work) {
  const int n = ++now_;
  int m = most_.load();
  while (n > m && !most_.compare_exchange_weak(m, n)) {
  }
  if (wait_ && !met_.exchange(true)) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (most_.load() < 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::this_thread::sleep_for(work);
  --now_;
}

bool cache_copy_pinned(const std::filesystem::path& cache_dir, const std::string& key) {
  DirectoryLock lock((cache_dir / "lock").string());
  const std::string path = (cache_dir / "objects" / (key + ".obj")).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);
  return held;
}

RemoteObject unreachable_object(const std::string& name, std::uint64_t size) {
  return {.url = "https://example.invalid/" + name,
          .fetch_url = "http://127.0.0.1:1/" + name,
          .size = size,
          .etag = "\"e-" + name + "\""};
}

RemoteSettings fast_failing_remote() {
  RemoteSettings s;
  s.attempts = 1;
  s.timeout = std::chrono::milliseconds(500);
  s.connections = 2;
  return s;
}

}  // namespace flowstate::testing
