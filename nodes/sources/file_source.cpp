#include "flowstate/nodes/sources/file_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "flowstate/core/hash.h"

namespace flowstate {

std::string check_paths(const ParamValue& value) {
  const auto& paths = std::get<std::vector<std::string>>(value);
  if (paths.empty()) return "must name at least one file or glob";
  for (const auto& s : paths)
    if (s.empty()) return "must not contain an empty path";
  return "";
}

Tensor bytes_tensor(const void* data, std::size_t size) {
  Tensor t(DType::kUInt8, Shape{static_cast<std::int64_t>(size)});
  if (size > 0) std::memcpy(t.data(), data, size);
  return t;
}

std::array<std::uint64_t, kIdentityBlocks> identity_offsets(const std::string& name,
                                                            std::uint64_t bytes) {
  const std::uint64_t last = bytes > kIdentityBlockBytes ? bytes - kIdentityBlockBytes : 0;
  // The middle blocks are whole, aligned blocks drawn by a seed of the file's own: blocks a
  // writer is likely to change (a header, a tail) are sampled always, the rest by chance.
  const std::uint64_t blocks = std::max<std::uint64_t>(1, bytes / kIdentityBlockBytes);
  const std::uint64_t seed = hash_combine(hash64(name), bytes);
  std::array<std::uint64_t, kIdentityBlocks> at{};
  at.front() = 0;
  at.back() = last;
  for (std::size_t j = 1; j + 1 < kIdentityBlocks; ++j)
    at[j] = hash_combine(seed, j) % blocks * kIdentityBlockBytes;
  return at;
}

FileIdentity file_identity(std::string name, const MappedFile& file, std::uint64_t items,
                           bool full) {
  FileIdentity id{.name = std::move(name), .bytes = file.size(), .items = items};
  id.stat = file.stat();
  const auto at = identity_offsets(id.name, id.bytes);
  if (file.in_memory() || id.bytes == 0) {
    // A small file was read whole when it opened: its bytes are in memory, not mapped.
    for (std::size_t j = 0; j < kIdentityBlocks; ++j)
      id.blocks[j] = hash64(file.data() + std::min(at[j], id.bytes),
                            static_cast<std::size_t>(std::min<std::uint64_t>(
                                kIdentityBlockBytes, id.bytes - std::min(at[j], id.bytes))));
    if (full) id.full = hash64(file.data(), id.bytes);
    return id;
  }
  // The blocks are read with pread, not through the mapping: a mapping's pages, once touched,
  // count in the process's memory until unmapped (the kernel maps up to 64 KB around each
  // fault), and a mix of 2 000 inputs held every input's sampled blocks that way (issue 26).
  const int fd = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
  std::array<std::byte, kIdentityBlockBytes> buf;
  for (std::size_t j = 0; j < kIdentityBlocks; ++j) {
    const std::size_t size = static_cast<std::size_t>(
        std::min<std::uint64_t>(kIdentityBlockBytes, id.bytes - std::min(at[j], id.bytes)));
    std::size_t got = 0;
    while (fd >= 0 && got < size) {
      const ssize_t r = ::pread(fd, buf.data() + got, size - got, static_cast<off_t>(at[j] + got));
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    // The mapping where the file cannot be read so (the same bytes).
    id.blocks[j] = got == size ? hash64(buf.data(), size) : hash64(file.data() + at[j], size);
  }
  if (full) {
    // The whole file, read in 1 MiB chunks (not through the mapping, for the reason above).
    // A file cut short under the read is an error here, as a read through the mapping is.
    Hasher h;
    std::vector<std::byte> chunk(std::size_t{1} << 20);
    std::uint64_t offset = 0;
    while (offset < id.bytes) {
      const std::size_t want =
          static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), id.bytes - offset));
      const ssize_t r = fd >= 0 ? ::pread(fd, chunk.data(), want, static_cast<off_t>(offset)) : -1;
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw DataError(file.path(), offset,
                        "cannot read '" + file.path() + "' at byte " + std::to_string(offset) +
                            " to hash it whole (verify: full): " +
                            (r < 0 ? std::strerror(errno) : "it is shorter than when opened"));
      h.update(chunk.data(), static_cast<std::size_t>(r));
      offset += static_cast<std::uint64_t>(r);
    }
    // hash64 of the whole bytes and the streamed hash agree (both XXH3-64, seed 0).
    id.full = h.digest();
  }
  if (fd >= 0) ::close(fd);
  return id;
}

namespace {

/// What of a file's file-system identity changed: "inode, mtime and ctime".
std::string stat_changes(const FileStat& was, const FileStat& is) {
  std::vector<std::string> parts;
  if (was.device != is.device) parts.push_back("device");
  if (was.inode != is.inode) parts.push_back("inode");
  if (was.mtime_ns != is.mtime_ns) parts.push_back("mtime");
  if (was.ctime_ns != is.ctime_ns) parts.push_back("ctime");
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i)
    out += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return out;
}

}  // namespace

std::vector<std::string> identity_differences(const DataIdentity& saved, const DataIdentity& now,
                                              const std::string& unit, FileVerify verify) {
  std::vector<std::string> out;
  // By name, in O(files): a source may open 100 000 files.
  std::unordered_map<std::string_view, const FileIdentity*> saved_by_name, now_by_name;
  for (const auto& f : saved.files) saved_by_name.emplace(f.name, &f);
  for (const auto& f : now.files) now_by_name.emplace(f.name, &f);
  auto find = [](const auto& by_name, const std::string& name) -> const FileIdentity* {
    const auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  for (const auto& was : saved.files) {
    const FileIdentity* is = find(now_by_name, was.name);
    if (is == nullptr) {
      out.push_back(was.name + " was in the checkpoint and is gone");
    } else if (was.etag && is->etag && *was.etag != *is->etag) {
      // A remote object's ETag is its version: any other one is another object.
      out.push_back(was.name + ": the object changed (ETag " + *was.etag + " in checkpoint, " +
                    *is->etag + " now)");
    } else if (was.bytes != is->bytes) {
      out.push_back(was.name + ": " + std::to_string(was.bytes) + " bytes in checkpoint, " +
                    std::to_string(is->bytes) + " now");
    } else if (was.items != is->items) {
      out.push_back(was.name + ": " + std::to_string(was.items) + " " + unit + " in checkpoint, " +
                    std::to_string(is->items) + " now");
    } else if (was.blocks != is->blocks) {
      const auto at = identity_offsets(was.name, was.bytes);
      std::size_t j = 0;
      while (was.blocks[j] == is->blocks[j]) ++j;
      out.push_back(was.name + ": content differs (sampled block at offset " +
                    std::to_string(at[j]) + ")");
    } else if (verify != FileVerify::kBlocks && was.full && is->full) {
      // Both hashed whole: the content decides, whatever the file system says.
      if (*was.full != *is->full) out.push_back(was.name + ": content differs (whole-file hash)");
    } else if (verify != FileVerify::kBlocks && was.stat && is->stat && *was.stat != *is->stat) {
      out.push_back(
          was.name + ": not the file the checkpoint read (" + stat_changes(*was.stat, *is->stat) +
          " changed), though its size and sampled blocks agree: it was replaced, changed in place, "
          "or copied. " +
          (was.full ? "The checkpoint holds its whole-file hash: resume with verify: full to "
                      "compare the whole content"
                    : "If the data directory was copied or moved unchanged, resume with verify: "
                      "blocks to accept it on the sampled blocks (checkpoints written with "
                      "verify: full accept a copy whose whole content agrees)"));
    }
  }
  for (const auto& f : now.files)
    if (find(saved_by_name, f.name) == nullptr)
      out.push_back(f.name + " is new (not in the checkpoint)");
  // Same files, same contents, another order: record numbers would mean other records.
  auto same_names = [&] {
    if (saved.files.size() != now.files.size()) return false;
    for (std::size_t i = 0; i < saved.files.size(); ++i)
      if (saved.files[i].name != now.files[i].name) return false;
    return true;
  };
  if (out.empty() && !same_names()) out.push_back("the files are the same but in another order");
  return out;
}

std::string inspect_file_source(InArchive& ar, const InspectContext& ctx) {
  FileSourceState s;
  if (ctx.whole_entry) {
    ar(s);
  } else {
    CursorState c;
    ar(c);
    s = {c.epoch, c.cursor, nullptr};
  }
  JsonObject j;
  j.add("epoch", s.epoch).add("cursor", s.cursor);
  if (s.identity) {
    std::string files = "[";
    for (const auto& f : s.identity->files) {
      Hasher h;
      for (auto b : f.blocks) h.update_value(b);
      JsonObject o;
      o.add("name", f.name)
          .add("bytes", f.bytes)
          .add("items", f.items)
          .add("hash", hex64(h.digest()));
      if (f.stat)
        o.add("device", f.stat->device)
            .add("inode", f.stat->inode)
            .add_raw("mtime_ns", std::to_string(f.stat->mtime_ns))
            .add_raw("ctime_ns", std::to_string(f.stat->ctime_ns));
      if (f.full) o.add("full_hash", hex64(*f.full));
      if (f.etag) o.add("etag", *f.etag);
      if (files.size() > 1) files += ',';
      files += o.str();
    }
    j.add_raw("files", files + "]");
  }
  if (s.epoch_files) {
    // The epoch continues over the files it started with (a change of the files within it).
    std::string files = "[";
    for (const auto& f : s.epoch_files->files) {
      if (files.size() > 1) files += ',';
      files += JsonObject().add("name", f.name).str();
    }
    j.add("changed_at", s.changed_at).add_raw("epoch_files", files + "]");
  }
  return j.str();
}

FileSource::FileSource(std::string name, std::string kind, std::string unit,
                       std::uint32_t source_id)
    : StatefulSpineNode(std::move(name)),
      source_id_(source_id),
      kind_(std::move(kind)),
      unit_(std::move(unit)) {
  state_.identity = identity_;
}

void FileSource::add_file(const ExpandedPath& path, const MappedFile& file, std::uint64_t records) {
  // A remote object's cached copy is named by its URL: messages about its records name the
  // object, not a path in the cache.
  files_.push_back(path.keep ? path.name : path.path);
  FileIdentity id = file_identity(path.name, file, records, verify_ == FileVerify::kFull);
  if (path.keep) {
    // A cached copy of a remote object: its inode and times are the cache's, not the object's
    // (a resume may download it again, or into another cache), so no stat is recorded; the
    // object's ETag (as listed), size and sampled blocks identify it.
    keep_.push_back(path.keep);
    id.stat.reset();
  }
  if (!path.etag.empty()) id.etag = path.etag;
  identity_->files.push_back(std::move(id));
  total_ += records;
  first_.push_back(total_);
}

void FileSource::add_remote_file(const std::string& url, std::uint64_t bytes,
                                 const std::string& etag, std::uint64_t records) {
  files_.push_back(url);
  FileIdentity id{.name = url, .bytes = bytes, .items = records};
  for (std::size_t j = 0; j < kIdentityBlocks; ++j) id.blocks[j] = hash_combine(hash64(etag), j);
  if (!etag.empty()) id.etag = etag;  // a changed object is refused naming both ETags
  identity_->files.push_back(std::move(id));
  total_ += records;
  first_.push_back(total_);
}

void FileSource::add_remote_file(const std::string& url, std::uint64_t bytes,
                                 const std::string& etag, std::uint64_t records,
                                 const std::array<std::uint64_t, kIdentityBlocks>& blocks,
                                 std::uint64_t full) {
  files_.push_back(url);
  FileIdentity id{.name = url, .bytes = bytes, .items = records, .blocks = blocks};
  if (verify_ == FileVerify::kFull) id.full = full;
  if (!etag.empty()) id.etag = etag;
  identity_->files.push_back(std::move(id));
  total_ += records;
  first_.push_back(total_);
}

Ref FileSource::at(std::uint64_t epoch, std::uint64_t i) const {
  if (view_ && epoch == view_->epoch) [[unlikely]]
    return position_at(i);
  // The file holding i: the last k with first_[k] <= i.
  auto it = std::upper_bound(first_.begin(), first_.end(), i);
  auto k = static_cast<std::uint32_t>(it - first_.begin() - 1);
  return Ref{source_id_, k, i};
}

void FileSource::start_epoch(std::uint64_t epoch) {
  state_.epoch = epoch;
  state_.cursor = 0;
  epoch_started(epoch);
  if (view_ && epoch != view_->epoch) {
    // A new epoch reads the files opened: the epoch that started with others has ended.
    view_ = nullptr;
    state_.epoch_files = nullptr;
    state_.changed_at = 0;
  }
}

std::size_t FileSource::pull(std::span<Ref> out) {
  std::size_t n = static_cast<std::size_t>(
      std::min<std::uint64_t>(out.size(), size(state_.epoch) - state_.cursor));
  if (view_ && state_.epoch == view_->epoch) [[unlikely]] {
    // In order over the epoch's records before the change, then the kept files' (view_at).
    for (std::size_t j = 0; j < n; ++j) out[j] = view_at(state_.cursor + j);
  } else {
    for (std::size_t j = 0; j < n; ++j) out[j] = at(state_.epoch, state_.cursor + j);
  }
  state_.cursor += n;
  return n;
}

void FileSource::out_of_range(const Ref& ref) const {
  throw DataError(ref.shard < files_.size() ? files_[ref.shard] : kind_, DataError::kNoOffset,
                  "record " + std::to_string(ref.index) + " is out of range");
}

void FileSource::fail_record(const Ref& ref, const std::string& what) const {
  const std::uint64_t i = local(ref);
  throw DataError(files_[ref.shard], DataError::kNoOffset,
                  "'" + files_[ref.shard] + "' record " + std::to_string(i) + ": " + what);
}

void FileSource::restore(InArchive& ar) {
  FileSourceState s;
  ar(s);
  if (s.identity) {
    const auto diffs = identity_differences(*s.identity, *identity_, unit_, verify_);
    if (!diffs.empty()) s = continue_over_files(std::move(s), diffs);
  }
  std::shared_ptr<const FileEpochView> view;
  if (s.epoch_files) view = epoch_view(s);
  const std::uint64_t n = view ? view->size : total_;
  if (s.cursor > n)
    throw CheckpointError(name(), kind_ + " cursor " + std::to_string(s.cursor) +
                                      " is past the source's " + std::to_string(n) + " records");
  state_ = {s.epoch, s.cursor, identity_, s.epoch_files, s.changed_at};
  view_ = std::move(view);
}

void FileSource::restore_legacy(InArchive& ar) {
  CursorState c;
  ar(c);
  FileSourceState s{c.epoch, c.cursor, identity_};
  validate(s);
  state_ = std::move(s);
  view_ = nullptr;
}

void FileSource::validate(const FileSourceState& s) const {
  if (s.cursor > total_)
    throw CheckpointError(name(), kind_ + " cursor " + std::to_string(s.cursor) +
                                      " is past the source's " + std::to_string(total_) +
                                      " records");
}

}  // namespace flowstate
