// The options every file source that reads URLs takes, declared once: `cache: {dir, limit}` (the
// local cache of remote objects) and `remote: {endpoint, region, profile, anonymous, ca_bundle,
// attempts, timeout, backoff, connections, rate, listing_max_age}` (how objects are reached). A
// source's table includes them with one row each (cache_param<O>(), remote_param<O>()); YAML, the
// C++ builder, Python's keyword arguments (a dict) and `flowstate schema` derive from the groups'
// tables.
//
// Precedence, per setting: the source's option, then the job's default (LoaderOptions::cache_dir
// and cache_limit, which `flowstate run --cache-dir/--cache-limit` and Python's
// Loader(cache_dir=, cache_limit=) set; the cache only), then the environment
// (FLOWSTATE_CACHE_*, AWS_*, FLOWSTATE_REMOTE_*), then the built-in default. Every one is free:
// where the bytes come from and are kept never changes them (the ETags and sizes are the data's
// identity), so none is in the fingerprint.
//
// Secrets are not options: access keys and session tokens come from the environment or a
// profile's files only, and `remote.endpoint` refuses user info and query strings, so nothing
// secret is in a pipeline's YAML, its description (`validate`, `inspect`), a trace or a
// checkpoint.
//
//   source: {type: tar, paths: "s3://bucket/train-*.tar",
//            cache: {dir: /scratch/cache, limit: 200GiB},
//            remote: {endpoint: "http://127.0.0.1:9000", region: eu-west-1, profile: lab}}
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>

#include "flowstate/nodes/options.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate {

/// The check of a `cache.limit` value: a byte size ("20GiB", "500MB", "1048576"), above 0.
std::string check_byte_size(const ParamValue& value);
/// The check of `remote.endpoint`: an http:// or https:// URL without user info or query.
std::string check_endpoint(const ParamValue& value);

/// A source's `cache` option: where its remote objects' copies are kept, and how many bytes
/// they may take. Unset: the job's default, else the environment, else the built-in default.
struct CacheOptions {
  std::optional<std::string> dir;    ///< the cache directory (relative: to the YAML file)
  std::optional<std::string> limit;  ///< a byte size: "20GiB", "500MB", "1048576"

  static constexpr auto table() {
    using O = CacheOptions;
    return std::tuple{
        param("dir", &O::dir,
              {.doc = "directory of the local copies, shared by the processes of a machine",
               .default_doc = "the job's cache_dir (flowstate run --cache-dir), else "
                              "FLOWSTATE_CACHE_DIR, else ~/.cache/flowstate"}),
        param("limit", &O::limit,
              {.doc = "bytes the copies may take (20GiB, 500MB, 1048576)",
               .default_doc = "the job's cache_limit (--cache-limit), else FLOWSTATE_CACHE_LIMIT, "
                              "else 20GiB",
               .check = check_byte_size}),
    };
  }
};

/// A source's `remote` option: how its `s3://` and `http(s)://` objects are reached. Unset: the
/// environment (as the AWS tools read it, and FLOWSTATE_REMOTE_*), else the built-in default.
/// Holds no secret (see the file comment).
struct RemoteOptions {
  std::optional<std::string> endpoint;    ///< an S3-compatible store (path-style requests)
  std::optional<std::string> region;      ///< the S3 region signed for
  std::optional<std::string> profile;     ///< the profile of ~/.aws/credentials and ~/.aws/config
  bool anonymous = false;                 ///< S3 requests unsigned, whatever keys are known
  std::optional<std::string> ca_bundle;   ///< extra trusted certificates (relative: to the YAML)
  std::optional<std::uint64_t> attempts;  ///< failed attempts of a request before an error
  std::optional<double> timeout;          ///< seconds without a byte before a retry
  std::optional<double> backoff;          ///< seconds before the first retry (then doubling)
  std::optional<std::uint64_t> connections;  ///< parallel downloads
  std::optional<double> rate;  ///< requests per second this process starts at most (0: any)
  /// seconds a listing saved in the cache directory is read instead of listing (0: never)
  std::optional<double> listing_max_age;

  static constexpr auto table() {
    using O = RemoteOptions;
    return std::tuple{
        param("endpoint", &O::endpoint,
              {.doc = "URL of an S3-compatible store (MinIO, Ceph RGW, R2, s3rver), no user info",
               .default_doc = "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url, "
                              "else AWS",
               .check = check_endpoint}),
        param("region", &O::region,
              {.doc = "S3 region", .default_doc = "AWS_REGION, the profile's, else us-east-1"}),
        param("profile", &O::profile,
              {.doc = "AWS profile whose keys (and region, endpoint_url) are used; keys set in "
                      "the environment then do not apply",
               .default_doc = "AWS_PROFILE, else default"}),
        param("anonymous", &O::anonymous,
              {.doc = "send S3 requests unsigned (a public bucket), whatever keys are known",
               .describe_if = [](const O& o) { return o.anonymous; }}),
        param("ca_bundle", &O::ca_bundle,
              {.doc = "extra trusted certificates for HTTPS (a PEM file)",
               .default_doc = "AWS_CA_BUNDLE, CURL_CA_BUNDLE, else the system's"}),
        param("attempts", &O::attempts,
              {.min = 1,
               .max = 1000,
               .doc = "failed attempts of a request, in a row, before it is an error",
               .default_doc = "FLOWSTATE_REMOTE_ATTEMPTS, else 6"}),
        param("timeout", &O::timeout,
              {.min = 0.001,
               .max = 86400,
               .doc = "seconds without a byte before an attempt is retried",
               .default_doc = "FLOWSTATE_REMOTE_TIMEOUT, else 30"}),
        param("backoff", &O::backoff,
              {.min = 0,
               .max = 3600,
               .doc = "seconds before the first retry; each next one doubles it",
               .default_doc = "FLOWSTATE_REMOTE_BACKOFF, else 0.2"}),
        param("connections", &O::connections,
              {.min = 1,
               .max = 256,
               .doc = "parallel downloads",
               .default_doc = "FLOWSTATE_REMOTE_CONNECTIONS, else 8"}),
        param("rate", &O::rate,
              {.min = 0,
               .max = 1e6,
               .doc = "requests per second the process starts at most, retries included (0: "
                      "unbounded)",
               .default_doc = "FLOWSTATE_REMOTE_RATE, else 0"}),
        param("listing_max_age", &O::listing_max_age,
              {.min = 0,
               .max = kMaxListingAgeSeconds,
               .doc = "seconds a listing the cache directory saved may be read instead of "
                      "listing again (objects added or removed since are not seen; a changed "
                      "object is still refused when read)",
               .default_doc = "FLOWSTATE_LISTING_MAX_AGE, else 0: every job lists"}),
    };
  }
};

/// The default of a source's `lookahead` option: files downloaded ahead of the reads.
inline constexpr std::size_t kDefaultLookahead = 8;
/// The doc of a source's `lookahead` option.
inline constexpr const char* kLookaheadDoc =
    "remote files (s3://, http(s)://) held ahead of the reads, downloading in the background "
    "(blocks, when the source reads them by range); the cache limit must hold this many files "
    "(blocks) and one more";

/// The `lookahead` row of a file source's options table (`O::lookahead`; free), described when
/// not kDefaultLookahead; `doc` where the source's reads differ from kLookaheadDoc's.
template <class O>
constexpr auto lookahead_param(const char* doc = kLookaheadDoc) {
  return param("lookahead", &O::lookahead,
               {.min = 1, .free = true, .doc = doc, .describe_if = [](const O& o) {
                  return o.lookahead != kDefaultLookahead;
                }});
}

/// The `cache` row of a file source's options table (`O::cache`, a CacheOptions; free).
template <class O>
constexpr auto cache_param() {
  return param("cache", &O::cache,
               {.free = true, .doc = "the local cache of remote objects: {dir, limit}"});
}
/// The `remote` row of a file source's options table (`O::remote`, a RemoteOptions; free).
template <class O>
constexpr auto remote_param() {
  return param(
      "remote", &O::remote,
      {.free = true,
       .doc = "how s3:// and http(s):// objects are reached: {endpoint, region, "
              "profile, anonymous, ca_bundle, attempts, timeout, backoff, connections, "
              "rate, listing_max_age}; keys come from the environment or the profile only"});
}

/// What one source says of its remote objects: its options and where they were written.
struct SourceRemote {
  std::string node;                ///< the source's type ("records"), for error keys
  std::filesystem::path base_dir;  ///< relative `cache.dir` and `remote.ca_bundle` resolve here
  CacheOptions cache;
  RemoteOptions remote;
};

/// The SourceRemote of a file source's options `o` (members base_dir, cache and remote).
template <class O>
SourceRemote source_remote(std::string node, const O& o) {
  return {std::move(node), o.base_dir, o.cache, o.remote};
}

/// The cache settings in force for `source` (null: no source options): each setting from the
/// source, else the job's default (the calling thread's ListingContext, set by the Loader), else
/// the environment, else the built-in default. `limit_key` names where the limit came from.
/// Throws ConfigError naming the key of a malformed value.
CacheSettings resolve_cache_settings(const SourceRemote* source);
/// The remote settings in force for `source` (null: the environment's): the source's options
/// over RemoteSettings::from_environment (read for the source's `profile` when it names one),
/// `listing_dir` the cache directory resolve_cache_settings gives.
RemoteSettings resolve_remote_settings(const SourceRemote* source);

}  // namespace flowstate
