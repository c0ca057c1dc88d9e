// The blobs of a checkpoint directory (core/state_blob.h): large immutable parts of a state —
// a file source's data identity — stored once per directory under blobs/, named by their
// content, and referred to by every step whose state holds them.
//
//   <dir>/blobs/0123456789abcdef.blob   an inline blob as the state held it (marker, size,
//                                       XXH3-64, payload), named by the XXH3-64
//
// A state file (state.bin, rank-K.bin) with references begins with "FLWSREFS" instead of the
// state's own "FLWSTATE"; one without any is the state as given.
//
// A blob is written (fsynced, renamed in, blobs/ fsynced) before the state that refers to it,
// so a committed step never refers to a blob that is not on disk. Blobs no step refers to are
// removed when steps are (pruning, a replaced step's old copy, remove_checkpoints), under the
// writers' lock.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/state_blob.h"
#include "flowstate/serialization/atomic_file.h"
#include "flowstate/serialization/checkpoint.h"
#include "flowstate/serialization/checkpoint_internal.h"

namespace flowstate::checkpoint_detail {

namespace fs = std::filesystem;

namespace {

/// "0123456789abcdef.blob": the file of the blob whose payload hashes to `hash`.
std::string blob_file_name(std::uint64_t hash) { return hex64(hash) + std::string(kBlobSuffix); }

/// The references in `bytes` (a state as stored), in order, with their offsets.
template <class Fn>
void for_each_reference(std::string_view bytes, Fn&& fn) {
  std::size_t pos = 0;
  while ((pos = bytes.find(kBlobRefMagic, pos)) != std::string_view::npos) {
    fn(pos);
    pos += kBlobHeaderBytes;
  }
}

}  // namespace

StoredState externalize_blobs(std::string_view state) {
  StoredState out;
  // Reading a stored state with references replaces every reference marker it holds: a state
  // that held one already (no flowstate state does) is stored as it is, so what is read back
  // is exact.
  if (state.find(kBlobRefMagic) != std::string_view::npos) {
    out.bytes = std::string(state);
    return out;
  }
  out.bytes.append(kStoredWithReferences);
  std::size_t pos = 0;
  while (true) {
    const std::size_t at = state.find(kBlobMagic, pos);
    if (at == std::string_view::npos) break;
    std::size_t next = at + 1;
    if (state.size() - at >= kBlobHeaderBytes) {
      const BlobHeader h = read_blob_header(state.data() + at);
      const std::size_t room = state.size() - at - kBlobHeaderBytes;
      if (h.size >= kMinExternalBlobBytes && h.size <= room &&
          hash64(state.data() + at + kBlobHeaderBytes, h.size) == h.hash) {
        out.bytes.append(state.substr(pos, at - pos));
        out.bytes.append(kBlobRefMagic);
        out.bytes.append(state.substr(at + 16, 16));  // the size and the hash
        out.blobs.push_back({blob_file_name(h.hash), state.substr(at, kBlobHeaderBytes + h.size)});
        pos = at + kBlobHeaderBytes + h.size;
        continue;
      }
    }
    out.bytes.append(state.substr(pos, next - pos));
    pos = next;
  }
  out.bytes.append(state.substr(pos));
  if (out.blobs.empty()) out.bytes = std::string(state);  // nothing stored apart
  return out;
}

void write_blobs(const std::string& dir, const StoredState& stored) {
  if (stored.blobs.empty()) return;
  const std::string blobs = join(dir, kBlobsDir);
  create_directories_durably(blobs);
  static std::atomic<std::uint64_t> counter{0};
  bool wrote = false;
  std::set<std::string> done;
  for (const auto& [name, blob] : stored.blobs) {
    if (!done.insert(name).second) continue;
    const std::string path = join(blobs, name);
    struct stat st {};
    // Already stored (by an earlier step, or another rank): named by its content, and every
    // read checks that content, so a file of the right size is kept.
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        static_cast<std::uint64_t>(st.st_size) == blob.size())
      continue;
    // Unique per writer: the ranks of one job (threads or processes) may store the same blob.
    const std::string tmp = path + "." + std::to_string(::getpid()) + "." +
                            std::to_string(counter.fetch_add(1)) + std::string(kTmpSuffix);
    try {
      write_file_durably(tmp, blob);
      rename_path(tmp, path);
    } catch (...) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw;
    }
    wrote = true;
  }
  if (wrote) fsync_directory(blobs);
}

std::string internalize_blobs(std::string_view stored, const std::string& dir,
                              const std::string& origin) {
  if (!stored.starts_with(kStoredWithReferences)) return std::string(stored);
  stored.remove_prefix(kStoredWithReferences.size());
  const std::string blobs = join(dir, kBlobsDir);
  std::string out;
  std::size_t pos = 0;
  for_each_reference(stored, [&](std::size_t at) {
    if (stored.size() - at < kBlobHeaderBytes)
      throw CheckpointError(origin, quote(origin) + " is corrupt: a blob reference at byte " +
                                        std::to_string(at) + " is cut short");
    const BlobHeader h = read_blob_header(stored.data() + at);
    const std::string path = join(blobs, blob_file_name(h.hash));
    std::string blob;
    try {
      blob = read_small_file(path, kBlobHeaderBytes + h.size);
    } catch (const CheckpointError& e) {
      std::error_code ec;
      if (!fs::exists(fs::symlink_status(path, ec)))
        throw CheckpointError(path, quote(path) + " is missing: " + quote(origin) +
                                        " refers to it (a data identity stored once for the "
                                        "checkpoint directory)");
      throw CheckpointError(path,
                            std::string(e.what()) + " (a blob " + quote(origin) + " refers to)");
    }
    if (blob.size() != kBlobHeaderBytes + h.size || blob.substr(0, 16) != kBlobMagic ||
        read_blob_header(blob.data()).size != h.size ||
        read_blob_header(blob.data()).hash != h.hash ||
        hash64(blob.data() + kBlobHeaderBytes, h.size) != h.hash)
      throw CheckpointError(path, quote(path) + " is corrupt: it is not the blob of " +
                                      std::to_string(h.size) + " bytes with XXH3-64 " +
                                      hex64(h.hash) + " that " + quote(origin) + " refers to");
    out.append(stored.substr(pos, at - pos));
    out.append(blob);
    pos = at + kBlobHeaderBytes;
  });
  out.append(stored.substr(pos));
  return out;
}

void collect_blobs(const std::string& dir) {
  const std::string blobs = join(dir, kBlobsDir);
  std::error_code ec;
  if (!fs::is_directory(blobs, ec)) return;
  // Every blob a step directory still refers to (step-N and step-N.old; *.tmp is debris).
  std::set<std::string> used;
  for (const auto& c : list_candidates(dir)) {
    try {
      for (const auto& entry : fs::directory_iterator(c.path)) {
        const std::string name = entry.path().filename().string();
        if (!name.ends_with(".bin")) continue;
        const std::string bytes = read_small_file(entry.path().string(), std::size_t{1} << 30);
        if (!std::string_view(bytes).starts_with(kStoredWithReferences)) continue;
        for_each_reference(bytes, [&](std::size_t at) {
          if (bytes.size() - at >= kBlobHeaderBytes)
            used.insert(blob_file_name(read_blob_header(bytes.data() + at).hash));
        });
      }
    } catch (const std::exception&) {
      return;  // a step that cannot be read: keep every blob rather than guess
    }
  }
  try {
    for (const auto& entry : fs::directory_iterator(blobs)) {
      const std::string name = entry.path().filename().string();
      if (used.count(name) != 0) continue;
      if (!name.ends_with(kBlobSuffix) && !name.ends_with(kTmpSuffix)) continue;
      remove_tree(entry.path().string());
    }
  } catch (const fs::filesystem_error&) {
    return;  // left for the next collection
  }
  // No fsync: a blob that comes back after a power loss is unreferenced, and collected again.
}

}  // namespace flowstate::checkpoint_detail
