// `flowstate gen records`: a synthetic records data set. Record i (global index) starts with
// i as a little-endian uint64 (truncated when the record is shorter), followed by
// philox64(seed, i, k) for the k-th further 8 bytes, little-endian: the layout of
// tests/support's write_records, so tests and benchmarks can check what they read.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "cli/command.h"
#include "core/error.h"
#include "core/rng.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate gen records --out DIR --records N --record-bytes R [--shards S]\n"
    "                             [--seed X]\n\n"
    "Writes S shard files DIR/part-00000.bin, ... holding N records of R bytes in total\n"
    "(shard k holds records [N*k/S, N*(k+1)/S)). Record i starts with i as a little-endian\n"
    "uint64 (truncated when R < 8); the rest are deterministic bytes from the seed.\n\n"
    "  --shards S   shard files (default 1)\n"
    "  --seed X     seed of the record bytes (default 7)\n";

constexpr std::size_t kChunkBytes = std::size_t{8} << 20;

void put_le(std::byte* dst, std::uint64_t v, std::size_t n) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(dst, &v, n);
  } else {
    for (std::size_t k = 0; k < n; ++k) dst[k] = static_cast<std::byte>(v >> (8 * k));
  }
}

void fill_record(std::byte* dst, std::uint64_t index, std::size_t record_bytes,
                 std::uint64_t seed) {
  put_le(dst, index, std::min<std::size_t>(8, record_bytes));
  for (std::size_t b = 8; b < record_bytes; b += 8)
    put_le(dst + b, philox64(seed, index, b / 8), std::min<std::size_t>(8, record_bytes - b));
}

std::string shard_name(std::size_t shard) {
  char name[32];
  std::snprintf(name, sizeof(name), "part-%05zu.bin", shard);
  return name;
}

/// Writes one shard through a temporary name, renamed into place when complete.
void write_shard(const std::filesystem::path& dir, std::size_t shard, std::uint64_t begin,
                 std::uint64_t end, std::size_t record_bytes, std::uint64_t seed) {
  const std::string final_path = (dir / shard_name(shard)).string();
  const std::string tmp_path = (dir / ("." + shard_name(shard) + ".tmp")).string();
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw DataError(tmp_path, DataError::kNoOffset,
                    "cannot create '" + tmp_path + "': " + std::strerror(errno));
  const std::size_t per_chunk = std::max<std::size_t>(1, kChunkBytes / record_bytes);
  std::vector<std::byte> buf(per_chunk * record_bytes);
  std::uint64_t offset = 0;
  try {
    for (std::uint64_t i = begin; i < end;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(per_chunk, end - i));
      for (std::size_t r = 0; r < n; ++r)
        fill_record(buf.data() + r * record_bytes, i + r, record_bytes, seed);
      const std::size_t bytes = n * record_bytes;
      for (std::size_t done = 0; done < bytes;) {
        ssize_t w = ::write(fd, buf.data() + done, bytes - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
          throw DataError(tmp_path, offset + done,
                          "cannot write '" + tmp_path + "': " + std::strerror(errno));
        done += static_cast<std::size_t>(w);
      }
      offset += bytes;
      i += n;
    }
    if (::close(fd) != 0) {
      fd = -1;
      throw DataError(tmp_path, DataError::kNoOffset,
                      "cannot close '" + tmp_path + "': " + std::strerror(errno));
    }
    fd = -1;
    std::error_code ec;
    std::filesystem::rename(tmp_path, final_path, ec);
    if (ec)
      throw DataError(final_path, DataError::kNoOffset,
                      "cannot rename '" + tmp_path + "' to '" + final_path + "': " + ec.message());
  } catch (...) {
    if (fd >= 0) ::close(fd);
    std::error_code ec;
    std::filesystem::remove(tmp_path, ec);
    throw;
  }
}

}  // namespace

int cmd_gen(std::span<const std::string> argv) {
  Args args(argv, {"--out", "--records", "--record-bytes", "--shards", "--seed"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1 || args.positional()[0] != "records")
    throw UsageError("expected 'flowstate gen records --out DIR ...'");
  const std::filesystem::path dir = args.required("--out");
  const std::uint64_t records = parse_uint(args.required("--records"), "--records");
  args.required("--record-bytes");
  const std::uint64_t record_bytes = *args.uint("--record-bytes", 1, std::uint64_t{1} << 30);
  const std::uint64_t shards = args.uint("--shards", 1, 1'000'000).value_or(1);
  const std::uint64_t seed = args.uint("--seed").value_or(7);

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw ConfigError("--out", "--out: cannot create '" + dir.string() + "': " + ec.message());
  // Only our shard files may match *.bin afterwards: a glob over DIR must see this data set.
  std::set<std::string> ours;
  for (std::size_t s = 0; s < shards; ++s) ours.insert(shard_name(s));
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.ends_with(".bin") && ours.count(name) == 0)
      throw ConfigError("--out", "--out: '" + dir.string() + "' already holds '" + name +
                                     "', which is not part of this data set; use an empty "
                                     "directory (files named *.bin would be read with it)");
  }

  const auto start = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  const std::size_t threads = static_cast<std::size_t>(
      std::min<std::uint64_t>(shards, std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (std::size_t s; (s = next++) < shards;) {
        try {
          auto bound = [&](std::uint64_t k) {
            return static_cast<std::uint64_t>(static_cast<Uint128>(records) * k / shards);
          };
          write_shard(dir, s, bound(s), bound(s + 1), static_cast<std::size_t>(record_bytes), seed);
        } catch (...) {
          std::lock_guard lock(error_mu);
          if (!error) error = std::current_exception();
          next = shards;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double bytes = static_cast<double>(records) * static_cast<double>(record_bytes);
  note("wrote " + std::to_string(records) + " records of " + std::to_string(record_bytes) +
       " bytes (" + format_bytes(bytes) + ") in " + std::to_string(shards) + " files to " +
       (dir / "part-*.bin").string() + " in " + std::to_string(secs).substr(0, 5) + " s");
  return kExitOk;
}

}  // namespace flowstate::cli
