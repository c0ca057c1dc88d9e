#include "tests/support/formats.h"

#include <cstring>
#include <fstream>
#include <span>
#include <sstream>
#include <stdexcept>

#include "flowstate/nodes/sources/lines.h"
#include "flowstate/nodes/sources/tar.h"

namespace flowstate::testing {
namespace {

/// A header block for a member of `size` bytes; `name` must fit (see write_tar).
void append_header(std::string& out, std::string_view name, std::string_view prefix,
                   std::uint64_t size, char type, TarFormat format) {
  append_tar_header(out, {.name = name,
                          .size = size,
                          .type = type,
                          .prefix = prefix,
                          .gnu = format == TarFormat::kGnu});
}

}  // namespace

std::string pax_record(std::string_view key, std::string_view value) {
  const std::string body = " " + std::string(key) + "=" + std::string(value) + "\n";
  // LENGTH counts its own digits: grow it until the digits and the body add up to it.
  std::size_t length = body.size() + 1;
  while (std::to_string(length).size() + body.size() != length) ++length;
  return std::to_string(length) + body;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines,
                 LinesWriteOptions options) {
  std::string text;
  for (std::size_t i = 0; i < lines.size(); ++i)
    append_line(text, lines[i],
                i + 1 == lines.size() && !options.final_newline ? LineEnd::kNone
                : options.crlf                                  ? LineEnd::kCrLf
                                                                : LineEnd::kLf);
  write_file(path, text);
}

std::vector<TarOffsets> write_tar(const std::string& path, const std::vector<TarEntry>& members,
                                  TarWriteOptions options) {
  std::string out;
  std::vector<TarOffsets> offsets;
  for (const auto& m : members) {
    TarOffsets at{.start = out.size(), .header = 0, .data = 0};
    std::string_view name = m.name, prefix;
    if (m.name.size() > 100) {
      switch (options.format) {
        case TarFormat::kUstar: {
          // The prefix takes everything up to a slash, leaving at most 100 bytes of name.
          const auto slash = m.name.find('/', m.name.size() - 101);
          if (m.name.size() > 256 || slash == std::string::npos || slash > 155)
            throw std::invalid_argument("ustar cannot hold the name '" + m.name + "'");
          prefix = name.substr(0, slash);
          name = name.substr(slash + 1);
          break;
        }
        case TarFormat::kGnu:
          append_header(out, "././@LongLink", {}, m.name.size() + 1, 'L', options.format);
          append_tar_data(out, m.name + '\0');
          break;
        case TarFormat::kPax: {
          const std::string records = pax_record("path", m.name);
          append_header(out, "PaxHeaders/" + m.name.substr(0, 80), {}, records.size(), 'x',
                        options.format);
          append_tar_data(out, records);
          break;
        }
      }
      // After a long-name or pax header, the member's own header holds the name's first 100
      // bytes, as GNU tar writes it.
      if (options.format != TarFormat::kUstar) name = name.substr(0, 100);
    }
    at.header = out.size();
    append_header(out, name, prefix, m.data.size(), m.type, options.format);
    at.data = out.size();
    append_tar_data(out, m.data);
    offsets.push_back(at);
  }
  if (options.end_blocks) append_tar_end(out);
  write_file(path, out);
  return offsets;
}

void patch_tar_header(const std::string& path, std::uint64_t header, std::size_t field,
                      std::string_view bytes) {
  std::string h = read_file(path).substr(header, kTarBlockBytes);
  if (h.size() != kTarBlockBytes)
    throw std::invalid_argument("'" + path + "' holds no whole tar header at byte " +
                                std::to_string(header));
  std::memcpy(h.data() + field, bytes.data(), bytes.size());
  seal_tar_header(std::span<char, kTarBlockBytes>(h.data(), kTarBlockBytes));
  patch_file(path, header, h);
}
void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write '" + path + "'");
}

void patch_file(const std::string& path, std::uint64_t offset, std::string_view bytes) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot patch '" + path + "'");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace flowstate::testing
