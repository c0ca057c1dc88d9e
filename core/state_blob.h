// State blobs: a large, immutable part of a node's state (a file source's data identity: ~100
// bytes per file, megabytes at 100 000 files) written so that an on-disk checkpoint can store
// it once per checkpoint directory, content-addressed, instead of once per step.
//
// In a state in memory (Loader::state(), Python's state_dict) a blob is inline and the state is
// self-contained: kBlobMagic, the payload's size and XXH3-64 (little-endian uint64 each), then
// the payload. A checkpoint writer replaces each blob of at least kMinExternalBlobBytes by a
// reference — kBlobRefMagic, the same size and hash, 32 bytes — and stores the payload in the
// directory's blobs/; reading the checkpoint puts the payload back, so what a reader returns
// is the state as it was given, byte for byte (serialization/checkpoint.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "flowstate/core/hash.h"

namespace flowstate {

/// The 16 bytes that begin an inline blob.
inline constexpr std::string_view kBlobMagic{
    "\x7f"
    "flowstate-blob\x01",
    16};
/// The 16 bytes that begin a reference to a blob stored beside a checkpoint.
inline constexpr std::string_view kBlobRefMagic{
    "\x7f"
    "flowstate-bref\x01",
    16};
/// Bytes of a blob's header (magic, size, hash), and of a whole reference.
inline constexpr std::size_t kBlobHeaderBytes = 32;
/// Blobs smaller than this stay inline in a checkpoint's state: a file per small identity
/// would cost more than it saves.
inline constexpr std::size_t kMinExternalBlobBytes = 4096;

namespace blob_detail {
inline void put_le64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline std::uint64_t get_le64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
}  // namespace blob_detail

/// `payload` as an inline blob (see the file comment).
inline std::string wrap_blob(std::string_view payload) {
  std::string out;
  out.reserve(kBlobHeaderBytes + payload.size());
  out.append(kBlobMagic);
  blob_detail::put_le64(out, payload.size());
  blob_detail::put_le64(out, hash64(payload));
  out.append(payload);
  return out;
}

/// The size and hash a blob or reference header at `p` (kBlobHeaderBytes readable) states.
struct BlobHeader {
  std::uint64_t size = 0;
  std::uint64_t hash = 0;
};
inline BlobHeader read_blob_header(const char* p) {
  return {blob_detail::get_le64(p + 16), blob_detail::get_le64(p + 24)};
}

/// The payload of the inline blob `blob` (exactly one blob); throws std::runtime_error when it
/// is not one, is cut short, or its payload does not hash to what its header says.
inline std::string_view unwrap_blob(std::string_view blob) {
  if (blob.size() >= kBlobHeaderBytes && blob.substr(0, 16) == kBlobRefMagic)
    throw std::runtime_error(
        "a state blob is a reference to a checkpoint directory's blobs/ (state bytes taken from "
        "a checkpoint's state.bin without read_checkpoint?)");
  if (blob.size() < kBlobHeaderBytes || blob.substr(0, 16) != kBlobMagic)
    throw std::runtime_error("a state blob does not begin with its marker");
  const BlobHeader h = read_blob_header(blob.data());
  if (h.size != blob.size() - kBlobHeaderBytes)
    throw std::runtime_error("a state blob says " + std::to_string(h.size) + " bytes and holds " +
                             std::to_string(blob.size() - kBlobHeaderBytes));
  const std::string_view payload = blob.substr(kBlobHeaderBytes);
  if (hash64(payload) != h.hash) throw std::runtime_error("a state blob's checksum does not match");
  return payload;
}

}  // namespace flowstate
