#include "tests/support/testing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <ostream>
#include <random>
#include <set>

#include "core/rng.h"

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
  std::vector<char> rec(record_bytes);
  for (std::size_t s = 0; s < shards; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "part-%05zu.bin", s);
    std::ofstream out(std::filesystem::path(dir) / name, std::ios::binary);
    std::uint64_t begin = records * s / shards, end = records * (s + 1) / shards;
    for (std::uint64_t i = begin; i < end; ++i) {
      for (std::size_t b = 0; b < record_bytes; b += 8) {
        std::uint64_t v = b == 0 ? i : philox64(seed, i, b / 8);
        std::memcpy(rec.data() + b, &v, std::min<std::size_t>(8, record_bytes - b));
      }
      out.write(rec.data(), static_cast<std::streamsize>(record_bytes));
    }
  }
  return (std::filesystem::path(dir) / "part-*.bin").string();
}

std::uint64_t record_index(const std::byte* record) {
  std::uint64_t v;
  std::memcpy(&v, record, 8);
  return v;
}

std::ostream& operator<<(std::ostream& os, const BatchTrace& t) {
  return os << "{step " << t.step << " epoch " << t.epoch << " index " << t.index_in_epoch
            << (t.last ? " last" : "") << " rem " << t.remainder << " digest " << std::hex
            << t.digest << std::dec << "}";
}

BatchTrace trace(const Batch& b) {
  return {b.info.step,      b.info.epoch, b.info.index_in_epoch, b.info.is_last_in_epoch,
          b.info.remainder, b.digest()};
}

std::vector<BatchTrace> drain(Loader& loader, std::size_t limit) {
  std::vector<BatchTrace> out;
  while (out.size() < limit) {
    auto b = loader.next();
    if (!b) break;
    out.push_back(trace(*b));
  }
  return out;
}

void check_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                        LoaderOptions restore_options) {
  std::vector<BatchTrace> full;
  {
    Loader l(make(), options);
    full = drain(l);
  }
  ASSERT_FALSE(full.empty()) << "the oracle needs a pipeline that produces batches";
  std::set<std::size_t> breaks{0, 1, full.size() / 5, full.size()};
  for (std::size_t i = 0; i < full.size(); ++i) {
    if (full[i].epoch == 0 && full[i].last) {
      breaks.insert(i);      // after consuming the batch before the epoch's last one
      breaks.insert(i + 1);  // exactly at the epoch's end
    }
    if (full[i].epoch == 1 && full[i].index_in_epoch == 0) breaks.insert(i + (full.size() - i) / 2);
  }
  for (std::size_t k : breaks) {
    if (k > full.size()) continue;
    SCOPED_TRACE("breakpoint after " + std::to_string(k) + " batches");
    std::string state;
    std::vector<BatchTrace> got;
    {
      Loader l(make(), options);
      got = drain(l, k);
      ASSERT_EQ(got.size(), k);
      state = l.state();
    }
    Loader resumed(make(), restore_options);
    resumed.load_state(state);
    auto rest = drain(resumed);
    got.insert(got.end(), rest.begin(), rest.end());
    ASSERT_EQ(got.size(), full.size());
    for (std::size_t i = 0; i < full.size(); ++i) ASSERT_EQ(got[i], full[i]) << "batch " << i;
  }
}

}  // namespace flowstate::testing
