// The single-thread ceiling of W2 (docs/DESIGN.md §11): one thread copies the documents of a
// Megatron indexed data set, in a random order fixed up front, into rows of 2048 tokens with
// an end-of-document token after each, 8 rows to a batch buffer — what packing costs with no
// pipeline around it (no state, no checkpoint, no threads). Prints one JSON line:
//
//   w2_ceiling DIR/corpus.idx [--epochs N] [--label S]
//
// Only uint16 data sets (Megatron dtype code 8), as `flowstate gen indexed` writes them.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

struct Map {
  const std::byte* data = nullptr;
  std::size_t size = 0;
};

Map map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  struct stat st {};
  ::fstat(fd, &st);
  Map m;
  m.size = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  m.data = static_cast<const std::byte*>(p);
  return m;
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: w2_ceiling PREFIX.idx [--epochs N] [--label S]\n");
    return 2;
  }
  const std::string idx_path = argv[1];
  int epochs = 1;
  std::string label;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--epochs") epochs = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--label") label = argv[i + 1];
  }
  constexpr std::size_t kLength = 2048, kBatch = 8;
  constexpr std::uint16_t kEos = 0;
  const auto t_open = std::chrono::steady_clock::now();
  const Map idx = map_file(idx_path);
  const Map bin = map_file(idx_path.substr(0, idx_path.size() - 4) + ".bin");
  if (load<std::uint8_t>(idx.data + 17) != 8) {
    std::fprintf(stderr, "w2_ceiling: only uint16 data sets\n");
    return 1;
  }
  const auto n = load<std::uint64_t>(idx.data + 18);
  const std::byte* lengths = idx.data + 34;
  const std::byte* pointers = lengths + 4 * n;
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);

  std::vector<std::uint16_t> batch(kLength * kBatch);
  std::size_t at = 0;  // tokens in `batch`
  std::uint64_t rows = 0, sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int e = 0; e < epochs; ++e) {
    std::mt19937_64 rng(1234 + e);
    std::shuffle(order.begin(), order.end(), rng);
    for (const std::uint32_t d : order) {
      const auto* src =
          reinterpret_cast<const std::uint16_t*>(bin.data + load<std::int64_t>(pointers + 8 * d));
      std::size_t left = static_cast<std::size_t>(load<std::int32_t>(lengths + 4 * d)) + 1;
      while (left > 0) {
        const std::size_t take = std::min(left, batch.size() - at);
        const std::size_t body = std::min(take, left - 1);  // the EOS is the last token
        std::memcpy(batch.data() + at, src, body * 2);
        src += body;
        if (body < take) batch[at + body] = kEos;
        at += take;
        left -= take;
        if (at == batch.size()) {  // a full batch: "hand it on"
          sink += batch[rows % batch.size()];
          rows += kBatch;
          at = 0;
        }
      }
    }
    at = 0;  // the epoch's partial batch is dropped
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double open_s = std::chrono::duration<double>(t0 - t_open).count();
  std::printf(
      "{\"impl\": \"ceiling\", \"what\": \"w2\", \"workers\": 1, \"tokens_per_s\": %.1f, "
      "\"rows_per_s\": %.1f, \"seconds\": %.3f, \"open_s\": %.4f, \"epochs\": %d, \"sink\": "
      "%llu%s%s%s}\n",
      static_cast<double>(rows * kLength) / s, static_cast<double>(rows) / s, s, open_s, epochs,
      static_cast<unsigned long long>(sink), label.empty() ? "" : ", \"label\": \"", label.c_str(),
      label.empty() ? "" : "\"");
  return 0;
}
