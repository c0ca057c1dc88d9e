// The remote client in one file (over 600 lines): URL grammar, settings, listing and
// downloads share the private curl handle set-up, the retry loop and the request schedule,
// which a split would have to expose in a header.
#include "flowstate/nodes/sources/remote_store.h"

#include <curl/curl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "flowstate/core/error.h"

namespace flowstate {

namespace {

std::atomic<std::uint64_t> g_lists{0}, g_heads{0}, g_gets{0}, g_retries{0};

/// curl_global_init once per process, before the first handle (it is not thread-safe itself).
void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

/// The value of `key` in section `section` of the INI file `path` ("" when absent).
std::string ini_value(const std::string& path, const std::string& section, const std::string& key) {
  std::ifstream in(path);
  std::string line, current;
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t\r");
    const auto e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      current = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos || current != section) continue;
    if (trim(line.substr(0, eq)) == key) return trim(line.substr(eq + 1));
  }
  return "";
}

std::uint64_t parse_env_number(const char* name, double scale, double min, double max,
                               double fallback) {
  const std::string v = env(name);
  if (v.empty()) return static_cast<std::uint64_t>(fallback * scale);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0' || !(d >= min && d <= max))
    throw ConfigError(name, std::string("must be a number in [") + std::to_string(min) + ", " +
                                std::to_string(max) + "], not '" + v + "'");
  return static_cast<std::uint64_t>(d * scale);
}

/// Percent-encodes `s` as S3 canonical URIs want it (RFC 3986 unreserved kept; '/' kept when
/// `keep_slash`).
std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

/// The text of every `<tag>...</tag>` in `xml` in order, XML entities decoded.
std::vector<std::string> xml_all(std::string_view xml, const std::string& tag) {
  std::vector<std::string> out;
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  std::size_t at = 0;
  while ((at = xml.find(open, at)) != std::string_view::npos) {
    const std::size_t b = at + open.size();
    const std::size_t e = xml.find(close, b);
    if (e == std::string_view::npos) break;
    std::string v;
    for (std::size_t i = b; i < e; ++i) {
      if (xml[i] != '&') {
        v += xml[i];
        continue;
      }
      static const std::pair<const char*, char> entities[] = {
          {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
      bool done = false;
      for (const auto& [name, ch] : entities)
        if (xml.substr(i, std::strlen(name)) == name) {
          v += ch;
          i += std::strlen(name) - 1;
          done = true;
          break;
        }
      if (!done && xml.substr(i, 2) == "&#") {
        const std::size_t semi = xml.find(';', i);
        if (semi != std::string_view::npos && semi < e) {
          const std::string num(xml.substr(i + 2, semi - i - 2));
          const long code = num[0] == 'x' ? std::strtol(num.c_str() + 1, nullptr, 16)
                                          : std::strtol(num.c_str(), nullptr, 10);
          if (code > 0 && code < 128) {
            v += static_cast<char>(code);
            i = semi;
            done = true;
          }
        }
      }
      if (!done) v += '&';
    }
    out.push_back(std::move(v));
    at = e + close.size();
  }
  return out;
}

/// One HTTP request's outcome.
struct Response {
  long status = 0;  ///< 0: no response (a transfer error)
  CURLcode code = CURLE_OK;
  std::string error;  ///< curl's message for a transfer error
  std::string etag;
  std::uint64_t content_length = 0;
  bool has_length = false;
};

struct Request {
  Response resp;  ///< filled as the answer arrives (the status before any body byte)
  std::string url;
  bool s3 = false;
  bool head = false;
  std::string range;                                   ///< "a-b" or ""
  std::string if_match;                                ///< an ETag or ""
  std::function<bool(const char*, std::size_t)> body;  ///< false aborts
};

std::size_t write_cb(char* data, std::size_t, std::size_t n, void* user) {
  auto* r = static_cast<Request*>(user);
  if (!r->body) return n;
  return r->body(data, n) ? n : 0;
}

std::size_t header_cb(char* data, std::size_t, std::size_t n, void* user) {
  Response* resp = &static_cast<Request*>(user)->resp;
  std::string_view line(data, n);
  if (line.starts_with("HTTP/")) {
    // A status line starts a response (after a redirect or 100 Continue): forget the last.
    *resp = Response{};
    const auto sp = line.find(' ');
    if (sp != std::string_view::npos)
      resp->status = std::strtol(std::string(line.substr(sp + 1, 3)).c_str(), nullptr, 10);
    return n;
  }
  const auto colon = line.find(':');
  if (colon == std::string_view::npos) return n;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' '))
    value.remove_suffix(1);
  if (name == "etag") resp->etag = std::string(value);
  if (name == "content-length") {
    resp->content_length = std::strtoull(std::string(value).c_str(), nullptr, 10);
    resp->has_length = true;
  }
  return n;
}

/// Sends one request (one attempt).
Response perform(Request& req, const RemoteSettings& s) {
  curl_init_once();
  wait_for_request_slot(s.rate);
  req.resp = Response{};
  Response& resp = req.resp;
  std::unique_ptr<CURL, void (*)(CURL*)> h(curl_easy_init(), curl_easy_cleanup);
  if (!h) {
    resp.code = CURLE_FAILED_INIT;
    // (libcurl is loaded on first use: curl_easy_strerror then says why it could not be.)
    resp.error =
        std::string("cannot create a curl handle: ") + curl_easy_strerror(CURLE_FAILED_INIT);
    return resp;
  }
  CURL* c = h.get();
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, req.s3 ? 0L : 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  const long timeout_s = std::max<long>(1, static_cast<long>((s.timeout.count() + 999) / 1000));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(s.timeout.count()));
  // A stall: under 1 byte per second for the timeout.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, timeout_s);
  if (!s.ca_bundle.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, s.ca_bundle.c_str());
  if (req.head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (!req.range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, req.range.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_cb);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &req);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, header_cb);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &req);
  struct curl_slist* headers = nullptr;
  std::string sigv4;
  std::string userpwd;
  if (!req.if_match.empty())
    headers = curl_slist_append(headers, ("If-Match: " + req.if_match).c_str());
  if (req.s3 && s.signs()) {
    sigv4 = "aws:amz:" + s.region + ":s3";
    userpwd = s.access_key + ":" + s.secret_key;
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
    // The hash of the (empty) payload: S3 wants it as a header, and curl signs it.
    headers = curl_slist_append(
        headers,
        "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    if (!s.session_token.empty())
      headers = curl_slist_append(headers, ("x-amz-security-token: " + s.session_token).c_str());
  }
  if (headers != nullptr) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  resp.code = curl_easy_perform(c);
  if (headers != nullptr) curl_slist_free_all(headers);
  // The user info must not outlive the request in memory longer than needed.
  std::fill(userpwd.begin(), userpwd.end(), '\0');
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  resp.status = status;
  if (resp.code != CURLE_OK)
    resp.error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(resp.code);
  // curl's message may quote the URL; show it redacted.
  const auto at = resp.error.find(req.url);
  if (at != std::string::npos) resp.error.replace(at, req.url.size(), redact_url(req.url));
  return resp;
}

bool retryable(const Response& r) {
  if (r.code == CURLE_WRITE_ERROR) return false;  // our own abort
  if (r.code != CURLE_OK) return true;  // timeouts, resets, refused connections, cut bodies
  return r.status == 408 || r.status == 429 || r.status >= 500;
}

std::string describe(const Response& r) {
  if (r.code != CURLE_OK && r.status == 0) return r.error;
  if (r.code != CURLE_OK) return "HTTP " + std::to_string(r.status) + ", then " + r.error;
  return "HTTP " + std::to_string(r.status);
}

void backoff_sleep(const RemoteSettings& s, int failures) {
  const auto wait = s.backoff * (1LL << std::min(failures - 1, 5));
  std::this_thread::sleep_for(wait);
}

[[noreturn]] void fail(const std::string& shown, const Response& r, int attempts,
                       const std::string& what) {
  throw DataError(shown, DataError::kNoOffset,
                  "cannot " + what + " '" + shown + "': " + describe(r) + " (after " +
                      std::to_string(attempts) + (attempts == 1 ? " attempt" : " attempts") + ")");
}

/// A request retried per settings until it succeeds (2xx); `on_attempt` sets up each attempt
/// (a fresh body sink) and returns false to stop early. Returns the final response.
Response with_retries(Request& req, const RemoteSettings& s, const std::string& shown,
                      const std::string& what, const std::function<void()>& before_attempt = {}) {
  int failures = 0, attempts = 0;
  for (;;) {
    if (before_attempt) before_attempt();
    ++attempts;
    Response r = perform(req, s);
    if (r.code == CURLE_OK && r.status >= 200 && r.status < 300) return r;
    if (!retryable(r) || ++failures >= s.attempts) fail(shown, r, attempts, what);
    g_retries.fetch_add(1, std::memory_order_relaxed);
    backoff_sleep(s, failures);
  }
}

/// The S3 endpoint URL of `bucket` and the (encoded) `key`.
std::string s3_url(const RemoteSettings& s, const std::string& bucket, const std::string& key) {
  if (!s.endpoint.empty()) {
    std::string e = s.endpoint;
    while (!e.empty() && e.back() == '/') e.pop_back();
    return e + "/" + bucket + "/" + uri_encode(key, true);
  }
  return "https://" + bucket + ".s3." + s.region + ".amazonaws.com/" + uri_encode(key, true);
}

std::vector<RemoteObject> list_s3(const std::string& pattern, const RemoteSettings& s) {
  const std::string rest = pattern.substr(5);  // after "s3://"
  const auto slash = rest.find('/');
  const std::string bucket = rest.substr(0, slash);
  const std::string key_pattern = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (bucket.empty())
    throw ConfigError("paths", "'" + redact_url(pattern) + "' names no bucket (s3://BUCKET/KEY)");
  const std::size_t wild = key_pattern.find_first_of("*?[");
  const bool globbed = wild != std::string::npos;
  const std::string prefix = globbed ? key_pattern.substr(0, wild) : key_pattern;
  std::vector<RemoteObject> out;
  std::string token;
  const std::string shown = redact_url(pattern);
  for (;;) {
    std::string base = s3_url(s, bucket, "");
    if (!base.empty() && base.back() == '/') base.pop_back();
    // Parameters in sorted order: SigV4's canonical query string sorts them, and curl signs
    // the query as given.
    std::string url = base + "?";
    if (!token.empty()) url += "continuation-token=" + uri_encode(token, false) + "&";
    url += "list-type=2&max-keys=" + std::to_string(s.page_keys) +
           "&prefix=" + uri_encode(prefix, false);
    std::string body;
    Request req{.url = url, .s3 = true};
    req.body = [&](const char* d, std::size_t n) {
      if (body.size() + n > (std::size_t{64} << 20)) return false;
      body.append(d, n);
      return true;
    };
    g_lists.fetch_add(1, std::memory_order_relaxed);
    with_retries(req, s, "s3://" + bucket + "/" + prefix, "list", [&] { body.clear(); });
    const auto keys = xml_all(body, "Key");
    const auto sizes = xml_all(body, "Size");
    const auto etags = xml_all(body, "ETag");
    if (sizes.size() != keys.size())
      throw DataError(shown, DataError::kNoOffset,
                      "cannot list '" + shown + "': the server's answer is not a key listing");
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (globbed ? !glob_matches(key_pattern, keys[i]) : keys[i] != key_pattern) continue;
      out.push_back({.url = "s3://" + bucket + "/" + keys[i],
                     .fetch_url = s3_url(s, bucket, keys[i]),
                     .s3 = true,
                     .size = std::strtoull(sizes[i].c_str(), nullptr, 10),
                     .etag = i < etags.size() ? etags[i] : ""});
    }
    const auto truncated = xml_all(body, "IsTruncated");
    const auto next = xml_all(body, "NextContinuationToken");
    if (truncated.empty() || truncated[0] != "true" || next.empty() || next[0].empty()) break;
    token = next[0];
  }
  std::sort(out.begin(), out.end(),
            [](const RemoteObject& a, const RemoteObject& b) { return a.url < b.url; });
  if (out.empty())
    throw DataError(shown, DataError::kNoOffset, "no object matches '" + shown + "'");
  return out;
}

std::vector<RemoteObject> list_http(const std::string& pattern, const RemoteSettings& s) {
  const auto urls = expand_braces(pattern);
  std::vector<RemoteObject> out(urls.size());
  for_each_connection(urls.size(), s.connections, [&](std::size_t i) {
    const std::string shown = redact_url(urls[i]);
    Request req{.url = urls[i], .head = true};
    g_heads.fetch_add(1, std::memory_order_relaxed);
    Response r = with_retries(req, s, shown, "read");
    if (!r.has_length)
      throw DataError(shown, DataError::kNoOffset,
                      "cannot read '" + shown + "': the server sent no Content-Length");
    out[i] = {.url = shown, .fetch_url = urls[i], .size = r.content_length, .etag = r.etag};
  });
  return out;
}

}  // namespace

bool is_remote_url(std::string_view path) {
  return path.starts_with("s3://") || path.starts_with("http://") || path.starts_with("https://");
}

std::vector<std::string> expand_braces(const std::string& pattern) {
  const auto open = pattern.find('{');
  if (open == std::string::npos) {
    if (pattern.find('}') != std::string::npos)
      throw ConfigError("paths", "'" + redact_url(pattern) + "' has a '}' without a '{'");
    return {pattern};
  }
  const auto close = pattern.find('}', open);
  if (close == std::string::npos)
    throw ConfigError("paths", "'" + redact_url(pattern) + "' has a '{' without a '}'");
  const std::string body = pattern.substr(open + 1, close - open - 1);
  const std::string head = pattern.substr(0, open);
  const auto tails = expand_braces(pattern.substr(close + 1));
  std::vector<std::string> items;
  const auto dots = body.find("..");
  if (body.find('{') != std::string::npos)
    throw ConfigError("paths", "'" + redact_url(pattern) + "' nests braces");
  if (dots != std::string::npos && body.find(',') == std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    auto digits = [](const std::string& t) {
      return !t.empty() && t.size() <= 18 &&
             std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    };
    if (!digits(a) || !digits(b))
      throw ConfigError("paths", "'" + redact_url(pattern) + "': {" + body +
                                     "} is not a range of numbers like {0000..0127}");
    const std::uint64_t x = std::stoull(a), y = std::stoull(b);
    const std::uint64_t count = (x <= y ? y - x : x - y) + 1;
    if (count > 10'000'000)
      throw ConfigError("paths", "'" + redact_url(pattern) + "': {" + body + "} names " +
                                     std::to_string(count) + " values, more than 10000000");
    const std::size_t width = a.size() > 1 && a[0] == '0' ? a.size() : 0;
    for (std::uint64_t k = 0; k < count; ++k) {
      std::string v = std::to_string(x <= y ? x + k : x - k);
      if (v.size() < width) v.insert(0, width - v.size(), '0');
      items.push_back(std::move(v));
    }
  } else {
    std::size_t at = 0;
    for (;;) {
      const auto comma = body.find(',', at);
      items.push_back(body.substr(at, comma - at));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    if (body.empty()) throw ConfigError("paths", "'" + redact_url(pattern) + "' has an empty {}");
  }
  std::vector<std::string> out;
  out.reserve(items.size() * tails.size());
  for (const auto& i : items)
    for (const auto& t : tails) out.push_back(head + i + t);
  return out;
}

bool glob_matches(const std::string& pattern, const std::string& name) {
  return ::fnmatch(pattern.c_str(), name.c_str(), FNM_PATHNAME) == 0;
}

std::string redact_url(std::string_view url) {
  std::string u(url);
  const auto q = u.find_first_of("?#");
  if (q != std::string::npos) u.erase(q);
  const auto scheme = u.find("://");
  if (scheme != std::string::npos) {
    const auto host = scheme + 3;
    const auto slash = u.find('/', host);
    const auto at = u.rfind('@', slash == std::string::npos ? std::string::npos : slash);
    if (at != std::string::npos && at >= host) u.erase(host, at + 1 - host);
  }
  return u;
}

RemoteSettings RemoteSettings::from_environment(const std::string& named_profile) {
  RemoteSettings s;
  const std::string home = env("HOME");
  std::string profile = named_profile.empty() ? env("AWS_PROFILE") : named_profile;
  if (profile.empty()) profile = "default";
  std::string creds = env("AWS_SHARED_CREDENTIALS_FILE");
  if (creds.empty() && !home.empty()) creds = home + "/.aws/credentials";
  std::string config = env("AWS_CONFIG_FILE");
  if (config.empty() && !home.empty()) config = home + "/.aws/config";
  const std::string config_section = profile == "default" ? "default" : "profile " + profile;

  if (named_profile.empty()) {
    s.access_key = env("AWS_ACCESS_KEY_ID");
    s.secret_key = env("AWS_SECRET_ACCESS_KEY");
    s.session_token = env("AWS_SESSION_TOKEN");
  }
  if (s.access_key.empty() && s.secret_key.empty() && !creds.empty()) {
    s.access_key = ini_value(creds, profile, "aws_access_key_id");
    s.secret_key = ini_value(creds, profile, "aws_secret_access_key");
    s.session_token = ini_value(creds, profile, "aws_session_token");
  }
  std::string region = env("AWS_REGION");
  if (region.empty()) region = env("AWS_DEFAULT_REGION");
  if (region.empty() && !config.empty()) region = ini_value(config, config_section, "region");
  if (!region.empty()) s.region = region;
  s.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (s.endpoint.empty()) s.endpoint = env("AWS_ENDPOINT_URL");
  if (s.endpoint.empty() && !config.empty())
    s.endpoint = ini_value(config, config_section, "endpoint_url");
  s.ca_bundle = env("AWS_CA_BUNDLE");
  if (s.ca_bundle.empty()) s.ca_bundle = env("CURL_CA_BUNDLE");
  s.attempts = static_cast<int>(parse_env_number("FLOWSTATE_REMOTE_ATTEMPTS", 1, 1, 1000, 6));
  s.timeout = std::chrono::milliseconds(
      parse_env_number("FLOWSTATE_REMOTE_TIMEOUT", 1000, 0.001, 86400, 30));
  s.backoff =
      std::chrono::milliseconds(parse_env_number("FLOWSTATE_REMOTE_BACKOFF", 1000, 0, 3600, 0.2));
  s.connections = static_cast<int>(parse_env_number("FLOWSTATE_REMOTE_CONNECTIONS", 1, 1, 256, 8));
  s.page_keys = static_cast<int>(parse_env_number("FLOWSTATE_S3_PAGE_KEYS", 1, 1, 1000, 1000));
  s.rate = static_cast<double>(parse_env_number("FLOWSTATE_REMOTE_RATE", 1000, 0, 1e6, 0)) / 1000.0;
  s.listing_max_age = std::chrono::milliseconds(
      parse_env_number("FLOWSTATE_LISTING_MAX_AGE", 1000, 0, kMaxListingAgeSeconds, 0));
  return s;
}

std::vector<RemoteObject> list_remote(const std::string& pattern, const RemoteSettings& settings) {
  if (pattern.starts_with("s3://")) return list_s3(pattern, settings);
  return list_http(pattern, settings);
}

std::string s3_fetch_url(const std::string& url, const RemoteSettings& settings) {
  const std::string rest = url.substr(std::min<std::size_t>(url.size(), 5));  // after "s3://"
  const auto slash = rest.find('/');
  return s3_url(settings, rest.substr(0, slash),
                slash == std::string::npos ? "" : rest.substr(slash + 1));
}

namespace {

/// Writes a download into its cached copy in pieces that end on the file's 2 MiB boundaries.
/// The page cache keeps a file's pages in folios the size of the writes that made them: curl's
/// 16 KiB callbacks written as they came left a copy in 16 KiB folios, and the first pass of a
/// process over a mapping of such a copy costs ~10x the same pass over one written in 2 MiB
/// pieces (bench/RESULTS.md, "warm cache").
class AlignedWriter {
 public:
  static constexpr std::uint64_t kPiece = std::uint64_t{2} << 20;

  explicit AlignedWriter(int fd) : fd_(fd) { buffer_.reserve(kPiece); }

  /// Starts over at file offset `at`; what is buffered must have been flushed.
  void start(std::uint64_t at) {
    at_ = at;
    buffer_.clear();
  }

  /// Appends `n` bytes, writing every piece that reaches a boundary. False: `error` says why.
  bool add(const char* d, std::size_t n, std::string& error) {
    while (n > 0) {
      const std::uint64_t end = at_ + buffer_.size();
      const std::size_t room = static_cast<std::size_t>(kPiece - end % kPiece);
      const std::size_t take = std::min(room, n);
      buffer_.insert(buffer_.end(), d, d + take);
      d += take;
      n -= take;
      if (take == room && !flush(error)) return false;
    }
    return true;
  }

  /// Writes what is buffered. False: `error` says why.
  bool flush(std::string& error) {
    std::size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t w =
          ::pwrite(fd_, buffer_.data() + done, buffer_.size() - done, static_cast<off_t>(at_));
      if (w < 0) {
        if (errno == EINTR) continue;
        error = std::string("cannot write the cached copy: ") + std::strerror(errno);
        return false;
      }
      done += static_cast<std::size_t>(w);
      at_ += static_cast<std::uint64_t>(w);
    }
    buffer_.clear();
    return true;
  }

 private:
  int fd_;
  std::uint64_t at_ = 0;  ///< the file offset of buffer_[0]
  std::vector<char> buffer_;
};

}  // namespace

void download_object(const RemoteObject& object, int fd, const RemoteSettings& s,
                     const std::function<void(std::uint64_t)>& progress) {
  download_range(object, 0, object.size, fd, s, progress);
}

void download_range(const RemoteObject& object, std::uint64_t offset, std::uint64_t length, int fd,
                    const RemoteSettings& s, const std::function<void(std::uint64_t)>& progress) {
  if (offset > object.size || length > object.size - offset)
    throw DataError(object.url, offset,
                    "cannot download bytes " + std::to_string(offset) + "+" +
                        std::to_string(length) + " of '" + object.url + "' (" +
                        std::to_string(object.size) + " bytes listed)");
  // Messages name the range when it is not the whole object.
  const std::string shown = offset == 0 && length == object.size
                                ? object.url
                                : object.url + " bytes " + std::to_string(offset) + "-" +
                                      std::to_string(offset + length - 1);
  std::uint64_t got = 0;  // bytes of the range received, written at [0, got) of `fd`
  std::string write_error;
  int failures = 0, attempts = 0;
  AlignedWriter writer(fd);
  for (bool done = false; !done;) {
    Request req{.url = object.fetch_url, .s3 = object.s3, .if_match = object.etag};
    if (length > 0)
      req.range = std::to_string(offset + got) + "-" + std::to_string(offset + length - 1);
    const std::uint64_t at_start = got;
    bool first = true;
    std::uint64_t skip = 0;  // bytes of a 200's whole object before the range
    bool complete = false;   // a 200's body reached the range's end: the rest is not needed
    writer.start(got);
    req.body = [&, r = &req](const char* d, std::size_t n) {
      // A 200 to a range request is the whole object again: it starts at byte 0, and the
      // bytes before the range are skipped.
      if (first && r->resp.status == 200) {
        got = 0;
        skip = offset;
        writer.start(0);
      }
      first = false;
      if (r->resp.status != 200 && r->resp.status != 206) return true;  // an error's body
      if (skip > 0) {
        const std::size_t drop = static_cast<std::size_t>(std::min<std::uint64_t>(skip, n));
        skip -= drop;
        d += drop;
        n -= drop;
      }
      if (r->resp.status == 200 && got + n > length && length < object.size) {
        n = static_cast<std::size_t>(length - got);  // past the range: not needed
        complete = true;
      }
      const std::uint64_t at = got;
      if (at + n > length) {
        write_error =
            "the server sent more than the " + std::to_string(length) + " bytes asked for";
        return false;
      }
      if (!writer.add(d, n, write_error)) return false;
      got += n;
      return !complete;  // aborts the transfer once a whole object's answer covered the range
    };
    ++attempts;
    g_gets.fetch_add(1, std::memory_order_relaxed);
    Response r = perform(req, s);
    // What arrived is written whatever ended the attempt: a retry resumes after it.
    if (write_error.empty()) writer.flush(write_error);
    if (progress && got > at_start) progress(got);
    if (!write_error.empty())
      throw DataError(object.url, offset + got, "cannot download '" + shown + "': " + write_error);
    if (complete && got == length) r.code = CURLE_OK;  // the abort was ours: the range is in
    if ((r.status == 200 || r.status == 206) && !object.etag.empty() && !r.etag.empty() &&
        r.etag != object.etag)
      // A server that ignores If-Match (s3rver does) sent another version: refused as a 412.
      throw DataError(object.url, DataError::kNoOffset,
                      "'" + object.url + "' changed on the server since it was listed (its ETag " +
                          object.etag + " is now " + r.etag + ")");
    if (r.code == CURLE_OK && (r.status == 200 || r.status == 206)) {
      done = got == length;
      if (!done && got == at_start) {
        // A success that carried nothing: count it as a failure.
        if (++failures >= s.attempts) fail(shown, r, attempts, "download");
        backoff_sleep(s, failures);
      }
      continue;
    }
    if (r.status == 412)
      throw DataError(object.url, DataError::kNoOffset,
                      "'" + object.url + "' changed on the server since it was listed (its ETag " +
                          object.etag + " no longer matches)");
    if (got > at_start || (r.status == 200 && got > 0))
      failures = 0;  // progress: the link works, only this connection broke
    if (!retryable(r) || ++failures >= s.attempts) fail(shown, r, attempts, "download");
    g_retries.fetch_add(1, std::memory_order_relaxed);
    backoff_sleep(s, failures);
  }
}

void wait_for_request_slot(double rate) {
  if (!(rate > 0)) return;
  using Clock = std::chrono::steady_clock;
  static std::mutex mu;
  static Clock::time_point next{};  // when the next request may start
  Clock::time_point start;
  {
    std::lock_guard lock(mu);
    const auto now = Clock::now();
    start = std::max(now, next);
    next = start +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate));
  }
  std::this_thread::sleep_until(start);
}

RemoteRequestCounts remote_request_counts() {
  return {g_lists.load(), g_heads.load(), g_gets.load(), g_retries.load()};
}

void for_each_connection(std::size_t count, int connections,
                         const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < count;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        next = count;
      }
    }
  };
  const int n = std::clamp<int>(connections, 1, static_cast<int>(std::max<std::size_t>(1, count)));
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flowstate
