// Helpers shared by the checkpoint tests: damaging files on purpose, listing directories, and
// the small pipelines the tests run.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"

namespace flowstate::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// Overwrites `path` in place with `bytes` of the same size (no truncation: on ext4 a
/// truncate-and-rewrite flushes the file on close, which makes damage loops slow).
inline void overwrite_file(const std::string& path, const std::string& bytes) {
  if (std::filesystem::file_size(path) != bytes.size())
    throw std::runtime_error("overwrite_file: size differs for " + path);
  std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// XORs the byte at `offset` of `path` with `mask`.
inline void flip_byte(const std::string& path, std::size_t offset, unsigned char mask = 0x01) {
  std::string bytes = read_file(path);
  bytes.at(offset) = static_cast<char>(static_cast<unsigned char>(bytes[offset]) ^ mask);
  overwrite_file(path, bytes);
}

inline void truncate_file(const std::string& path, std::size_t size) {
  std::filesystem::resize_file(path, size);
}

/// The names in `dir` (not recursive).
inline std::set<std::string> list_dir(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

/// Copies directory `from` (recursively) to `to`.
inline void copy_tree(const std::string& from, const std::string& to) {
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

/// "step-000000000042".
inline std::string step_dir(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012llu", static_cast<unsigned long long>(step));
  return buf;
}

/// The text of the CheckpointError `f()` throws; fails the test when it throws nothing.
template <class F>
std::string checkpoint_error(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return {};
}

/// Runs a test body in another working directory (for pipelines with relative paths, whose
/// fingerprint must not depend on where the test runs). Restores the old one on exit.
class ChangeDirectory {
 public:
  explicit ChangeDirectory(const std::string& dir) : old_(std::filesystem::current_path()) {
    std::filesystem::current_path(dir);
  }
  ~ChangeDirectory() { std::filesystem::current_path(old_); }
  ChangeDirectory(const ChangeDirectory&) = delete;
  ChangeDirectory& operator=(const ChangeDirectory&) = delete;

 private:
  std::filesystem::path old_;
};

}  // namespace flowstate::testing
