// Test fixtures for the data-format sources: text/JSON Lines files and tar shards, written
// byte for byte as the tests need them (CRLF, a missing final newline, GNU or pax long names,
// a header patched to say something else). The bytes come from the library's writers
// (append_line in nodes/sources/lines.h, append_tar_header and the rest in tar.h); what is
// here only arranges them.
//
//   testing::write_lines(dir / "a.txt", {"one", "two"}, {.crlf = true});
//   auto headers = testing::write_tar(dir / "s.tar", {{"a.txt", "hi"}, {"a.cls", "1"}});
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/graph/pipeline.h"

namespace flowstate::testing {

/// How write_lines ends its lines.
struct LinesWriteOptions {
  bool crlf = false;          ///< "\r\n" instead of "\n"
  bool final_newline = true;  ///< whether the last line is followed by a newline too
};

/// Writes `lines` to `path` (replacing it), each ended by a newline as `options` say.
void write_lines(const std::string& path, const std::vector<std::string>& lines,
                 LinesWriteOptions options = {});

/// One member of a generated tar file.
struct TarEntry {
  std::string name;
  std::string data;
  char type = '0';  ///< '0' regular file, '5' directory, '2' symlink, ...
};

/// The flavour of tar write_tar produces.
enum class TarFormat : std::uint8_t {
  kUstar,  ///< POSIX ustar: names over 100 bytes split into prefix and name (at most 255)
  kGnu,    ///< GNU: names over 100 bytes in a preceding 'L' (long name) header
  kPax,    ///< POSIX pax: names over 100 bytes in a preceding 'x' header (`path=`)
};

/// Options of write_tar.
struct TarWriteOptions {
  TarFormat format = TarFormat::kUstar;
  bool end_blocks = true;  ///< end with the two zero blocks (else just after the last member)
};

/// Byte offsets of the parts of one written member.
struct TarOffsets {
  std::uint64_t start;   ///< its first header (a long-name or pax header when it has one)
  std::uint64_t header;  ///< its own header
  std::uint64_t data;    ///< its bytes
};

/// Writes `members` in order as a tar file at `path` (mtime 0, mode 0644 or 0755 for
/// directories, owner 0, valid checksums);
/// returns where each member's parts are. Throws std::invalid_argument for a name the format
/// cannot hold.
std::vector<TarOffsets> write_tar(const std::string& path, const std::vector<TarEntry>& members,
                                  TarWriteOptions options = {});

/// A pax extended-header record "LENGTH key=value\n" (LENGTH counts the whole record), for
/// writing a pax header by hand as the data of a member of type 'x'.
std::string pax_record(std::string_view key, std::string_view value);

/// Offsets of tar header fields, for patch_tar_header.
inline constexpr std::size_t kTarSizeField = 124;
inline constexpr std::size_t kTarChecksumField = 148;
inline constexpr std::size_t kTarTypeField = 156;

/// Overwrites `bytes` of the tar header at `header` from field offset `field`, then rewrites
/// the header's checksum: the header stays well-formed but says something else.
void patch_tar_header(const std::string& path, std::uint64_t header, std::size_t field,
                      std::string_view bytes);

/// Writes `bytes` to `path`, replacing it.
void write_file(const std::string& path, std::string_view bytes);
/// Overwrites the bytes of `path` at `offset` (the file keeps its size where they fit).
void patch_file(const std::string& path, std::uint64_t offset, std::string_view bytes);
/// The whole content of `path`.
std::string read_file(const std::string& path);

}  // namespace flowstate::testing
