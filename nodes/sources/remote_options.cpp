#include "flowstate/nodes/sources/remote_options.h"

#include <chrono>
#include <cmath>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/remote_listing.h"

namespace flowstate {

std::string check_byte_size(const ParamValue& value) {
  const auto* text = std::get_if<std::string>(&value);
  if (text == nullptr) return "must be a byte size (like 20GiB, 500MB or 1048576)";
  try {
    if (parse_byte_size(*text, "limit") == 0) return "must be more than 0 bytes";
  } catch (const ConfigError&) {
    return "must be a byte size (like 20GiB, 500MB or 1048576), not '" + *text + "'";
  }
  return "";
}

std::string check_endpoint(const ParamValue& value) {
  const auto* url = std::get_if<std::string>(&value);
  if (url == nullptr) return "";
  // The value is not repeated in these messages: it may hold the secret it is refused for.
  if (!url->starts_with("http://") && !url->starts_with("https://"))
    return "must be an http:// or https:// URL";
  if (redact_url(*url) != *url)
    return "must not hold user info or a query string (keys come from the environment or "
           "the profile)";
  return "";
}

namespace {

/// The cache directory in force for `source`: its option, the job's, the environment's.
std::filesystem::path resolve_cache_dir(const SourceRemote* source) {
  const ListingContext* job = current_listing_context();
  if (source != nullptr && source->cache.dir) {
    const std::filesystem::path dir(*source->cache.dir);
    return dir.is_relative() && !source->base_dir.empty() ? source->base_dir / dir : dir;
  }
  if (job != nullptr && !job->cache_dir.empty()) return job->cache_dir;
  return CacheSettings::environment_dir();
}

}  // namespace

CacheSettings resolve_cache_settings(const SourceRemote* source) {
  const ListingContext* job = current_listing_context();
  CacheSettings s;
  s.dir = resolve_cache_dir(source);
  if (source != nullptr && source->cache.limit) {
    s.limit_key = source->node + ".cache.limit";
    s.limit = parse_byte_size(*source->cache.limit, s.limit_key);  // checked: above 0
  } else if (job != nullptr && job->cache_limit != 0) {
    s.limit_key = "cache_limit";
    s.limit = job->cache_limit;
  } else {
    s.limit = CacheSettings::environment_limit();
  }
  return s;
}

RemoteSettings resolve_remote_settings(const SourceRemote* source) {
  if (source == nullptr) {
    RemoteSettings s = RemoteSettings::from_environment();
    s.listing_dir = resolve_cache_dir(nullptr).string();
    return s;
  }
  const RemoteOptions& o = source->remote;
  RemoteSettings s = RemoteSettings::from_environment(o.profile.value_or(""));
  s.listing_dir = resolve_cache_dir(source).string();
  auto ms = [](double seconds) {
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000)));
  };
  if (o.endpoint) s.endpoint = *o.endpoint;
  if (o.region) s.region = *o.region;
  if (o.anonymous) {
    s.access_key.clear();
    s.secret_key.clear();
    s.session_token.clear();
  }
  if (o.ca_bundle) {
    const std::filesystem::path ca(*o.ca_bundle);
    s.ca_bundle =
        (ca.is_relative() && !source->base_dir.empty() ? source->base_dir / ca : ca).string();
  }
  if (o.attempts) s.attempts = static_cast<int>(*o.attempts);
  if (o.timeout) s.timeout = ms(*o.timeout);
  if (o.backoff) s.backoff = ms(*o.backoff);
  if (o.connections) s.connections = static_cast<int>(*o.connections);
  if (o.rate) s.rate = *o.rate;
  if (o.listing_max_age) s.listing_max_age = ms(*o.listing_max_age);
  return s;
}

}  // namespace flowstate
