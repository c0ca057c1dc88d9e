// Remote sources' units: brace ranges, client-side globs, credential-free URLs, the AWS
// settings from the environment and profile files, byte sizes, and the object cache's rules
// (a limit below what a source pins is a ConfigError before any request; eviction takes the
// least recently used copy no one pins and never a file that is not a copy). Downloads through
// real servers and faults are tests/python/test_remote.py.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_store.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::fast_failing_remote;
using testing::TempDir;
using testing::unreachable_object;

/// Sets an environment variable for a scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value.c_str(), 1);
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

TEST(RemoteUrl, RecognisesRemoteSchemesOnly) {
  EXPECT_TRUE(is_remote_url("s3://b/k"));
  EXPECT_TRUE(is_remote_url("https://h/p"));
  EXPECT_TRUE(is_remote_url("http://h/p"));
  EXPECT_FALSE(is_remote_url("data/s3://x"));
  EXPECT_FALSE(is_remote_url("/data/x.bin"));
  EXPECT_FALSE(is_remote_url("file:///x"));
}

TEST(RemoteUrl, BraceRangesExpandZeroPaddedInOrder) {
  EXPECT_EQ(expand_braces("https://h/shard-{0000..0003}.tar"),
            (std::vector<std::string>{"https://h/shard-0000.tar", "https://h/shard-0001.tar",
                                      "https://h/shard-0002.tar", "https://h/shard-0003.tar"}));
  EXPECT_EQ(expand_braces("x{8..11}"), (std::vector<std::string>{"x8", "x9", "x10", "x11"}));
  EXPECT_EQ(expand_braces("x{3..1}"), (std::vector<std::string>{"x3", "x2", "x1"}));
  EXPECT_EQ(expand_braces("{a,b}-{0..1}"), (std::vector<std::string>{"a-0", "a-1", "b-0", "b-1"}));
  EXPECT_EQ(expand_braces("plain"), (std::vector<std::string>{"plain"}));
  EXPECT_EQ(expand_braces("s-{000..127}").size(), 128u);
  EXPECT_EQ(expand_braces("s-{000..127}").back(), "s-127");
}

TEST(RemoteUrl, MalformedBracesAreConfigErrorsWithoutSecrets) {
  for (const char* bad : {"https://u:secret@h/a{0..", "https://u:secret@h/a}", "https://h/{}",
                          "https://h/{a..b}", "https://h/{0..99999999999}", "https://h/{a{b}}"}) {
    try {
      expand_braces(bad);
      ADD_FAILURE() << bad << ": no error";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "paths");
      EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
    }
  }
}

TEST(RemoteUrl, GlobsMatchKeysWithoutCrossingSlashes) {
  EXPECT_TRUE(glob_matches("data/train-*.tar", "data/train-0001.tar"));
  EXPECT_FALSE(glob_matches("data/train-*.tar", "data/train-a/b.tar"));
  EXPECT_FALSE(glob_matches("data/train-*.tar", "data/val-0001.tar"));
  EXPECT_TRUE(glob_matches("data/part-0000[0-3].bin", "data/part-00002.bin"));
  EXPECT_TRUE(glob_matches("data/?.bin", "data/a.bin"));
}

TEST(RemoteUrl, RedactionDropsUserInfoAndQuery) {
  EXPECT_EQ(redact_url("https://user:pw@host:8443/a/b?X-Amz-Signature=s#f"),
            "https://host:8443/a/b");
  EXPECT_EQ(redact_url("s3://bucket/key"), "s3://bucket/key");
  EXPECT_EQ(redact_url("http://h/a@b"), "http://h/a@b");  // an '@' in the path stays
}

TEST(RemoteSettings, EnvironmentFirstThenTheProfileFiles) {
  TempDir dir;
  std::ofstream(dir / "credentials") << "[default]\naws_access_key_id = DEFKEY\n"
                                        "aws_secret_access_key = DEFSECRET\n\n"
                                        "[work]\naws_access_key_id=WORKKEY\n"
                                        "aws_secret_access_key=WORKSECRET\n"
                                        "aws_session_token=WORKTOKEN\n";
  std::ofstream(dir / "config") << "[profile work]\nregion = eu-west-3\n"
                                   "endpoint_url = http://127.0.0.1:9000\n";
  ScopedEnv a("AWS_SHARED_CREDENTIALS_FILE", dir / "credentials");
  ScopedEnv b("AWS_CONFIG_FILE", dir / "config");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::unsetenv("AWS_SESSION_TOKEN");
  ::unsetenv("AWS_REGION");
  ::unsetenv("AWS_DEFAULT_REGION");
  ::unsetenv("AWS_ENDPOINT_URL");
  ::unsetenv("AWS_ENDPOINT_URL_S3");
  {
    ScopedEnv p("AWS_PROFILE", "work");
    const auto s = RemoteSettings::from_environment();
    EXPECT_EQ(s.access_key, "WORKKEY");
    EXPECT_EQ(s.secret_key, "WORKSECRET");
    EXPECT_EQ(s.session_token, "WORKTOKEN");
    EXPECT_EQ(s.region, "eu-west-3");
    EXPECT_EQ(s.endpoint, "http://127.0.0.1:9000");
    EXPECT_TRUE(s.signs());
  }
  {
    ScopedEnv p("AWS_PROFILE", "default");
    ScopedEnv r("AWS_REGION", "ap-south-1");
    ScopedEnv e("AWS_ENDPOINT_URL", "http://127.0.0.1:1");
    const auto s = RemoteSettings::from_environment();
    EXPECT_EQ(s.access_key, "DEFKEY");
    EXPECT_EQ(s.region, "ap-south-1");
    EXPECT_EQ(s.endpoint, "http://127.0.0.1:1");
  }
  {
    ScopedEnv k("AWS_ACCESS_KEY_ID", "ENVKEY");
    ScopedEnv s2("AWS_SECRET_ACCESS_KEY", "ENVSECRET");
    EXPECT_EQ(RemoteSettings::from_environment().access_key, "ENVKEY");
  }
  {
    ScopedEnv t("FLOWSTATE_REMOTE_TIMEOUT", "soon");
    EXPECT_THROW(RemoteSettings::from_environment(), ConfigError);
  }
}

TEST(ObjectCache, ByteSizes) {
  EXPECT_EQ(parse_byte_size("20GiB", "k"), 20ull << 30);
  EXPECT_EQ(parse_byte_size("500MB", "k"), 500'000'000ull);
  EXPECT_EQ(parse_byte_size("1048576", "k"), 1048576ull);
  EXPECT_EQ(parse_byte_size("3 KiB", "k"), 3072ull);
  for (const char* bad : {"", "GiB", "12 parsecs", "-1", "99999999999999999999TiB"})
    EXPECT_THROW(parse_byte_size(bad, "k"), ConfigError) << bad;
}

/// An object at a port nothing listens on: a download fails at once, so a test sees the
/// cache's decisions before any byte moves.
/// Puts a whole copy of `o` in the cache as a finished download would, last used at `age`
/// seconds ago.
void seed_copy(const TempDir& dir, const RemoteObject& o, int age) {
  const std::string path = dir / ("objects/" + cache_key(o) + ".obj");
  std::ofstream(path, std::ios::binary) << std::string(o.size, 'x');
  const auto t = std::filesystem::file_time_type::clock::now() - std::chrono::seconds(age);
  std::filesystem::last_write_time(path, t);
}

TEST(ObjectCache, ALimitBelowWhatASourcePinsIsAConfigErrorBeforeAnyRequest) {
  TempDir dir;
  ObjectCache cache({.dir = dir.path(), .limit = 1000});
  try {
    cache.fetch({unreachable_object("a", 600), unreachable_object("b", 600)},
                fast_failing_remote());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "FLOWSTATE_CACHE_LIMIT");
    EXPECT_NE(std::string(e.what()).find("1000 bytes is smaller than the 1200 bytes of the 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(ObjectCache, CachedCopiesAreHitsWithoutARequest) {
  TempDir dir;
  ObjectCache cache({.dir = dir.path(), .limit = 10000});
  const auto a = unreachable_object("a", 100), b = unreachable_object("b", 200);
  seed_copy(dir, a, 10);
  seed_copy(dir, b, 10);
  const auto before = remote_request_counts().gets;
  const auto pins = cache.fetch({a, b}, fast_failing_remote());
  ASSERT_EQ(pins.size(), 2u);
  EXPECT_EQ(std::filesystem::file_size(pins[1]->path()), 200u);
  EXPECT_EQ(remote_request_counts().gets, before);
  EXPECT_EQ(cache.usage(), 300u);
}

TEST(ObjectCache, ACopyOfTheWrongSizeIsNotAHit) {
  TempDir dir;
  ObjectCache cache({.dir = dir.path(), .limit = 10000});
  auto a = unreachable_object("a", 100);
  seed_copy(dir, a, 10);
  a.size = 101;  // the listing says otherwise: another key, and a download (which fails)
  EXPECT_THROW(cache.fetch({a}, fast_failing_remote()), DataError);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() / "partial"));
}

TEST(ObjectCache, EvictionTakesTheOldestUnpinnedCopyAndNeverAForeignFile) {
  TempDir dir;
  ObjectCache cache({.dir = dir.path(), .limit = 1000});
  const auto oldest = unreachable_object("oldest", 300), pinned = unreachable_object("pinned", 300),
             newer = unreachable_object("newer", 300);
  seed_copy(dir, oldest, 300);
  seed_copy(dir, pinned, 600);  // older still, but a reader holds it
  seed_copy(dir, newer, 100);
  std::ofstream(dir / "objects/notes.txt") << std::string(5000, 'n');  // not a copy
  std::ofstream(dir / "my-data.bin") << "keep";
  const auto held = cache.fetch({pinned}, fast_failing_remote());
  // Needs 300 more bytes: 900 used, limit 1000, so one copy goes — the oldest unpinned one.
  EXPECT_THROW(cache.fetch({unreachable_object("new", 300)}, fast_failing_remote()), DataError);
  const auto obj = [&](const RemoteObject& o) {
    return std::filesystem::exists(dir / ("objects/" + cache_key(o) + ".obj"));
  };
  EXPECT_FALSE(obj(oldest));
  EXPECT_TRUE(obj(pinned));
  EXPECT_TRUE(obj(newer));
  EXPECT_TRUE(std::filesystem::exists(dir / "objects/notes.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir / "my-data.bin"));
  EXPECT_EQ(cache.usage(), 600u);  // the foreign files are not counted
}

TEST(ObjectCache, ADeadWritersPartialFileIsRemovedAndALiveOnesKept) {
  TempDir dir;
  ObjectCache cache({.dir = dir.path(), .limit = 1000});
  // pid 2^22+1 is above Linux's pid_max limit: no process has it.
  const std::string dead = dir / "partial/0123456789abcdef0123456789abcdef.4194305.0.part";
  const std::string live =
      dir / ("partial/0123456789abcdef0123456789abcdee." + std::to_string(::getpid()) + ".9.part");
  std::ofstream(dead) << std::string(400, 'p');
  std::ofstream(live) << std::string(100, 'p');
  EXPECT_EQ(cache.usage(), 500u);
  EXPECT_THROW(cache.fetch({unreachable_object("x", 100)}, fast_failing_remote()), DataError);
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(live));
}

TEST(ObjectCache, ADownloadErrorNamesTheUrlTheCauseAndTheAttempts) {
  TempDir dir;
  ObjectCache cache({.dir = dir.path(), .limit = 1000});
  auto s = fast_failing_remote();
  s.attempts = 3;
  s.backoff = std::chrono::milliseconds(1);
  try {
    cache.fetch({unreachable_object("x", 100)}, s);
    FAIL() << "no error";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot download 'https://example.invalid/x'"), std::string::npos) << m;
    EXPECT_NE(m.find("(after 3 attempts)"), std::string::npos) << m;
    EXPECT_EQ(e.file(), "https://example.invalid/x");
  }
}

}  // namespace
}  // namespace flowstate

namespace flowstate {
namespace {

TEST(RemoteConnections, EachIndexRunsOnceAndTheFirstErrorStopsTheRest) {
  for_each_connection(0, 8, [](std::size_t) { FAIL() << "no index to run"; });
  std::vector<std::atomic<int>> runs(100);
  for_each_connection(runs.size(), 4, [&](std::size_t i) { runs[i].fetch_add(1); });
  for (const auto& r : runs) EXPECT_EQ(r.load(), 1);
  std::atomic<int> calls{0};
  EXPECT_THROW(for_each_connection(1000, 1,
                                   [&](std::size_t i) {
                                     calls.fetch_add(1);
                                     if (i == 3) throw std::runtime_error("cut");
                                   }),
               std::runtime_error);
  EXPECT_EQ(calls.load(), 4);  // one connection: indexes 0..3, none after the error
}

}  // namespace
}  // namespace flowstate
