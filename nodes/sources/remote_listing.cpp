#include "flowstate/nodes/sources/remote_listing.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"

namespace flowstate {

namespace {

thread_local const ListingContext* t_context = nullptr;
thread_local std::uint64_t t_build = 0;
std::atomic<std::uint64_t> g_builds{1};

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

/// The listing of `pattern` the cache directory saved for `settings`, when one was saved
/// at most `settings.listing_max_age` ago (by this machine's clock) and reads back whole;
/// else nullopt (the cache's file is a cache: one that cannot be read is listed again and
/// replaced).
std::optional<std::vector<RemoteObject>> read_reusable(const std::string& pattern,
                                                       const RemoteSettings& settings) {
  if (settings.listing_max_age.count() <= 0 || settings.listing_dir.empty()) return std::nullopt;
  const std::filesystem::path file = reusable_listing_file(settings.listing_dir, pattern, settings);
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uintmax_t>(st.st_size) > kMaxListingBytes)
    return std::nullopt;
  const auto saved = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
  const auto age = std::chrono::system_clock::now() - saved;
  if (age < std::chrono::system_clock::duration::zero() || age > settings.listing_max_age)
    return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return std::nullopt;
  try {
    return decode_listing(text.str(), pattern, settings, file.string());
  } catch (const CheckpointError&) {
    return std::nullopt;
  }
}

/// This process's listing of `pattern` (rank 0's, or a process's on its own): the saved one
/// when the context reuses it, else one the cache directory saved recently enough
/// (read_reusable), else a new one; saved beside the checkpoints, and in the cache directory
/// when listings may be reused there.
std::vector<RemoteObject> list_here(const ListingContext* ctx, const std::string& pattern,
                                    const RemoteSettings& settings) {
  if (ctx != nullptr && !ctx->dir.empty() && ctx->reuse)
    if (auto saved = read_saved(ctx->dir, pattern, settings)) return std::move(*saved);
  std::optional<std::vector<RemoteObject>> reused = read_reusable(pattern, settings);
  std::vector<RemoteObject> objects = reused ? std::move(*reused) : list_remote(pattern, settings);
  if (!reused && settings.listing_max_age.count() > 0 && !settings.listing_dir.empty()) {
    try {
      save_durably(reusable_listing_file(settings.listing_dir, pattern, settings),
                   encode_listing(pattern, objects));
    } catch (const CheckpointError&) {
      // A cache that cannot keep the listing lists again next time.
    }
  }
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

/// What rank 0 makes (`make`), for every rank of a job: rank 0 sends "L" and encode()'s text of
/// it — or its error, which every rank then raises as its own, naming `shown` — and the other
/// ranks decode() the text. Rank 0 answers whatever happens: the others wait in the all_gather.
template <class T, class Make, class Encode, class Decode>
T from_rank0(Coordinator& coordinator, const std::string& shown, Make make, Encode encode,
             Decode decode) {
  if (coordinator.rank() == 0) {
    T out{};
    std::string message;
    std::exception_ptr error;
    try {
      out = make();
      message = "L" + encode(out);
    } catch (const DataError& e) {
      message = error_message('D', e), error = std::current_exception();
    } catch (const ConfigError& e) {
      message = error_message('C', e), error = std::current_exception();
    } catch (const CheckpointError& e) {
      message = error_message('K', e), error = std::current_exception();
    } catch (const std::exception& e) {
      message = error_message('E', e), error = std::current_exception();
    }
    coordinator.all_gather(message);
    if (error) std::rethrow_exception(error);
    return out;
  }
  const std::vector<std::string> all = coordinator.all_gather("");
  const std::string& from0 = all.at(0);
  if (from0.empty() || from0[0] != 'L') throw_rank0_error(from0.empty() ? "E" : from0, shown);
  return decode(from0.substr(1));
}

}  // namespace

ListingScope::ListingScope(ListingContext context)
    : context_(std::move(context)), previous_(t_context), previous_build_(t_build) {
  t_context = &context_;
  t_build = g_builds.fetch_add(1);
}

ListingScope::~ListingScope() {
  t_context = previous_;
  t_build = previous_build_;
}

BuildTag current_build() {
  return {.loader = t_context != nullptr ? t_context->memo.get() : nullptr, .build = t_build};
}

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

std::filesystem::path reusable_listing_file(const std::filesystem::path& cache_dir,
                                            const std::string& pattern,
                                            const RemoteSettings& settings) {
  // Another store, region or key may see other objects under the same pattern. The key id is
  // hashed with the rest (never written out); the secret key is not part of it.
  const std::string who = redact_url(pattern) + "\n" + settings.endpoint + "\n" + settings.region +
                          "\n" + (settings.signs() ? settings.access_key : "");
  return cache_dir / kListingsDir / (hex64(hash64(who)) + ".json");
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
  } else {
    objects = from_rank0<std::vector<RemoteObject>>(
        *coordinator, pattern, [&] { return list_here(ctx, pattern, settings); },
        [&](const std::vector<RemoteObject>& o) { return encode_listing(pattern, o); },
        [&](const std::string& text) {
          return decode_listing(text, pattern, settings, "rank 0's listing of " + key);
        });
  }
  if (ctx != nullptr && ctx->memo) {
    std::lock_guard lock(ctx->memo->mu);
    ctx->memo->listings.emplace(key, objects);
  }
  return objects;
}

// ---- object facts ----

namespace {

constexpr int kFactsFormat = 1;

std::string fact_key(const std::string& kind, const RemoteObject& o) {
  return kind + "\n" + o.url + "\n" + o.etag + "\n" + std::to_string(o.size);
}

/// Facts as saved and as rank 0 sends them: {format, kind, objects: [{url, size, etag, items,
/// blocks: [4 hex], full: hex}]}.
std::string encode_facts(const std::string& kind,
                         const std::vector<std::pair<RemoteObject, ObjectFacts>>& entries) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [o, f] : entries) {
    nlohmann::json blocks = nlohmann::json::array();
    for (auto b : f.blocks) blocks.push_back(hex64(b));
    list.push_back({{"url", o.url},
                    {"size", o.size},
                    {"etag", o.etag},
                    {"items", f.items},
                    {"blocks", std::move(blocks)},
                    {"full", hex64(f.full)}});
  }
  const nlohmann::json j = {{"format", kFactsFormat}, {"kind", kind}, {"objects", std::move(list)}};
  return j.dump(1) + "\n";
}

bool parse_hex64(const nlohmann::json& v, std::uint64_t& out) {
  if (!v.is_string()) return false;
  const std::string s = v.get<std::string>();
  if (s.empty() || s.size() > 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    return false;
  out = std::stoull(s, nullptr, 16);
  return true;
}

/// The entries of a text encode_facts wrote for `kind`, by fact_key (with the RemoteObject's
/// url, size and etag). Throws CheckpointError naming `file` when it is not one.
std::map<std::string, std::pair<RemoteObject, ObjectFacts>> decode_facts(const std::string& text,
                                                                         const std::string& kind,
                                                                         const std::string& file) {
  auto bad = [&](const std::string& why) {
    return CheckpointError(
        file, "the object facts '" + file + "' " + why + "; remove it to read the objects again");
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw bad("are not JSON (byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_object() || j.value("format", 0) != kFactsFormat)
    throw bad("are not object facts of format " + std::to_string(kFactsFormat));
  if (!j.contains("kind") || j["kind"] != kind)
    throw bad("are of another kind than '" + kind + "'");
  if (!j.contains("objects") || !j["objects"].is_array()) throw bad("hold no objects");
  std::map<std::string, std::pair<RemoteObject, ObjectFacts>> out;
  std::size_t i = 0;
  for (const auto& o : j["objects"]) {
    const auto malformed = [&] {
      return bad("have a malformed object (number " + std::to_string(i) + ")");
    };
    if (!o.is_object() || !o.contains("url") || !o["url"].is_string() || !o.contains("size") ||
        !o["size"].is_number_unsigned() || !o.contains("etag") || !o["etag"].is_string() ||
        !o.contains("items") || !o["items"].is_number_unsigned() || !o.contains("blocks") ||
        !o["blocks"].is_array() || o["blocks"].size() != 4 || !o.contains("full"))
      throw malformed();
    RemoteObject r{.url = o["url"].get<std::string>(),
                   .size = o["size"].get<std::uint64_t>(),
                   .etag = o["etag"].get<std::string>()};
    ObjectFacts f{.items = o["items"].get<std::uint64_t>()};
    for (std::size_t b = 0; b < 4; ++b)
      if (!parse_hex64(o["blocks"][b], f.blocks[b])) throw malformed();
    if (!parse_hex64(o["full"], f.full)) throw malformed();
    std::string key = fact_key(kind, r);  // before `r` is moved
    out.emplace(std::move(key), std::pair{std::move(r), f});
    ++i;
  }
  return out;
}

/// Serialises the read-merge-write of facts files within this process.
std::mutex g_facts_file_mu;

/// This process's facts (rank 0's, or a process's on its own): saved ones, then `compute` for
/// the rest, saved.
std::vector<ObjectFacts> facts_here(
    const ListingContext* ctx, const std::string& kind, const std::vector<RemoteObject>& objects,
    const std::vector<std::optional<ObjectFacts>>& known,
    const std::function<std::vector<ObjectFacts>(const std::vector<std::size_t>&)>& compute) {
  const bool saving = ctx != nullptr && !ctx->dir.empty();
  const std::filesystem::path file = saving ? facts_file(ctx->dir, kind) : std::filesystem::path{};
  std::map<std::string, std::pair<RemoteObject, ObjectFacts>> saved;
  auto read_file = [&] {
    std::error_code ec;
    if (!saving || !std::filesystem::exists(file, ec)) return;
    const std::uintmax_t size = std::filesystem::file_size(file, ec);
    if (ec || size > kMaxListingBytes)
      throw CheckpointError(file.string(), "cannot read the object facts '" + file.string() +
                                               "': " + (ec ? ec.message() : "larger than 1 GiB"));
    std::ifstream in(file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    saved = decode_facts(text.str(), kind, file.string());
  };
  {
    std::lock_guard lock(g_facts_file_mu);
    read_file();
  }
  std::vector<ObjectFacts> out(objects.size());
  std::vector<std::size_t> missing;
  for (std::size_t i = 0; i < objects.size(); ++i) {
    if (known[i]) {
      out[i] = *known[i];
    } else if (auto it = saved.find(fact_key(kind, objects[i])); it != saved.end()) {
      out[i] = it->second.second;
    } else {
      missing.push_back(i);
    }
  }
  if (missing.empty()) return out;
  const std::vector<ObjectFacts> computed = compute(missing);
  for (std::size_t j = 0; j < missing.size(); ++j) out[missing[j]] = computed.at(j);
  if (saving) {
    // Merged into what the file holds now (another source of the job may have added to it).
    std::lock_guard lock(g_facts_file_mu);
    read_file();
    for (std::size_t j = 0; j < missing.size(); ++j)
      saved[fact_key(kind, objects[missing[j]])] = {objects[missing[j]], computed[j]};
    std::vector<std::pair<RemoteObject, ObjectFacts>> entries;
    entries.reserve(saved.size());
    for (auto& [key, entry] : saved) entries.push_back(entry);
    save_durably(file, encode_facts(kind, entries));
  }
  return out;
}

}  // namespace

std::filesystem::path facts_file(const std::filesystem::path& dir, const std::string& kind) {
  return dir / kListingsDir / ("facts-" + hex64(hash64(kind)) + ".json");
}

std::vector<ObjectFacts> job_object_facts(
    const std::string& kind, const std::vector<RemoteObject>& objects,
    const std::function<std::vector<ObjectFacts>(const std::vector<std::size_t>&)>& compute) {
  const ListingContext* ctx = t_context;
  std::vector<std::optional<ObjectFacts>> known(objects.size());
  bool all_known = true;
  if (ctx != nullptr && ctx->memo) {
    std::lock_guard lock(ctx->memo->mu);
    for (std::size_t i = 0; i < objects.size(); ++i)
      if (auto it = ctx->memo->facts.find(fact_key(kind, objects[i])); it != ctx->memo->facts.end())
        known[i] = it->second;
  }
  for (const auto& k : known) all_known = all_known && k.has_value();
  std::vector<ObjectFacts> out(objects.size());
  if (all_known) {
    // Every rank's memo holds the same facts (each got them from the same collective).
    for (std::size_t i = 0; i < objects.size(); ++i) out[i] = *known[i];
    return out;
  }
  const std::string shown = objects.empty() ? kind : objects.front().url;
  Coordinator* coordinator = ctx != nullptr ? ctx->coordinator : nullptr;
  if (coordinator == nullptr || coordinator->world() <= 1) {
    out = facts_here(ctx, kind, objects, known, compute);
  } else {
    out = from_rank0<std::vector<ObjectFacts>>(
        *coordinator, shown, [&] { return facts_here(ctx, kind, objects, known, compute); },
        [&](const std::vector<ObjectFacts>& facts) {
          std::vector<std::pair<RemoteObject, ObjectFacts>> entries;
          for (std::size_t i = 0; i < objects.size(); ++i)
            entries.emplace_back(objects[i], facts[i]);
          return encode_facts(kind, entries);
        },
        [&](const std::string& text) {
          const auto got = decode_facts(text, kind, "rank 0's object facts");
          std::vector<ObjectFacts> facts(objects.size());
          for (std::size_t i = 0; i < objects.size(); ++i) {
            const auto it = got.find(fact_key(kind, objects[i]));
            if (it == got.end())
              throw CheckpointError(objects[i].url, "rank 0's object facts lack '" +
                                                        objects[i].url +
                                                        "': the ranks listed other objects");
            facts[i] = it->second.second;
          }
          return facts;
        });
  }
  if (ctx != nullptr && ctx->memo) {
    std::lock_guard lock(ctx->memo->mu);
    for (std::size_t i = 0; i < objects.size(); ++i)
      ctx->memo->facts.emplace(fact_key(kind, objects[i]), out[i]);
  }
  return out;
}

}  // namespace flowstate
