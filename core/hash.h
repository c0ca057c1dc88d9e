// A fast 64-bit hash (XXH3) for digests, checksums and fingerprints. Stable across runs and
// machines: values may be stored on disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace flowstate {

/// XXH3-64 of `size` bytes at `data` with `seed`.
std::uint64_t hash64(const void* data, std::size_t size, std::uint64_t seed = 0);
inline std::uint64_t hash64(std::string_view s, std::uint64_t seed = 0) {
  return hash64(s.data(), s.size(), seed);
}
/// Mixes integers into one well-distributed 64-bit key (order matters).
std::uint64_t hash_combine(std::uint64_t a, std::uint64_t b);

/// Incremental XXH3-64. Not thread-safe.
class Hasher {
 public:
  explicit Hasher(std::uint64_t seed = 0);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  Hasher& update(const void* data, std::size_t size);
  Hasher& update(std::string_view s) { return update(s.data(), s.size()); }
  template <class T>
  Hasher& update_value(const T& v) {
    return update(&v, sizeof(T));
  }
  std::uint64_t digest() const;

 private:
  void* state_;
};

/// 16 lowercase hex digits.
std::string hex64(std::uint64_t v);

}  // namespace flowstate
