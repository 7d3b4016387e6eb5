// URL parsing, redaction and S3 target resolution (src/io/remote/target.cc). The transfers
// themselves are tested against real servers in tests/interop/test_remote.py.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ckpt/error.h"
#include "ckpt/remote.h"
#include "io/remote/target.h"

namespace ckpt {
namespace {

TEST(Remote, IsUrl) {
  EXPECT_TRUE(is_url("http://h/x"));
  EXPECT_TRUE(is_url("HTTPS://h/x"));
  EXPECT_TRUE(is_url("s3://b/k"));
  EXPECT_FALSE(is_url("/tmp/http://x"));
  EXPECT_FALSE(is_url("model.pt"));
  EXPECT_FALSE(is_url("file:///x"));
}

TEST(Remote, RedactUrl) {
  EXPECT_EQ(redact_url("http://u:secret@h:8080/a/b.pt?X-Amz-Signature=abc"),
            "http://h:8080/a/b.pt?...");
  EXPECT_EQ(redact_url("https://h/a@b.pt"), "https://h/a@b.pt");
  EXPECT_EQ(redact_url("s3://bucket/key.pt"), "s3://bucket/key.pt");
  EXPECT_EQ(redact_url("https://u:p@h/k.pt#frag"), "https://h/k.pt?...");
  // A path is no URL: shown as given.
  EXPECT_EQ(redact_url("dir/a?b#c.pt"), "dir/a?b#c.pt");
}

TEST(Remote, EncodeKey) {
  EXPECT_EQ(internal::s3_encode_key("a/b c(1)~+.pt"), "a/b%20c%281%29~%2B.pt");
}

struct EnvGuard {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const char* k, const char* v) {
    const char* old = std::getenv(k);
    saved.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
    if (v)
      ::setenv(k, v, 1);
    else
      ::unsetenv(k);
  }
  ~EnvGuard() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it)
      if (it->second)
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        ::unsetenv(it->first.c_str());
  }
};

TEST(Remote, S3TargetFromEnvironmentAndProfile) {
  EnvGuard env;
  for (const char* k :
       {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
        "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"})
    env.set(k, nullptr);
  const auto dir = std::filesystem::temp_directory_path() / "ckpt-remote-unit";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "credentials")
      << "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
         "[p]\naws_access_key_id = P\naws_secret_access_key = PS\n";
  std::ofstream(dir / "config") << "[profile p]\nregion = eu-west-3\nendpoint_url = http://e:1/\n";
  env.set("AWS_SHARED_CREDENTIALS_FILE", (dir / "credentials").c_str());
  env.set("AWS_CONFIG_FILE", (dir / "config").c_str());

  // The default profile, AWS's own endpoint (virtual-hosted).
  internal::Target t = internal::resolve_target("s3://bkt/a b.pt", {});
  EXPECT_EQ(t.url, "https://bkt.s3.us-east-1.amazonaws.com/a%20b.pt");
  EXPECT_TRUE(t.sign);
  EXPECT_EQ(t.key_id, "D");
  // A named profile: its region and endpoint (path-style).
  env.set("AWS_PROFILE", "p");
  t = internal::resolve_target("s3://bkt/k", {});
  EXPECT_EQ(t.url, "http://e:1/bkt/k");
  EXPECT_EQ(t.sigv4, "aws:amz:eu-west-3:s3");
  EXPECT_EQ(t.key_id, "P");
  // The environment wins over the profile; options win over both.
  env.set("AWS_ACCESS_KEY_ID", "E");
  env.set("AWS_SECRET_ACCESS_KEY", "ES");
  env.set("AWS_ENDPOINT_URL_S3", "http://s3e:2");
  t = internal::resolve_target("s3://bkt/k", {});
  EXPECT_EQ(t.key_id, "E");
  EXPECT_EQ(t.url, "http://s3e:2/bkt/k");
  RemoteOptions o;
  o.unsigned_requests = true;
  EXPECT_FALSE(internal::resolve_target("s3://bkt/k", o).sign);
  std::filesystem::remove_all(dir);

  EXPECT_THROW(internal::resolve_target("s3://bucket", {}), Error);
  EXPECT_THROW(internal::resolve_target("s3:///key", {}), Error);
  EXPECT_THROW(internal::resolve_target("ftp://h/x", {}), Error);
}

TEST(Remote, UnreachableServerIsIoErrorNamingTheUrl) {
  RemoteOptions o;
  o.retries = 1;
  o.retry_base_s = 0.01;
  o.connect_timeout_s = 2;
  try {
    open_url_source("http://user:pw@127.0.0.1:1/x.pt", o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_EQ(e.source(), "http://127.0.0.1:1/x.pt");
    EXPECT_EQ(std::string(e.what()).find("pw"), std::string::npos);
  }
}

}  // namespace
}  // namespace ckpt
