// One listing per job (nodes/sources/remote_listing.h) without a server: a saved listing is read
// instead of listing (no request), holds no secret and no fetch URL, is refused naming its file
// when it is not one; under a coordinator rank 0 alone reads or lists and every rank gets its
// listing or its error; a Loader's memo lists once. And a remote object's ETag in the data
// identity: kept through the state's archive, a changed ETag refused naming the object, an
// identity without one (written before) compared as before. And the object facts of `tar` and
// `lines` (job_object_facts): computed once, saved beside the listings and read back without
// computing, an entry counting only for the same URL, size and ETag, rank 0's facts on every
// rank, a file that is not facts refused naming it. And the request-rate bound. Listing
// against s3rver and nginx, counted in their logs, is tests/python/test_remote.py.
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/core/state.h"
#include "flowstate/nodes/sources/file_source.h"
#include "flowstate/nodes/sources/remote_listing.h"
#include "flowstate/nodes/sources/remote_store.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

/// Settings whose requests fail at once (nothing listens on port 9 of 127.0.0.1).
RemoteSettings unreachable_store() {
  RemoteSettings s;
  s.endpoint = "http://127.0.0.1:9";
  s.attempts = 1;
  s.timeout = std::chrono::milliseconds(500);
  s.backoff = std::chrono::milliseconds(1);
  return s;
}

std::vector<RemoteObject> two_objects() {
  return {{.url = "s3://bucket/data/part-0.bin", .s3 = true, .size = 100, .etag = "\"e0\""},
          {.url = "s3://bucket/data/part-1.bin", .s3 = true, .size = 200, .etag = "\"e1\""}};
}

void write_text(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::uint64_t requests() {
  const auto c = remote_request_counts();
  return c.lists + c.heads + c.gets;
}

TEST(RemoteListing, AnS3ListingRoundTripsWithItsFetchUrlsMadeFromTheSettingsInForce) {
  const std::string pattern = "s3://bucket/data/part-*.bin";
  const std::string text = encode_listing(pattern, two_objects());
  EXPECT_EQ(text.find("127.0.0.1"), std::string::npos) << "no fetch URL is saved: " << text;
  RemoteSettings s = unreachable_store();
  s.endpoint = "http://store.example:9000/";
  const auto back = decode_listing(text, pattern, s, "f.json");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].url, "s3://bucket/data/part-1.bin");
  EXPECT_EQ(back[1].fetch_url, "http://store.example:9000/bucket/data/part-1.bin");
  EXPECT_TRUE(back[1].s3);
  EXPECT_EQ(back[1].size, 200u);
  EXPECT_EQ(back[1].etag, "\"e1\"");
  EXPECT_EQ(back[0].fetch_url, s3_fetch_url(back[0].url, s));
}

TEST(RemoteListing, AnHttpListingKeepsNoSecretAndGetsItsFetchUrlsFromThePattern) {
  // A presigned query and user info are secrets: the saved listing holds neither.
  const std::string pattern = "https://user:pw@host.example/d/shard-{0..1}.tar?X-Amz-Signature=S";
  std::vector<RemoteObject> objects;
  for (const auto& u : expand_braces(pattern))
    objects.push_back({.url = redact_url(u), .fetch_url = u, .size = 10, .etag = "\"x\""});
  const std::string text = encode_listing(pattern, objects);
  for (const char* secret : {"pw", "Signature", "user"})
    EXPECT_EQ(text.find(secret), std::string::npos) << secret << " in " << text;
  const auto back = decode_listing(text, pattern, unreachable_store(), "f.json");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].url, "https://host.example/d/shard-1.tar");
  EXPECT_EQ(back[1].fetch_url, objects[1].fetch_url);
  EXPECT_FALSE(back[1].s3);
}

TEST(RemoteListing, WhatIsNotASavedListingOfThePatternIsACheckpointErrorNamingTheFile) {
  const std::string pattern = "s3://bucket/data/part-*.bin";
  const RemoteSettings s = unreachable_store();
  const std::string good = encode_listing(pattern, two_objects());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "is not JSON"},
      {R"({"format": 7})", "is not a listing of format 1"},
      {encode_listing("s3://bucket/other/*", two_objects()), "lists another pattern"},
      {R"({"format": 1, "pattern": "s3://bucket/data/part-*.bin", "objects": []})",
       "holds no objects"},
      {R"({"format": 1, "pattern": "s3://bucket/data/part-*.bin", "objects": [{"url": 1}]})",
       "has a malformed object (number 0)"},
      {encode_listing(pattern, {{.url = "s3://elsewhere/x", .s3 = true, .size = 1}}),
       "not in the bucket"},
  };
  for (const auto& [text, why] : cases) {
    try {
      decode_listing(text, pattern, s, "ck/listings/abc.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const CheckpointError& e) {
      EXPECT_EQ(e.file(), "ck/listings/abc.json");
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("remove it to list the objects again"),
                std::string::npos);
    }
  }
  // An HTTP listing must be the pattern's expansion, in order.
  const std::string http = "https://h.example/s-{0..2}.tar";
  EXPECT_THROW(
      decode_listing(encode_listing(http, {{.url = "https://h.example/s-0.tar"}}), http, s, "f"),
      CheckpointError);
  EXPECT_NO_THROW(decode_listing(good, pattern, s, "f"));
}

TEST(RemoteListing, AResumeReadsTheSavedListingWithoutARequestAndAFreshOneLists) {
  TempDir dir;
  const std::string pattern = "s3://bucket/data/part-*.bin";
  write_text(listing_file(dir.path(), pattern), encode_listing(pattern, two_objects()));
  EXPECT_EQ(listing_file(dir.path(), pattern).parent_path(), dir.path() / "listings");
  const RemoteSettings s = unreachable_store();
  const auto before = requests();
  {
    ListingScope scope({.dir = dir.path(), .reuse = true});
    const auto got = job_listing(pattern, s);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].etag, "\"e0\"");
  }
  EXPECT_EQ(requests(), before) << "the saved listing was read, nothing listed";
  // Without reuse (a resume that continues over a changed bucket) it lists: here, a
  // store that does not answer.
  const auto lists = remote_request_counts().lists;
  {
    ListingScope scope({.dir = dir.path(), .reuse = false});
    EXPECT_THROW(job_listing(pattern, s), DataError);
  }
  EXPECT_EQ(remote_request_counts().lists, lists + 1);
  // The saved listing is left as it was (nothing replaced it).
  EXPECT_EQ(read_text(listing_file(dir.path(), pattern)), encode_listing(pattern, two_objects()));
}

TEST(RemoteListing, ALoadersMemoListsOncePerPattern) {
  TempDir dir;
  const std::string pattern = "s3://bucket/data/part-*.bin";
  write_text(listing_file(dir.path(), pattern), encode_listing(pattern, two_objects()));
  auto memo = std::make_shared<ListingMemo>();
  ListingScope scope({.dir = dir.path(), .reuse = true, .memo = memo});
  const auto first = job_listing(pattern, unreachable_store());
  std::filesystem::remove_all(dir.path() / "listings");  // a second read would now list
  const auto before = requests();
  const auto second = job_listing(pattern, unreachable_store());
  EXPECT_EQ(requests(), before);
  ASSERT_EQ(second.size(), first.size());
  EXPECT_EQ(second[1].url, first[1].url);
  EXPECT_EQ(memo->listings.size(), 1u);
}

TEST(RemoteListing, UnderACoordinatorRankZeroAloneReadsAndEveryRankGetsItsListing) {
  TempDir dir;
  const std::string pattern = "s3://bucket/data/part-*.bin";
  write_text(listing_file(dir.path(), pattern), encode_listing(pattern, two_objects()));
  testing::ThreadGroup group(3);
  std::vector<std::vector<RemoteObject>> got(3);
  const auto before = requests();
  const auto errors = group.run([&](std::uint64_t rank, std::shared_ptr<Coordinator> c) {
    // Only rank 0 is given the directory: the others cannot have read it themselves.
    ListingScope scope(
        {.dir = rank == 0 ? dir.path() : std::filesystem::path(), .coordinator = c.get()});
    got[rank] = job_listing(pattern, unreachable_store());
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(requests(), before);
  for (std::size_t r = 0; r < 3; ++r) {
    ASSERT_EQ(got[r].size(), 2u) << "rank " << r;
    EXPECT_EQ(got[r][1].url, "s3://bucket/data/part-1.bin");
    EXPECT_EQ(got[r][1].etag, "\"e1\"");
    EXPECT_EQ(got[r][1].fetch_url, got[0][1].fetch_url);
  }
}

TEST(RemoteListing, RankZerosErrorIsEveryRanksError) {
  TempDir dir;
  const std::string pattern = "s3://bucket/data/part-*.bin";
  write_text(listing_file(dir.path(), pattern), "garbage");
  testing::ThreadGroup group(2);
  const auto errors = group.run([&](std::uint64_t rank, std::shared_ptr<Coordinator> c) {
    ListingScope scope(
        {.dir = rank == 0 ? dir.path() : std::filesystem::path(), .coordinator = c.get()});
    try {
      job_listing(pattern, unreachable_store());
    } catch (const CheckpointError&) {
      throw;  // the type crosses the ranks
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("not a CheckpointError: ") + e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("is not JSON"), std::string::npos) << e;
    EXPECT_NE(e.find(listing_file(dir.path(), pattern).string()), std::string::npos) << e;
  }
  // A listing rank 0 could not make (nothing answers) is a DataError on every rank.
  std::filesystem::remove_all(dir.path() / "listings");
  const auto data_errors = group.run([&](std::uint64_t rank, std::shared_ptr<Coordinator> c) {
    ListingScope scope(
        {.dir = rank == 0 ? dir.path() : std::filesystem::path(), .coordinator = c.get()});
    EXPECT_THROW(job_listing(pattern, unreachable_store()), DataError) << "rank " << rank;
  });
  for (const auto& e : data_errors) EXPECT_EQ(e, "");
}

DataIdentity remote_identity(const std::string& etag) {
  FileIdentity f{.name = "s3://bucket/data/part-0.bin", .bytes = 100, .items = 4};
  f.blocks = {1, 2, 3, 4};
  if (!etag.empty()) f.etag = etag;
  return {.files = {f}};
}

TEST(RemoteIdentity, TheETagIsKeptAndAChangedOneIsRefusedNamingTheObject) {
  const DataIdentity saved = remote_identity("\"v1\"");
  std::ostringstream os(std::ios::binary);
  {
    OutArchive ar(os);
    ar(saved);
  }
  DataIdentity loaded;
  {
    std::istringstream is(os.str(), std::ios::binary);
    InArchive ar(is);
    ar(loaded);
  }
  ASSERT_EQ(loaded.files.size(), 1u);
  EXPECT_EQ(loaded.files[0].etag, std::optional<std::string>("\"v1\""));
  EXPECT_TRUE(identity_differences(loaded, saved, "records").empty());
  // Same size, same sampled blocks, another ETag: another object.
  const auto diffs = identity_differences(saved, remote_identity("\"v2\""), "records");
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_EQ(diffs[0],
            "s3://bucket/data/part-0.bin: the object changed (ETag \"v1\" in checkpoint, \"v2\" "
            "now)");
  // An identity written before ETags were recorded compares as before (size, blocks).
  EXPECT_TRUE(
      identity_differences(remote_identity(""), remote_identity("\"v2\""), "records").empty());
  EXPECT_FALSE(loaded.files[0].etag == std::nullopt);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(RemoteRate, RequestsOfAllConnectionsShareOneEvenSchedule) {
  // 4 connections, 5 requests each, at most 50 a second: the 20th starts >= 19/50 s after
  // the first.
  const auto t = std::chrono::steady_clock::now();
  for_each_connection(4, 4, [](std::size_t) {
    for (int k = 0; k < 5; ++k) wait_for_request_slot(50);
  });
  EXPECT_GE(seconds_since(t), 19.0 / 50 - 0.005);
  // Unbounded: no wait.
  const auto u = std::chrono::steady_clock::now();
  for (int k = 0; k < 1000; ++k) wait_for_request_slot(0);
  EXPECT_LT(seconds_since(u), 0.05);
}

TEST(RemoteRate, RetriesAreRequestsToo) {
  RemoteSettings s = unreachable_store();
  s.attempts = 5;
  s.rate = 20;
  ::usleep(100'000);  // the schedule is idle again after the test before
  const auto t = std::chrono::steady_clock::now();
  EXPECT_THROW(list_remote("s3://bucket/x/*", s), DataError);
  EXPECT_GE(seconds_since(t), 4.0 / 20 - 0.005);  // 5 attempts, refused at once each
}

TEST(RemoteRate, ReadFromTheEnvironment) {
  ::setenv("FLOWSTATE_REMOTE_RATE", "2.5", 1);
  EXPECT_EQ(RemoteSettings::from_environment().rate, 2.5);
  ::setenv("FLOWSTATE_REMOTE_RATE", "fast", 1);
  try {
    RemoteSettings::from_environment();
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "FLOWSTATE_REMOTE_RATE");
  }
  ::unsetenv("FLOWSTATE_REMOTE_RATE");
  EXPECT_EQ(RemoteSettings::from_environment().rate, 0);
}

std::vector<ObjectFacts> facts_of(const std::vector<std::size_t>& indices) {
  std::vector<ObjectFacts> out;
  for (auto i : indices)
    out.push_back({.items = 10 + i, .blocks = {i, i + 1, i + 2, ~std::uint64_t{0}}, .full = 7});
  return out;
}

TEST(ObjectFacts, ComputedOnceSavedAndReadBackOnlyForTheSameObject) {
  TempDir dir;
  const auto objects = two_objects();
  std::vector<std::size_t> asked;
  auto compute = [&](const std::vector<std::size_t>& missing) {
    asked.insert(asked.end(), missing.begin(), missing.end());
    return facts_of(missing);
  };
  {
    ListingScope scope({.dir = dir.path()});
    const auto got = job_object_facts("tar/1 x", objects, compute);
    EXPECT_EQ(asked, (std::vector<std::size_t>{0, 1}));
    EXPECT_EQ(got, facts_of({0, 1}));
  }
  EXPECT_TRUE(std::filesystem::exists(facts_file(dir.path(), "tar/1 x")));
  asked.clear();
  {
    // Another build of the job (a resume): read back, nothing computed; a changed object
    // (another ETag) and another kind are computed again.
    ListingScope scope({.dir = dir.path()});
    EXPECT_EQ(job_object_facts("tar/1 x", objects, compute), facts_of({0, 1}));
    EXPECT_TRUE(asked.empty());
    auto changed = objects;
    changed[1].etag = "\"other\"";
    EXPECT_EQ(job_object_facts("tar/1 x", changed, compute)[1], facts_of({1})[0]);
    EXPECT_EQ(asked, (std::vector<std::size_t>{1}));
    job_object_facts("lines/2", objects, compute);
    EXPECT_EQ(asked.size(), 3u);
  }
  // Both versions of object 1 are kept: the first one is still read back.
  asked.clear();
  {
    ListingScope scope({.dir = dir.path()});
    job_object_facts("tar/1 x", objects, compute);
    EXPECT_TRUE(asked.empty());
  }
  // Outside a scope nothing is saved or read: computed each time.
  job_object_facts("tar/1 x", objects, compute);
  EXPECT_EQ(asked.size(), 2u);
  // A file that is not facts of the kind is refused, naming it.
  write_text(facts_file(dir.path(), "tar/1 x"), "{\"format\": 1, \"kind\": \"other\"}");
  ListingScope scope({.dir = dir.path()});
  try {
    job_object_facts("tar/1 x", objects, compute);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(facts_file(dir.path(), "tar/1 x").string()),
              std::string::npos)
        << e.what();
  }
}

TEST(ObjectFacts, ALoadersMemoAndRankZerosFactsOnEveryRank) {
  TempDir dir;
  const auto objects = two_objects();
  testing::ThreadGroup group(3);
  std::vector<std::vector<ObjectFacts>> got(3);
  std::atomic<int> computed{0};
  const auto errors = group.run([&](std::uint64_t rank, std::shared_ptr<Coordinator> c) {
    auto memo = std::make_shared<ListingMemo>();
    ListingScope scope({.dir = rank == 0 ? dir.path() : std::filesystem::path(),
                        .coordinator = c.get(),
                        .memo = memo});
    got[rank] = job_object_facts("k", objects, [&](const std::vector<std::size_t>& missing) {
      ++computed;
      return facts_of(missing);
    });
    // A rebuild: from the memo, no collective, nothing computed.
    EXPECT_EQ(job_object_facts("k", objects,
                               [&](const std::vector<std::size_t>&) -> std::vector<ObjectFacts> {
                                 throw std::runtime_error("computed again");
                               }),
              got[rank]);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(computed.load(), 1);  // rank 0 alone
  for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(got[r], facts_of({0, 1})) << "rank " << r;
}

}  // namespace
}  // namespace flowstate
