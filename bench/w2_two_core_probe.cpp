// A design probe for W2 on two cores (issue 26): does the copy split across two threads when
// one thread plans and hands each batch over as a flat plan? Not flowstate: a hand-written
// packer over the same Megatron data set, like w2_ceiling, in three shapes:
//
//   w2_two_core_probe PREFIX.idx one         one thread plans each batch and copies it
//   w2_two_core_probe PREFIX.idx two         a planner thread hands every batch over to a
//                                            copier thread
//   w2_two_core_probe PREFIX.idx two EVERY   the same, the planner copying 1 batch in EVERY
//                                            itself (the load shared between the two cores)
//
// A batch's plan is flat: (first token, count, end-of-document after?) triples in one struct,
// so the copier reads a few consecutive lines per batch and chases no pointer the planner
// wrote — the cross-core traffic is the ring slot itself. The planner does what flowstate's
// spine does for W2 minus its bookkeeping: the document order (drawn before the clock
// starts), the index lookups (prefetched 16 documents ahead) and the cutting into rows. The
// .bin's pages are faulted inside the timed part (PMD-mapped when the page cache holds it in
// 2 MiB folios), as a whole process pays them. Prints one JSON line.
//
// Only uint16 data sets (Megatron dtype code 8), as `flowstate gen indexed` writes them.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "w2_map.h"

namespace {

constexpr std::size_t kLength = 2048, kBatch = 8, kTokens = kLength * kBatch, kRing = 64;

struct Piece {
  const std::uint16_t* src;
  std::uint32_t count;
  std::uint32_t eos;  ///< 1: an end-of-document token follows the piece
};

/// One batch's copy, flat. A batch of 8 rows of 2048 tokens holds at most a few dozen pieces
/// of W2's documents (~660 tokens on average); 256 leaves room for short ones.
struct Plan {
  std::uint32_t n = 0;
  Piece pieces[256];
};

void copy(const Plan& plan, std::uint16_t* dst) {
  std::size_t at = 0;
  for (std::uint32_t k = 0; k < plan.n; ++k) {
    std::memcpy(dst + at, plan.pieces[k].src, plan.pieces[k].count * sizeof(std::uint16_t));
    at += plan.pieces[k].count;
    if (plan.pieces[k].eos != 0) dst[at++] = 0;
  }
  if (at != kTokens) std::abort();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: w2_two_core_probe PREFIX.idx one|two [EVERY]\n");
    return 2;
  }
  const std::string idx_path = argv[1];
  const bool two = std::string(argv[2]) == "two";
  const int every = argc > 3 ? std::atoi(argv[3]) : 0;
  const w2::Map idx = w2::map_file(idx_path, true);
  const w2::Map bin = w2::map_file(idx_path.substr(0, idx_path.size() - 4) + ".bin", false);
  if (static_cast<std::uint8_t>(idx.data[17]) != 8) {
    std::fprintf(stderr, "w2_two_core_probe: only uint16 data sets\n");
    return 1;
  }
  std::uint64_t n = 0;
  std::memcpy(&n, idx.data + 18, 8);
  const std::byte* lengths = idx.data + 34;
  const std::byte* pointers = lengths + 4 * n;
  auto length = [&](std::uint32_t d) {
    std::int32_t v;
    std::memcpy(&v, lengths + 4 * d, 4);
    return static_cast<std::size_t>(v);
  };
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 rng(1234);
  std::shuffle(order.begin(), order.end(), rng);

  // Plans every batch of the epoch in order, handing each to `emit`.
  auto plan_epoch = [&](auto&& emit) {
    Plan plan;
    std::size_t at = 0;
    for (std::size_t k = 0; k < n; ++k) {
      if (k + 16 < n) {
        const std::uint32_t q = order[k + 16];
        __builtin_prefetch(pointers + 8 * q);
        __builtin_prefetch(lengths + 4 * q);
      }
      const std::uint32_t d = order[k];
      std::int64_t pointer = 0;
      std::memcpy(&pointer, pointers + 8 * d, 8);
      const auto* src = reinterpret_cast<const std::uint16_t*>(bin.data + pointer);
      std::size_t left = length(d) + 1;  // and its end-of-document token
      while (left > 0) {
        const std::size_t take = std::min(left, kTokens - at);
        const std::size_t body = std::min(take, left - 1);
        plan.pieces[plan.n++] = {src, static_cast<std::uint32_t>(body), body < take ? 1u : 0u};
        __builtin_prefetch(src);
        src += body;
        at += take;
        left -= take;
        if (at == kTokens) {
          emit(plan);
          plan.n = 0;
          at = 0;
        }
      }
    }
  };

  std::vector<std::vector<std::uint16_t>> mine(8, std::vector<std::uint16_t>(kTokens));
  std::vector<std::vector<std::uint16_t>> theirs(8, std::vector<std::uint16_t>(kTokens));
  std::uint64_t batches = 0, handed = 0, sink = 0, their_sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (!two) {
    plan_epoch([&](const Plan& plan) {
      copy(plan, mine[batches % 8].data());
      sink += mine[batches % 8][batches % kTokens];
      ++batches;
    });
  } else {
    std::vector<Plan> ring(kRing);
    std::atomic<std::uint64_t> head{0}, tail{0};  // plans handed over / copied
    std::atomic<bool> done{false};
    std::thread copier([&] {
      std::uint64_t t = 0;
      for (;;) {
        const std::uint64_t h = head.load(std::memory_order_acquire);
        if (t == h) {
          if (done.load(std::memory_order_acquire) && t == head.load(std::memory_order_acquire))
            break;
          continue;
        }
        for (; t < h; ++t) {
          copy(ring[t % kRing], theirs[t % 8].data());
          their_sink += theirs[t % 8][t % kTokens];
        }
        tail.store(t, std::memory_order_release);
      }
    });
    std::uint64_t k = 0;
    plan_epoch([&](const Plan& plan) {
      if (every > 0 && k++ % static_cast<std::uint64_t>(every) == 0) {
        copy(plan, mine[batches % 8].data());
        sink += mine[batches % 8][batches % kTokens];
        ++batches;
        return;
      }
      while (handed - tail.load(std::memory_order_acquire) >= kRing) {
      }
      Plan& slot = ring[handed % kRing];  // the pieces used, not the whole struct
      slot.n = plan.n;
      std::copy_n(plan.pieces, plan.n, slot.pieces);
      head.store(++handed, std::memory_order_release);
    });
    done.store(true, std::memory_order_release);
    copier.join();
    sink += their_sink;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"impl\": \"two_core_probe\", \"what\": \"w2\", \"shape\": \"%s\", \"every\": %d, "
      "\"seconds\": %.4f, \"tokens_per_s\": %.1f, \"batches\": %llu, \"handed\": %llu, "
      "\"sink\": %llu}\n",
      two ? "two" : "one", every, s, static_cast<double>((batches + handed) * kTokens) / s,
      static_cast<unsigned long long>(batches + handed), static_cast<unsigned long long>(handed),
      static_cast<unsigned long long>(sink));
  return 0;
}
