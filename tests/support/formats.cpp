#include "tests/support/formats.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace flowstate::testing {
namespace {

constexpr std::size_t kBlock = 512;

/// Writes `value` as `width - 1` octal digits and a NUL into `field`.
void put_octal(char* field, std::size_t width, std::uint64_t value) {
  std::snprintf(field, width, "%0*llo", static_cast<int>(width - 1),
                static_cast<unsigned long long>(value));
}

/// Stores the checksum of a header whose other fields are final.
void seal(char* h) {
  std::memset(h + kTarChecksumField, ' ', 8);
  unsigned sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i) sum += static_cast<unsigned char>(h[i]);
  // Six digits, a NUL and a space: what GNU tar and Python's tarfile write.
  std::snprintf(h + kTarChecksumField, 7, "%06o", sum);
  h[kTarChecksumField + 7] = ' ';
}

/// A header block for a member of `size` bytes; `name` must fit (see write_tar).
std::string header(std::string_view name, std::string_view prefix, std::uint64_t size, char type,
                   TarFormat format) {
  std::string h(kBlock, '\0');
  std::copy_n(name.begin(), std::min(name.size(), std::size_t{100}), h.begin());
  put_octal(h.data() + 100, 8, type == '5' ? 0755 : 0644);
  put_octal(h.data() + 108, 8, 0);
  put_octal(h.data() + 116, 8, 0);
  put_octal(h.data() + kTarSizeField, 12, size);
  put_octal(h.data() + 136, 12, 0);
  h[kTarTypeField] = type;
  if (format == TarFormat::kGnu) {
    std::memcpy(h.data() + 257, "ustar  ", 8);  // GNU magic and version, NUL-terminated
  } else {
    std::memcpy(h.data() + 257, "ustar", 6);  // POSIX magic "ustar\0", version "00"
    std::memcpy(h.data() + 263, "00", 2);
    std::copy(prefix.begin(), prefix.end(), h.begin() + 345);
  }
  seal(h.data());
  return h;
}

/// `data` padded with NULs to whole blocks.
std::string padded(std::string_view data) {
  std::string s(data);
  s.resize((s.size() + kBlock - 1) / kBlock * kBlock, '\0');
  return s;
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
  for (std::size_t i = 0; i < lines.size(); ++i) {
    text += lines[i];
    if (i + 1 < lines.size() || options.final_newline) text += options.crlf ? "\r\n" : "\n";
  }
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
          out += header("././@LongLink", {}, m.name.size() + 1, 'L', options.format);
          out += padded(m.name + '\0');
          break;
        case TarFormat::kPax: {
          const std::string records = pax_record("path", m.name);
          out +=
              header("PaxHeaders/" + m.name.substr(0, 80), {}, records.size(), 'x', options.format);
          out += padded(records);
          break;
        }
      }
    }
    at.header = out.size();
    out += header(name, prefix, m.data.size(), m.type, options.format);
    at.data = out.size();
    out += padded(m.data);
    offsets.push_back(at);
  }
  if (options.end_blocks) out.append(2 * kBlock, '\0');
  write_file(path, out);
  return offsets;
}

void patch_tar_header(const std::string& path, std::uint64_t header, std::size_t field,
                      std::string_view bytes) {
  std::string h = read_file(path).substr(header, kBlock);
  std::memcpy(h.data() + field, bytes.data(), bytes.size());
  seal(h.data());
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
