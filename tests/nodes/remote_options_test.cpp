// A file source's `cache` and `remote` options (nodes/sources/remote_options.h): nested option
// values read from YAML and the C++ builder, checked by the groups' rows (an unknown sub-key is a
// ConfigError naming its file, line and key), free (not in the fingerprint), shown without
// secrets, and resolved source > job default > environment > built-in default. Requests
// through a real server with these options are tests/python/test_remote.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "flowstate/config/registry.h"
#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/remote_listing.h"
#include "flowstate/nodes/sources/remote_options.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

/// Sets (or, with nullptr, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

constexpr const char* kPipeline =
    "source:\n"
    "  type: records\n"
    "  paths: s3://bucket/train-*.bin\n"
    "  record_bytes: 64\n"
    "  cache: {dir: /scratch/c, limit: 1GiB}\n"
    "  remote: {endpoint: 'http://127.0.0.1:9000', region: eu-west-1, profile: lab,\n"
    "           attempts: 3, timeout: 1.5, connections: 4, rate: 20}\n"
    "nodes:\n"
    "  - batch: {size: 2}\n";

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

ConfigError error_of(const std::string& text) {
  try {
    from_yaml_string(text, "p.yaml");
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError for:\n" << text;
  return ConfigError("", "");
}

TEST(RemoteOptions, YamlReadsTheNestedGroupsIntoTheOptions) {
  // Building the pipeline opens nothing: the options are read and checked only.
  const Pipeline p = from_yaml_string(kPipeline, "p.yaml");
  const auto* o = p.nodes()[0].options_as<RecordsOptions>();
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->cache.dir, "/scratch/c");
  EXPECT_EQ(o->cache.limit, "1GiB");
  EXPECT_EQ(o->remote.endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(o->remote.region, "eu-west-1");
  EXPECT_EQ(o->remote.profile, "lab");
  EXPECT_EQ(o->remote.attempts, 3u);
  EXPECT_EQ(o->remote.timeout, 1.5);
  EXPECT_EQ(o->remote.connections, 4u);
  EXPECT_EQ(o->remote.rate, 20.0);
  EXPECT_FALSE(o->remote.anonymous);
  EXPECT_FALSE(o->remote.backoff);
  // Shown by describe (validate), each marked free.
  const std::string d = p.describe();
  EXPECT_NE(d.find("cache.dir: /scratch/c (free)"), std::string::npos) << d;
  EXPECT_NE(d.find("cache.limit: 1GiB (free)"), std::string::npos) << d;
  EXPECT_NE(d.find("remote.endpoint: http://127.0.0.1:9000 (free)"), std::string::npos) << d;
  EXPECT_NE(d.find("remote.attempts: 3 (free)"), std::string::npos) << d;
  EXPECT_EQ(d.find("remote.anonymous"), std::string::npos) << d;  // the default: not shown
}

TEST(RemoteOptions, AreFreeTheFingerprintIgnoresThem) {
  const Pipeline with = from_yaml_string(kPipeline, "p.yaml");
  const std::string bare =
      replace(replace(kPipeline, "  cache: {dir: /scratch/c, limit: 1GiB}\n", ""),
              "  remote: {endpoint: 'http://127.0.0.1:9000', region: eu-west-1, profile: lab,\n"
              "           attempts: 3, timeout: 1.5, connections: 4, rate: 20}\n",
              "");
  const Pipeline without = from_yaml_string(bare, "p.yaml");
  EXPECT_EQ(with.fingerprint(), without.fingerprint());
  EXPECT_EQ(with.canonical(), without.canonical());
  for (const auto& [k, v] : with.canonical()) {
    EXPECT_EQ(k.find("cache"), std::string::npos) << k;
    EXPECT_EQ(k.find("remote"), std::string::npos) << k;
  }
}

TEST(RemoteOptions, AnUnknownSubKeyIsAnErrorNamingItsLineAndKey) {
  const ConfigError e = error_of(replace(kPipeline, "{dir: /scratch/c,", "{dri: /scratch/c,"));
  EXPECT_EQ(e.key(), "source.cache.dri");
  EXPECT_EQ(std::string(e.what()),
            "p.yaml:5:11: source.cache.dri: unknown parameter 'dri' of records source's cache "
            "(known: dir, limit); did you mean 'dir'?");
  const ConfigError r = error_of(replace(kPipeline, "attempts: 3", "retries: 3"));
  EXPECT_EQ(r.key(), "source.remote.retries");
  EXPECT_EQ(std::string(r.what()),
            "p.yaml:7:12: source.remote.retries: unknown parameter 'retries' of records source's "
            "remote (known: endpoint, region, profile, anonymous, ca_bundle, attempts, timeout, "
            "backoff, connections, rate, listing_max_age)");
}

TEST(RemoteOptions, SubValuesAreCheckedByTheirRowsAtTheirPlace) {
  const ConfigError limit = error_of(replace(kPipeline, "limit: 1GiB", "limit: lots"));
  EXPECT_EQ(limit.key(), "source.cache.limit");
  EXPECT_EQ(std::string(limit.what()),
            "p.yaml:5:35: source.cache.limit: must be a byte size (like 20GiB, 500MB or 1048576), "
            "not 'lots'");
  const ConfigError zero = error_of(replace(kPipeline, "attempts: 3", "attempts: 0"));
  EXPECT_EQ(zero.key(), "source.remote.attempts");
  EXPECT_NE(std::string(zero.what()).find("0 is out of range (must be between 1 and 1000)"),
            std::string::npos)
      << zero.what();
  const ConfigError group = error_of(replace(kPipeline, "{dir: /scratch/c, limit: 1GiB}", "big"));
  EXPECT_EQ(group.key(), "source.cache");
  EXPECT_EQ(std::string(group.what()),
            "p.yaml:5:10: source.cache: expected a map of dir, limit, got 'big'");
  // A secret cannot be written into the endpoint, and the message does not repeat it.
  const ConfigError secret =
      error_of(replace(kPipeline, "http://127.0.0.1:9000", "http://AKIA:hunter2@127.0.0.1:9000"));
  EXPECT_EQ(secret.key(), "source.remote.endpoint");
  EXPECT_EQ(std::string(secret.what()).find("hunter2"), std::string::npos) << secret.what();
  EXPECT_NE(std::string(secret.what()).find("must not hold user info"), std::string::npos);
}

TEST(RemoteOptions, TheCppBuilderRunsTheSameChecks) {
  RecordsOptions o{.paths = {"s3://b/x.bin"}, .record_bytes = 8};
  o.cache.limit = "0";
  try {
    validate_fields(o, "records");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "records.cache.limit");
    EXPECT_EQ(std::string(e.what()), "records.cache.limit must be more than 0 bytes");
  }
  o.cache.limit = "2MiB";
  o.remote.connections = 0;
  EXPECT_THROW(validate_fields(o, "records"), ConfigError);
  o.remote.connections = 2;
  EXPECT_NO_THROW(validate_fields(o, "records"));
}

TEST(RemoteOptions, TheSchemaListsEachGroupsKeys) {
  const auto& def = records_node();
  auto row = std::find_if(def.params.begin(), def.params.end(),
                          [](const ParamSchema& p) { return p.name == "cache"; });
  ASSERT_NE(row, def.params.end());
  EXPECT_EQ(row->type, ParamType::kMap);
  EXPECT_TRUE(row->free);
  ASSERT_EQ(row->fields.size(), 2u);
  EXPECT_EQ(row->fields[0].name, "dir");
  EXPECT_EQ(row->fields[1].name, "limit");
  const std::string text = describe_params(def.params, "  ");
  EXPECT_NE(text.find("    cache.limit (a string, default: the job's cache_limit"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("    remote.endpoint (a string"), std::string::npos) << text;
  // Every file source that reads URLs has both groups; each is declared once.
  for (const NodeDef* d : {&records_node(), &lines_node(), &tar_node()}) {
    int groups = 0;
    for (const auto& p : d->params) groups += p.type == ParamType::kMap;
    EXPECT_EQ(groups, 2) << d->type;
  }
}

TEST(RemoteOptions, CacheSettingsSourceOverJobOverEnvironment) {
  ScopedEnv dir("FLOWSTATE_CACHE_DIR", "/env/cache");
  ScopedEnv limit("FLOWSTATE_CACHE_LIMIT", "3MiB");
  SourceRemote source{.node = "records", .base_dir = "/project"};
  {
    const CacheSettings s = resolve_cache_settings(nullptr);  // no source, no job
    EXPECT_EQ(s.dir, "/env/cache");
    EXPECT_EQ(s.limit, 3u << 20);
    EXPECT_EQ(s.limit_key, "FLOWSTATE_CACHE_LIMIT");
  }
  ListingScope job({.cache_dir = "/job/cache", .cache_limit = 5u << 20});
  {
    const CacheSettings s = resolve_cache_settings(&source);  // the source sets nothing
    EXPECT_EQ(s.dir, "/job/cache");
    EXPECT_EQ(s.limit, 5u << 20);
    EXPECT_EQ(s.limit_key, "cache_limit");
  }
  source.cache.dir = "cache";  // relative: to the YAML file's directory
  source.cache.limit = "7MiB";
  {
    const CacheSettings s = resolve_cache_settings(&source);
    EXPECT_EQ(s.dir, "/project/cache");
    EXPECT_EQ(s.limit, 7u << 20);
    EXPECT_EQ(s.limit_key, "records.cache.limit");
  }
  {
    // Without a job default the environment is under the source's option.
    ListingScope bare({});
    source.cache.dir.reset();
    const CacheSettings s = resolve_cache_settings(&source);
    EXPECT_EQ(s.dir, "/env/cache");
    EXPECT_EQ(s.limit, 7u << 20);
  }
  {
    // A built-in default when nothing is set; a malformed variable is not read when the
    // source sets the limit.
    ScopedEnv no_dir("FLOWSTATE_CACHE_DIR", nullptr);
    ScopedEnv bad("FLOWSTATE_CACHE_LIMIT", "lots");
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    ListingScope bare({});
    const CacheSettings s = resolve_cache_settings(&source);
    EXPECT_EQ(s.dir, "/xdg/flowstate");
    EXPECT_EQ(s.limit, 7u << 20);
    source.cache.limit.reset();
    EXPECT_THROW(resolve_cache_settings(&source), ConfigError);
  }
}

TEST(RemoteOptions, RemoteSettingsSourceOverEnvironmentAndAProfileOverEnvironmentKeys) {
  TempDir dir;
  std::ofstream(dir / "credentials") << "[lab]\naws_access_key_id = LABKEY\n"
                                        "aws_secret_access_key = LABSECRET\n";
  std::ofstream(dir / "config") << "[profile lab]\nregion = eu-north-1\n";
  ScopedEnv a("AWS_SHARED_CREDENTIALS_FILE", (dir / "credentials").c_str());
  ScopedEnv b("AWS_CONFIG_FILE", (dir / "config").c_str());
  ScopedEnv k("AWS_ACCESS_KEY_ID", "ENVKEY");
  ScopedEnv s("AWS_SECRET_ACCESS_KEY", "ENVSECRET");
  ScopedEnv t("AWS_SESSION_TOKEN", "ENVTOKEN");
  ScopedEnv p("AWS_PROFILE", nullptr);
  ScopedEnv r("AWS_REGION", nullptr);
  ScopedEnv r2("AWS_DEFAULT_REGION", nullptr);
  ScopedEnv e("AWS_ENDPOINT_URL", "http://127.0.0.1:1");
  ScopedEnv e2("AWS_ENDPOINT_URL_S3", nullptr);
  ScopedEnv attempts("FLOWSTATE_REMOTE_ATTEMPTS", "9");
  ScopedEnv timeout("FLOWSTATE_REMOTE_TIMEOUT", "7");
  SourceRemote source{.node = "tar", .base_dir = "/project"};
  {
    const RemoteSettings env = resolve_remote_settings(&source);  // nothing set: the env's
    EXPECT_EQ(env.access_key, "ENVKEY");
    EXPECT_EQ(env.endpoint, "http://127.0.0.1:1");
    EXPECT_EQ(env.attempts, 9);
    EXPECT_EQ(env.timeout, std::chrono::milliseconds(7000));
    EXPECT_EQ(env.region, "us-east-1");
  }
  source.remote.endpoint = "http://127.0.0.1:2";
  source.remote.profile = "lab";
  source.remote.attempts = 2;
  source.remote.timeout = 0.25;
  source.remote.backoff = 0;
  source.remote.connections = 3;
  source.remote.rate = 50;
  source.remote.ca_bundle = "certs/ca.pem";
  {
    const RemoteSettings o = resolve_remote_settings(&source);
    EXPECT_EQ(o.access_key, "LABKEY");  // the named profile's keys, not the environment's
    EXPECT_EQ(o.secret_key, "LABSECRET");
    EXPECT_EQ(o.session_token, "");
    EXPECT_EQ(o.region, "eu-north-1");
    EXPECT_EQ(o.endpoint, "http://127.0.0.1:2");
    EXPECT_EQ(o.attempts, 2);
    EXPECT_EQ(o.timeout, std::chrono::milliseconds(250));
    EXPECT_EQ(o.backoff, std::chrono::milliseconds(0));
    EXPECT_EQ(o.connections, 3);
    EXPECT_EQ(o.rate, 50.0);
    EXPECT_EQ(o.ca_bundle, "/project/certs/ca.pem");
  }
  source.remote.region = "sa-east-1";
  source.remote.anonymous = true;
  {
    const RemoteSettings o = resolve_remote_settings(&source);
    EXPECT_EQ(o.region, "sa-east-1");
    EXPECT_FALSE(o.signs());
    EXPECT_EQ(o.access_key, "");
  }
}

}  // namespace
}  // namespace flowstate
