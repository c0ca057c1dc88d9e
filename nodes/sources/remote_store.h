// Remote data: `s3://bucket/prefix/train-*.tar` and `https://host/path/shard-{0000..0127}.tar`
// (also `http://`) as the paths of file sources. This file holds the URL grammar (brace ranges,
// client-side globs, credential-free display names), the settings read the way the AWS tools
// read them, and the client: libcurl, S3 requests signed by curl's own SigV4
// (CURLOPT_AWS_SIGV4), ListObjectsV2 paginated, HEAD for HTTP objects, and whole-object GETs
// into a file with retries, exponential backoff and byte-range resume. The cache that holds the
// downloaded copies is nodes/sources/object_cache.h.
//
//   RemoteSettings s = RemoteSettings::from_environment();
//   for (const RemoteObject& o : list_remote("s3://bucket/train-*.tar", s)) ...
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace flowstate {

/// True for a path flowstate reads remotely: it starts with `s3://`, `http://` or `https://`.
bool is_remote_url(std::string_view path);

/// Expands brace groups as webdataset and the shell write them, left to right, in the order
/// written: `{0000..0127}` is a numeric range (zero-padded to the width of its first bound when
/// that starts with 0; descending when the first bound is larger), `{a,b,c}` a list. Text
/// without braces is one result. Throws ConfigError (key `paths`) naming the pattern for an
/// unbalanced or empty group, or a range of more than 10 000 000 values.
std::vector<std::string> expand_braces(const std::string& pattern);

/// Whether the key `name` matches the glob `pattern` (`*`, `?`, `[...]`; `*` and `?` do not
/// match `/`, as a local glob's do not cross directories).
bool glob_matches(const std::string& pattern, const std::string& name);

/// `url` without what may hold a secret: user info (`user:pass@`) and the query string are
/// removed. Every URL flowstate shows (errors, identities, inspect) goes through it.
std::string redact_url(std::string_view url);

/// The longest FLOWSTATE_LISTING_MAX_AGE (and `remote.listing_max_age`) accepted: a year.
inline constexpr double kMaxListingAgeSeconds = 365.0 * 24 * 3600;

/// How remote objects are reached, read from the environment the way the AWS CLI reads it.
/// Holds secrets: never formatted into a message.
struct RemoteSettings {
  std::string access_key;            ///< AWS_ACCESS_KEY_ID (or the profile's aws_access_key_id)
  std::string secret_key;            ///< AWS_SECRET_ACCESS_KEY (or the profile's)
  std::string session_token;         ///< AWS_SESSION_TOKEN (or the profile's); may be empty
  std::string region = "us-east-1";  ///< AWS_REGION, AWS_DEFAULT_REGION, the profile's region
  /// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL ("http://127.0.0.1:9000"): an S3-compatible store,
  /// addressed path-style (endpoint/bucket/key). Empty: AWS, virtual-hosted style.
  std::string endpoint;
  std::string ca_bundle;  ///< AWS_CA_BUNDLE or CURL_CA_BUNDLE: extra trusted certificates
  /// Failed attempts of one request, counting the first, before it is an error
  /// (FLOWSTATE_REMOTE_ATTEMPTS, default 6). An attempt that received bytes does not count.
  int attempts = 6;
  /// No byte for this long (connect or body) is a timeout, retried
  /// (FLOWSTATE_REMOTE_TIMEOUT, seconds, default 30).
  std::chrono::milliseconds timeout{30000};
  /// The first retry's wait; each next one doubles it, up to 32 times it
  /// (FLOWSTATE_REMOTE_BACKOFF, seconds, default 0.2).
  std::chrono::milliseconds backoff{200};
  int connections = 8;   ///< parallel downloads (FLOWSTATE_REMOTE_CONNECTIONS, default 8)
  int page_keys = 1000;  ///< keys per ListObjectsV2 page (FLOWSTATE_S3_PAGE_KEYS; tests page)
  /// Requests per second this process starts at most, over all its connections — list
  /// pages, HEADs, GETs and retries alike — spaced evenly (FLOWSTATE_REMOTE_RATE; 0, the
  /// default: unbounded). Per process: a job of N processes sends up to N times as many.
  double rate = 0;
  /// How old a listing saved in the cache directory (`listing_dir`) may be for a job to read
  /// it instead of listing (FLOWSTATE_LISTING_MAX_AGE, seconds; 0, the default: every job
  /// lists). What a reused listing may miss, and what it never lets through, is job_listing's
  /// rule (nodes/sources/remote_listing.h).
  std::chrono::milliseconds listing_max_age{0};
  /// The cache directory whose `listings/` holds the listings jobs may reuse (set by
  /// resolve_remote_settings to the source's cache directory). Empty: none is read or saved.
  std::string listing_dir;

  /// Reads the environment and, for what it lacks, the shared credentials and config files
  /// (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, AWS_CONFIG_FILE or ~/.aws/config) for
  /// AWS_PROFILE (default "default"). Throws ConfigError naming a variable that is malformed.
  /// A `profile` given (a source's `remote.profile`) is read instead of AWS_PROFILE, and its
  /// keys are used even when the environment has keys (as `aws --profile` does).
  static RemoteSettings from_environment(const std::string& profile = {});
  /// Whether S3 requests are signed: both keys are known (otherwise they are anonymous).
  bool signs() const { return !access_key.empty() && !secret_key.empty(); }
};

/// One remote object as listed.
struct RemoteObject {
  std::string url;        ///< as shown: `s3://bucket/key` or the HTTP URL, redacted
  std::string fetch_url;  ///< the HTTP(S) URL a GET reads
  bool s3 = false;        ///< signed as S3 when RemoteSettings::signs()
  std::uint64_t size = 0;
  std::string etag;  ///< as the server sent it, quotes included; may be empty for HTTP
};

/// The objects `pattern` names, in order: an `s3://bucket/prefix*glob` pattern lists the
/// keys under its prefix (the text before the first wildcard; ListObjectsV2, paginated) and
/// keeps the matches, sorted; an `http(s)://` pattern's brace groups are expanded (in the
/// order written) and each URL is asked for its size and ETag (HEAD, `connections` at a time).
/// A pattern matching nothing, a missing object or a server that fails past the retries is a
/// DataError naming the (redacted) URL, the HTTP status and the attempts.
std::vector<RemoteObject> list_remote(const std::string& pattern, const RemoteSettings& settings);

/// The HTTP(S) URL a GET of the S3 object `url` (`s3://bucket/key`, as listed) reads under
/// `settings`: path-style under the endpoint, else AWS's virtual-hosted URL.
std::string s3_fetch_url(const std::string& url, const RemoteSettings& settings);

/// Calls `fn(i)` for every i in [0, count) on up to `connections` threads (the caller's
/// included), each taking the next index; the first exception any call throws stops the
/// others from taking more and is rethrown once all have returned.
void for_each_connection(std::size_t count, int connections,
                         const std::function<void(std::size_t)>& fn);

/// Downloads `object` into the open file `fd` (bytes [0, size) written at their offsets),
/// retrying per `settings` and resuming at the first byte not yet received. Each GET sends
/// If-Match with the listed ETag: an object changed since it was listed is a DataError, never a
/// copy mixing two versions. `progress`, when given, is told the bytes written so far after
/// each attempt that wrote some. The copy is written in pieces ending on 2 MiB boundaries.
/// Throws DataError naming the URL, the last HTTP status (or transfer error) and the attempts.
void download_object(const RemoteObject& object, int fd, const RemoteSettings& settings,
                     const std::function<void(std::uint64_t)>& progress = {});

/// Downloads bytes [offset, offset + length) of `object` into the open file `fd` (written at
/// [0, length)), as download_object does a whole object: If-Match with the listed ETag on every
/// GET, retries per `settings` resuming at the first byte of the range not yet received (a 200
/// to a range request is read from its start, the bytes outside the range dropped). The range
/// must lie within the listed size (else a DataError). `progress` is told the range's bytes
/// received so far.
void download_range(const RemoteObject& object, std::uint64_t offset, std::uint64_t length, int fd,
                    const RemoteSettings& settings,
                    const std::function<void(std::uint64_t)>& progress = {});

/// Waits until this process may start one more request under a bound of `rate` requests per
/// second (RemoteSettings::rate; 0: returns at once). One schedule for the whole process, so
/// every connection shares it: the k-th request starts no sooner than k / rate seconds after
/// the schedule was last idle (virtual scheduling, no burst).
void wait_for_request_slot(double rate);

/// Counts of requests this process sent (tests and benchmarks read them).
struct RemoteRequestCounts {
  std::uint64_t lists = 0;    ///< ListObjectsV2 pages
  std::uint64_t heads = 0;    ///< HEAD requests
  std::uint64_t gets = 0;     ///< GET attempts of object bytes
  std::uint64_t retries = 0;  ///< attempts that failed and were retried
};
/// The counts so far.
RemoteRequestCounts remote_request_counts();

}  // namespace flowstate
