#include "flowstate/nodes/sources/remote_listing.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"

namespace flowstate {

namespace {

thread_local const ListingContext* t_context = nullptr;

constexpr int kListingFormat = 1;
/// A saved listing larger than this is not one (a million objects take about 150 MB).
constexpr std::uintmax_t kMaxListingBytes = std::uintmax_t{1} << 30;

/// Writes `text` to `path` as a whole or not at all: a temporary file, fsynced, renamed over
/// `path`, the directory fsynced. Throws CheckpointError naming the file.
void save_durably(const std::filesystem::path& path, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec)
    throw CheckpointError(path.parent_path().string(),
                          "cannot create '" + path.parent_path().string() + "': " + ec.message());
  const std::string tmp = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw CheckpointError(path.string(),
                          "cannot " + what + " the listing '" + path.string() + "': " + reason);
  };
  if (fd < 0) fail("write");
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write");
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) fail("write");
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw CheckpointError(path.string(),
                          "cannot commit the listing '" + path.string() + "': " + reason);
  }
  const int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

/// The saved listing of `pattern` under `dir`, or nullopt when none was saved.
std::optional<std::vector<RemoteObject>> read_saved(const std::filesystem::path& dir,
                                                    const std::string& pattern,
                                                    const RemoteSettings& settings) {
  const std::filesystem::path file = listing_file(dir, pattern);
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::nullopt;
  const std::uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec || size > kMaxListingBytes)
    throw CheckpointError(file.string(), "cannot read the listing '" + file.string() +
                                             "': " + (ec ? ec.message() : "larger than 1 GiB"));
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw CheckpointError(file.string(), "cannot read the listing '" + file.string() + "'");
  return decode_listing(text.str(), pattern, settings, file.string());
}

/// This process's listing of `pattern` (rank 0's, or a process's on its own): the saved one
/// when the context reuses it, else a new one, saved.
std::vector<RemoteObject> list_here(const ListingContext* ctx, const std::string& pattern,
                                    const RemoteSettings& settings) {
  if (ctx != nullptr && !ctx->dir.empty() && ctx->reuse)
    if (auto saved = read_saved(ctx->dir, pattern, settings)) return std::move(*saved);
  std::vector<RemoteObject> objects = list_remote(pattern, settings);
  if (ctx != nullptr && !ctx->dir.empty()) {
    std::filesystem::path file = listing_file(ctx->dir, pattern);
    std::string text = encode_listing(pattern, objects);
    if (!ctx->reuse && ctx->memo) {
      std::lock_guard lock(ctx->memo->mu);
      ctx->memo->pending.emplace_back(std::move(file), std::move(text));
    } else {
      save_durably(file, text);
    }
  }
  return objects;
}

/// The message rank 0 sends: "L" and its listing, or "D"/"C"/"K"/"E" (DataError,
/// ConfigError, CheckpointError, another error) and what it says.
std::string error_message(char kind, const std::exception& e) {
  return kind + std::string(e.what());
}

[[noreturn]] void throw_rank0_error(const std::string& message, const std::string& pattern) {
  const std::string what = message.substr(1);
  switch (message[0]) {
    case 'D':
      throw DataError(redact_url(pattern), DataError::kNoOffset, what);
    case 'C':
      throw ConfigError("paths", what);
    case 'K':
      throw CheckpointError(redact_url(pattern), what);
    default:
      throw Error(what);
  }
}

}  // namespace

ListingScope::ListingScope(ListingContext context)
    : context_(std::move(context)), previous_(t_context) {
  t_context = &context_;
}

ListingScope::~ListingScope() { t_context = previous_; }

const ListingContext* current_listing_context() { return t_context; }

void save_pending_listings(ListingMemo& memo) {
  std::vector<std::pair<std::filesystem::path, std::string>> pending;
  {
    std::lock_guard lock(memo.mu);
    pending.swap(memo.pending);
  }
  for (const auto& [file, text] : pending) save_durably(file, text);
}

std::filesystem::path listing_file(const std::filesystem::path& dir, const std::string& pattern) {
  return dir / kListingsDir / (hex64(hash64(redact_url(pattern))) + ".json");
}

std::string encode_listing(const std::string& pattern, const std::vector<RemoteObject>& objects) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& o : objects)
    list.push_back({{"url", o.url}, {"size", o.size}, {"etag", o.etag}});
  const nlohmann::json j = {
      {"format", kListingFormat}, {"pattern", redact_url(pattern)}, {"objects", std::move(list)}};
  return j.dump(1) + "\n";
}

std::vector<RemoteObject> decode_listing(const std::string& text, const std::string& pattern,
                                         const RemoteSettings& settings, const std::string& file) {
  auto bad = [&](const std::string& why) -> CheckpointError {
    return CheckpointError(
        file, "the listing '" + file + "' " + why + "; remove it to list the objects again");
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw bad("is not JSON (byte " + std::to_string(e.byte) + ")");
  }
  const std::string shown = redact_url(pattern);
  if (!j.is_object() || j.value("format", 0) != kListingFormat)
    throw bad("is not a listing of format " + std::to_string(kListingFormat));
  if (!j.contains("pattern") || j["pattern"] != shown)
    throw bad("lists another pattern than '" + shown + "'");
  if (!j.contains("objects") || !j["objects"].is_array() || j["objects"].empty())
    throw bad("holds no objects");
  // An HTTP pattern's objects are its brace expansion in order; their fetch URLs are the
  // expansion's (user info and query included), which the listing does not hold.
  const bool s3 = shown.starts_with("s3://");
  std::vector<std::string> urls;
  if (!s3) urls = expand_braces(pattern);
  std::vector<RemoteObject> out;
  out.reserve(j["objects"].size());
  for (const auto& o : j["objects"]) {
    const std::size_t i = out.size();
    if (!o.is_object() || !o.contains("url") || !o["url"].is_string() || !o.contains("size") ||
        !o["size"].is_number_unsigned() || !o.contains("etag") || !o["etag"].is_string())
      throw bad("has a malformed object (number " + std::to_string(i) + ")");
    RemoteObject r{.url = o["url"].get<std::string>(),
                   .s3 = s3,
                   .size = o["size"].get<std::uint64_t>(),
                   .etag = o["etag"].get<std::string>()};
    if (s3) {
      if (!r.url.starts_with(shown.substr(0, shown.find('/', 5) + 1)))
        throw bad("names '" + r.url + "', not in the bucket of '" + shown + "'");
      r.fetch_url = s3_fetch_url(r.url, settings);
    } else {
      if (i >= urls.size() || redact_url(urls[i]) != r.url)
        throw bad("names '" + r.url + "' as object " + std::to_string(i) + ", which '" + shown +
                  "' does not");
      r.fetch_url = urls[i];
    }
    out.push_back(std::move(r));
  }
  if (!s3 && out.size() != urls.size())
    throw bad("holds " + std::to_string(out.size()) + " objects, '" + shown + "' names " +
              std::to_string(urls.size()));
  return out;
}

std::vector<RemoteObject> job_listing(const std::string& pattern, const RemoteSettings& settings) {
  const ListingContext* ctx = t_context;
  const std::string key = redact_url(pattern);
  if (ctx != nullptr && ctx->memo) {
    std::lock_guard lock(ctx->memo->mu);
    if (auto it = ctx->memo->listings.find(key); it != ctx->memo->listings.end()) return it->second;
  }
  std::vector<RemoteObject> objects;
  Coordinator* coordinator = ctx != nullptr ? ctx->coordinator : nullptr;
  if (coordinator == nullptr || coordinator->world() <= 1) {
    objects = list_here(ctx, pattern, settings);
  } else if (coordinator->rank() == 0) {
    // Rank 0 answers whatever happens: the other ranks wait in the all_gather for it.
    std::string message;
    std::exception_ptr error;
    try {
      objects = list_here(ctx, pattern, settings);
      message = "L" + encode_listing(pattern, objects);
    } catch (const DataError& e) {
      message = error_message('D', e), error = std::current_exception();
    } catch (const ConfigError& e) {
      message = error_message('C', e), error = std::current_exception();
    } catch (const CheckpointError& e) {
      message = error_message('K', e), error = std::current_exception();
    } catch (const std::exception& e) {
      message = error_message('E', e), error = std::current_exception();
    }
    coordinator->all_gather(message);
    if (error) std::rethrow_exception(error);
  } else {
    const std::vector<std::string> all = coordinator->all_gather("");
    const std::string& from0 = all.at(0);
    if (from0.empty() || from0[0] != 'L') throw_rank0_error(from0.empty() ? "E" : from0, pattern);
    objects = decode_listing(from0.substr(1), pattern, settings, "rank 0's listing of " + key);
  }
  if (ctx != nullptr && ctx->memo) {
    std::lock_guard lock(ctx->memo->mu);
    ctx->memo->listings.emplace(key, objects);
  }
  return objects;
}

}  // namespace flowstate
