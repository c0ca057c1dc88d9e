// IndexedFile: one Megatron PREFIX.idx + PREFIX.bin pair — the index's checks (at open, as
// it is read), its copy into huge pages, and the byte ranges of its documents and sequences.
// The `indexed` source over many pairs is indexed.cpp.
#include "flowstate/nodes/sources/indexed.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "flowstate/core/error.h"

namespace flowstate {
namespace {

template <class T>
T load_le(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and aarch64 are little-endian, as the format is
  return v;
}

}  // namespace

std::byte* IndexCopies::allocate(std::size_t bytes) {
  constexpr std::size_t kBlock = std::size_t{64} << 20;
  bytes = (bytes + 7) / 8 * 8;
  if (bytes > kBlock / 4) {
    blocks_.push_back(std::make_unique_for_overwrite<std::byte[]>(bytes));
    return blocks_.back().get();
  }
  if (bytes > left_) {
    blocks_.push_back(std::make_unique_for_overwrite<std::byte[]>(kBlock));
    next_ = blocks_.back().get();
    left_ = kBlock;
  }
  std::byte* at = next_;
  next_ += bytes;
  left_ -= bytes;
  return at;
}

IndexedFile::IndexedFile(const std::string& idx_path, IndexCopies* copies) {
  idx_ = std::make_shared<const MappedFile>(idx_path);
  idx_size_ = idx_->size();
  idx_data_ = idx_->data();
  // The header and the .bin first: the copy checks the entries as it reads them.
  check_index(idx_path);
  bin_ = std::make_shared<const MappedFile>(megatron_bin_path(idx_path));
  bin_data_ = bin_->data();
  bin_name_ = bin_->path();
  bin_size_ = bin_->size();
  if (copies == nullptr || idx_->in_memory() || !copy_index_into(*copies))
    copy_index_into_huge_pages();
  check_entries(idx_path);
}

void IndexedFile::read_bin_through_set(std::size_t slot) {
  in_set_ = true;
  set_slot_ = slot;
  bin_.reset();
  bin_data_ = nullptr;
}

void IndexedFile::use_set(const MappedFileSet* set) {
  if (in_set_) set_ = set;
}

std::span<const std::byte> IndexedFile::unmapped_bin_bytes(std::uint64_t begin,
                                                           std::uint64_t end) const {
  const auto n = static_cast<std::size_t>(end - begin);
  if (blocks_ != nullptr) return blocks_->read(bin_object_, begin, n);
  if (set_ != nullptr && n > 0) return set_->read(set_slot_, begin, n);
  return {};  // an empty .bin (its mapping holds no bytes)
}

IndexedFile::IndexedFile(std::shared_ptr<const CachePin> idx, const std::string& idx_url,
                         const RemoteBlocks& blocks, std::size_t bin_object)
    : idx_pin_(std::move(idx)), blocks_(&blocks), bin_object_(bin_object) {
  idx_ = std::make_shared<const MappedFile>(idx_pin_->path());
  idx_size_ = idx_->size();
  idx_data_ = idx_->data();
  // Messages name the object, not its copy in the cache.
  check_index(idx_url);
  bin_name_ = blocks.objects()[bin_object].url;
  bin_size_ = blocks.objects()[bin_object].size;
  copy_index_into_huge_pages();
  check_entries(idx_url);
}

void IndexedFile::check_index(const std::string& idx_path) {
  const std::byte* p = idx_data_;
  const std::uint64_t size = idx_size_;
  auto fail = [&](std::uint64_t offset, const std::string& why) -> DataError {
    return DataError(idx_path, offset, "'" + idx_path + "' is not a valid Megatron index: " + why);
  };
  if (size < kMegatronHeaderBytes)
    throw fail(0, std::to_string(size) + " bytes, shorter than its " +
                      std::to_string(kMegatronHeaderBytes) + "-byte header");
  if (std::memcmp(p, kMegatronMagic, sizeof(kMegatronMagic)) != 0)
    throw fail(0, "it does not start with \"MMIDIDX\\0\\0\"");
  const auto version = load_le<std::uint64_t>(p + 9);
  if (version != 1) throw fail(9, "version " + std::to_string(version) + ", expected 1");
  const auto code = load_le<std::uint8_t>(p + 17);
  const auto dtype = megatron_dtype(code);
  if (!dtype) throw fail(17, "unknown dtype code " + std::to_string(code) + " (1 to 8)");
  dtype_ = *dtype;
  item_ = dtype_size(dtype_);
  sequences_ = load_le<std::uint64_t>(p + 18);
  const auto doc_entries = load_le<std::uint64_t>(p + 26);
  if (doc_entries == 0) throw fail(26, "a document index of 0 entries (it starts with 0)");
  documents_ = doc_entries - 1;
  // 4 + 8 bytes per sequence, 8 per document entry, and an optional mode byte per sequence;
  // counts too large for the file are refused before any multiplication can overflow.
  const std::uint64_t body = size - kMegatronHeaderBytes;
  if (sequences_ > body / 12 || doc_entries > body / 8)
    throw fail(18, std::to_string(sequences_) + " sequences and " + std::to_string(doc_entries) +
                       " document entries do not fit in " + std::to_string(size) + " bytes");
  lengths_at_ = kMegatronHeaderBytes;
  pointers_at_ = lengths_at_ + 4 * sequences_;
  docs_at_ = pointers_at_ + 8 * sequences_;
  const std::uint64_t end = docs_at_ + 8 * doc_entries;
  if (end != size && end + sequences_ != size)
    throw fail(end > size ? size : end, std::to_string(size) + " bytes, expected " +
                                            std::to_string(end) + " (or " +
                                            std::to_string(end + sequences_) + " with modes) for " +
                                            std::to_string(sequences_) + " sequences and " +
                                            std::to_string(documents_) + " documents");
}

void IndexedFile::check_entries(const std::string& idx_path) {
  const std::string& bin = bin_name_;
  auto fail = [&](std::uint64_t offset, const std::string& why) -> DataError {
    return DataError(idx_path, offset, "'" + idx_path + "' is not a valid Megatron index: " + why);
  };
  // The common case, an index that keeps the rules, is told by the scan (made while the copy
  // was read, else now: one pass with no branch per entry); only an index that breaks them
  // runs the loops below, which name the first bad entry.
  if (!scan_.complete) {
    scan_ = EntryScan{};
    scan_entries(idx_data_, scan_, idx_size_);
  }
  if (scan_.bad == 0) {
    one_sequence_per_document_ = scan_.identity;
    return;
  }
  const std::uint64_t doc_entries = documents_ + 1;
  // Sequences lie one after another from offset 0, as Megatron's writer puts them: documents
  // are then contiguous byte ranges, and the last sequence ends at the end of the .bin.
  std::uint64_t expected = 0;
  for (std::uint64_t i = 0; i < sequences_; ++i) {
    const std::int32_t n = length(i);
    const std::int64_t at = pointer(i);
    if (n < 0)
      throw fail(lengths_at_ + 4 * i,
                 "sequence " + std::to_string(i) + " has length " + std::to_string(n));
    if (at < 0 || static_cast<std::uint64_t>(at) != expected)
      throw fail(pointers_at_ + 8 * i, "sequence " + std::to_string(i) + " starts at byte " +
                                           std::to_string(at) + " of '" + bin + "', expected " +
                                           std::to_string(expected) +
                                           " (sequences are contiguous)");
    expected += static_cast<std::uint64_t>(n) * item_;
    if (expected > bin_size_)
      throw fail(pointers_at_ + 8 * i, "sequence " + std::to_string(i) + " ends at byte " +
                                           std::to_string(expected) + ", past the end of '" + bin +
                                           "' (" + std::to_string(bin_size_) + " bytes)");
  }
  if (expected != bin_size_)
    throw DataError(bin, expected,
                    "'" + bin + "' holds " + std::to_string(bin_size_) + " bytes, its index '" +
                        idx_path + "' describes " + std::to_string(expected));
  std::int64_t previous = 0;
  bool identity = doc_entries == sequences_ + 1;
  for (std::uint64_t d = 0; d < doc_entries; ++d) {
    const std::int64_t s = doc(d);
    identity = identity && static_cast<std::uint64_t>(s) == d;
    const bool bad = d == 0 ? s != 0 : (s < previous || static_cast<std::uint64_t>(s) > sequences_);
    if (bad)
      throw fail(docs_at_ + 8 * d, "document index entry " + std::to_string(d) + " is " +
                                       std::to_string(s) +
                                       (d == 0 ? ", expected 0"
                                               : ", expected " + std::to_string(previous) + " to " +
                                                     std::to_string(sequences_)));
    previous = s;
  }
  if (static_cast<std::uint64_t>(previous) != sequences_)
    throw fail(docs_at_ + 8 * (doc_entries - 1),
               "the last document index entry is " + std::to_string(previous) + ", expected " +
                   std::to_string(sequences_) + " (the sequence count)");
  one_sequence_per_document_ = identity;
}

void IndexedFile::scan_entries(const std::byte* base, EntryScan& scan, std::uint64_t read) const {
  // Sequence i starts where i - 1 ends (pointer[i] == pointer[i - 1] + length[i - 1] * item),
  // the first at 0 and the last ending at the .bin's end. Each pointer at most the .bin's
  // size (so no sum wraps) and each length non-negative make those the running sums that
  // check_entries compares, and so the same verdict. A pair is checked once both of its
  // entries are read (the lengths lie before the pointers).
  const std::byte* lengths = base + lengths_at_;
  const std::byte* pointers = base + pointers_at_;
  const std::uint64_t item = item_, size = bin_size_, n = sequences_;
  // Per pair, folds without a comparison's flag: the lengths OR-ed (a sign bit set means a
  // negative one), the largest pointer, and the chain's differences OR-ed.
  std::uint64_t bad = scan.bad;
  if (read > pointers_at_) {
    const std::uint64_t got = std::min<std::uint64_t>(n, (read - pointers_at_) / 8);
    std::int32_t lengths_or = 0;
    std::uint64_t largest = 0, breaks = 0;
    for (std::uint64_t i = scan.sequences_done; i + 1 < got; ++i) {
      const auto length = load_le<std::int32_t>(lengths + 4 * i);
      const auto at = load_le<std::uint64_t>(pointers + 8 * i);
      const auto next = load_le<std::uint64_t>(pointers + 8 * i + 8);
      lengths_or |= length;
      largest = std::max(largest, at);
      breaks |= next ^ (at + static_cast<std::uint64_t>(static_cast<std::int64_t>(length)) * item);
    }
    bad |= static_cast<std::uint64_t>(lengths_or < 0) | static_cast<std::uint64_t>(largest > size) |
           static_cast<std::uint64_t>(breaks != 0);
    if (got > 0) scan.sequences_done = std::max(scan.sequences_done, got - 1);
  }
  // Document entries: 0 first, never decreasing, at most the sequence count, which is last.
  // Every entry at most n (< 2^63) makes a decrease the sign bit of a difference.
  const std::byte* docs = base + docs_at_;
  const std::uint64_t entries = documents_ + 1;
  std::uint64_t same = scan.same;
  if (read > docs_at_) {
    const std::uint64_t got = std::min<std::uint64_t>(entries, (read - docs_at_) / 8);
    std::uint64_t largest = 0, steps = 0, others = 0;
    for (std::uint64_t d = scan.documents_done; d + 1 < got; ++d) {
      const auto s = load_le<std::uint64_t>(docs + 8 * d);
      const auto t = load_le<std::uint64_t>(docs + 8 * d + 8);
      largest = std::max(largest, t);
      steps |= t - s;
      others |= s ^ d;
    }
    bad |= static_cast<std::uint64_t>(largest > n || n >> 63 != 0) | steps >> 63;
    same &= static_cast<std::uint64_t>(others == 0);
    if (got > 0) scan.documents_done = std::max(scan.documents_done, got - 1);
  }
  if (read >= idx_size_) {  // the ends
    if (n == 0) {
      bad |= static_cast<std::uint64_t>(size != 0);
    } else {
      const auto length = load_le<std::int32_t>(lengths + 4 * (n - 1));
      const auto at = load_le<std::uint64_t>(pointers + 8 * (n - 1));
      bad |= static_cast<std::uint64_t>(load_le<std::uint64_t>(pointers) != 0) |
             static_cast<std::uint64_t>(length < 0) | static_cast<std::uint64_t>(at > size) |
             static_cast<std::uint64_t>(at + static_cast<std::uint64_t>(length) * item != size);
    }
    bad |= static_cast<std::uint64_t>(load_le<std::uint64_t>(docs) != 0) |
           static_cast<std::uint64_t>(load_le<std::uint64_t>(docs + 8 * (entries - 1)) != n);
    scan.complete = true;
    scan.identity = entries == n + 1 && same != 0;
  }
  scan.bad = bad;
  scan.same = same;
}

namespace {

/// Reads the file `m` maps into `into` (m.size() bytes) with pread: the kernel copies from its
/// page cache, where a copy from the mapping would fault each page in first. Reads 256 KiB at
/// a time and calls `read(bytes)` with the bytes read so far after each, while the last ones
/// are in the cache. False when the file at m.path() is no longer the one mapped, or a read
/// fails.
template <class OnRead>
bool read_mapped_file(const MappedFile& m, std::byte* into, OnRead&& read) {
  constexpr std::size_t kChunk = std::size_t{256} << 10;
  const int fd = ::open(m.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  const std::size_t size = m.size();
  bool ok = ::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_dev) == m.stat().device &&
            static_cast<std::uint64_t>(st.st_ino) == m.stat().inode &&
            static_cast<std::uint64_t>(st.st_size) == size;
  for (std::size_t at = 0; ok && at < size;) {
    const ssize_t n = ::pread(fd, into + at, std::min(kChunk, size - at), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    at += ok ? static_cast<std::size_t>(n) : 0;
    if (ok) read(at);
  }
  ::close(fd);
  return ok;  // (what was read is checked entry by entry, as the mapping would be)
}

}  // namespace

bool IndexedFile::read_into(std::byte* into) {
  EntryScan scan;
  if (!read_mapped_file(*idx_, into, [&](std::uint64_t read) { scan_entries(into, scan, read); }))
    return false;
  scan_ = scan;  // complete: the last chunk read the file's end
  return true;
}

void IndexedFile::copy_index_into_huge_pages() {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t size = idx_size_;
  // Up to 1/16 of the memory (a 200 000-document index is 4 MB); a larger one stays mapped.
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (idx_->in_memory() || size < kHuge || pages <= 0 || page <= 0 ||
      size / 16 > static_cast<std::size_t>(pages) / 256 * static_cast<std::size_t>(page))
    return;
  // An aligned run of whole huge pages (the kernel gives them where it can: THP "always" or
  // "madvise"; else this is ordinary memory and costs what the mapping did).
  const std::size_t length = (size + kHuge - 1) / kHuge * kHuge;
  void* got = ::mmap(nullptr, length + kHuge, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (got == MAP_FAILED) return;
  auto* start = static_cast<std::byte*>(got);
  auto* aligned = reinterpret_cast<std::byte*>(
      (reinterpret_cast<std::uintptr_t>(start) + kHuge - 1) & ~std::uintptr_t{kHuge - 1});
  if (aligned > start) ::munmap(start, static_cast<std::size_t>(aligned - start));
  const std::size_t tail = static_cast<std::size_t>(start + length + kHuge - (aligned + length));
  if (tail > 0) ::munmap(aligned + length, tail);
  std::shared_ptr<std::byte> copy(aligned, [length](std::byte* at) { ::munmap(at, length); });
  ::madvise(aligned, length, MADV_HUGEPAGE);
  if (!read_into(aligned)) return;  // the mapping is kept
  idx_copy_ = std::move(copy);
  idx_data_ = idx_copy_.get();
  idx_.reset();
}

bool IndexedFile::copy_index_into(IndexCopies& copies) {
  std::byte* at = copies.allocate(idx_size_);
  if (!read_into(at)) return false;
  idx_data_ = at;
  idx_.reset();
  return true;
}

std::int32_t IndexedFile::length(std::uint64_t i) const {
  return load_le<std::int32_t>(idx_data_ + lengths_at_ + 4 * i);
}
std::int64_t IndexedFile::pointer(std::uint64_t i) const {
  return load_le<std::int64_t>(idx_data_ + pointers_at_ + 8 * i);
}
std::int64_t IndexedFile::doc(std::uint64_t d) const {
  return load_le<std::int64_t>(idx_data_ + docs_at_ + 8 * d);
}

std::span<const std::byte> IndexedFile::sequence(std::uint64_t i) const {
  const auto begin = static_cast<std::uint64_t>(pointer(i));
  return bin_bytes(begin, begin + static_cast<std::uint64_t>(length(i)) * item_);
}

std::pair<std::uint64_t, std::uint64_t> IndexedFile::document_range(std::uint64_t d) const {
  const auto first = one_sequence_per_document_ ? d : static_cast<std::uint64_t>(doc(d));
  const auto last = one_sequence_per_document_ ? d + 1 : static_cast<std::uint64_t>(doc(d + 1));
  if (first == last) return {0, 0};
  // Sequences lie end to end (checked at open): a document ends where the next sequence
  // starts, or at the end of the .bin. Two neighbouring entries of two arrays: on a shuffled
  // order that is two cache misses, not the three or four of reading the last length too.
  const auto begin = static_cast<std::uint64_t>(pointer(first));
  const std::uint64_t end =
      last < sequences_ ? static_cast<std::uint64_t>(pointer(last)) : bin_size_;
  return {begin, end};
}

std::span<const std::byte> IndexedFile::document(std::uint64_t d) const {
  const auto [begin, end] = document_range(d);
  return bin_bytes(begin, end);
}

std::span<const std::byte> IndexedFile::stable(std::uint64_t i, bool document) const {
  if (document) {
    const auto [begin, end] = document_range(i);
    return blocks_->view(bin_object_, begin, static_cast<std::size_t>(end - begin));
  }
  return blocks_->view(bin_object_, static_cast<std::uint64_t>(pointer(i)),
                       static_cast<std::size_t>(length(i)) * item_);
}

PlannedRead IndexedFile::planned_read(std::uint64_t i, bool document) const {
  if (document) {
    const auto [begin, end] = document_range(i);
    return {bin_object_, begin, end - begin};
  }
  return {bin_object_, static_cast<std::uint64_t>(pointer(i)),
          static_cast<std::uint64_t>(length(i)) * item_};
}

void IndexedFile::prefetch_sequence(std::uint64_t i) const {
  __builtin_prefetch(idx_data_ + lengths_at_ + 4 * i);
  __builtin_prefetch(idx_data_ + pointers_at_ + 8 * i);
}

void IndexedFile::prefetch_document(std::uint64_t d) const {
  if (!one_sequence_per_document_) {
    __builtin_prefetch(idx_data_ + docs_at_ + 8 * d);
    return;  // the sequences it names are known only once that entry is read
  }
  // document(): pointers d and d + 1 (one line, or two neighbouring ones).
  __builtin_prefetch(idx_data_ + pointers_at_ + 8 * d);
  __builtin_prefetch(idx_data_ + pointers_at_ + 8 * d + 8);
}

}  // namespace flowstate
