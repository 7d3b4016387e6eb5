// The temporaries registry (remove_temporaries_now, install_signal_cleanup) and FolderSink.
// remove_temporaries_now() ends a process's writing for good, so those tests run it in a forked
// child and look at what the child left.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/sink.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

bool any_temporary(const std::string& dir) {
  for (const auto& n : names_in(dir))
    if (n.find(".tmp-") != std::string::npos) return true;
  return false;
}

// Runs `child` in a forked process; returns its wait status. The child's exit status is what
// `child` returns (it must not throw out).
int in_child(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = child();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

void write_some(ByteSink& s) { s.write(std::string(100000, 'x')); }

TEST(Temporaries, RemoveNowRemovesLiveFileAndFolderTemporaries) {
  test::TempDir dir;
  const int status = in_child([&] {
    auto file = create_file_sink(dir.file("m.pt"));
    write_some(*file);
    auto folder = create_folder_sink(dir.file("a/b/npy"));
    auto inner = folder->create("t.npy");
    write_some(*inner);
    inner->commit();
    if (!any_temporary(dir.path()) || !any_temporary(dir.file("a/b"))) return 1;
    remove_temporaries_now();
    if (any_temporary(dir.path()) || any_temporary(dir.file("a/b"))) return 2;
    // The process is ending: no new temporary, and the writers at work fail at commit.
    Error e = test::capture_error([&] { create_file_sink(dir.file("n.pt")); });
    if (e.code() != ErrorCode::kIo) return 3;
    Error c = test::capture_error([&] { file->commit(); });
    if (c.code() != ErrorCode::kIo) return 4;
    remove_temporaries_now();  // a second call is harmless
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"a"}));
  EXPECT_TRUE(names_in(dir.file("a/b")).empty());
}

TEST(Temporaries, SignalCleanupRemovesThenDiesByTheSignal) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    test::TempDir dir;
    const int status = in_child([&] {
      install_signal_cleanup();
      auto file = create_file_sink(dir.file("m.safetensors"));
      write_some(*file);
      auto folder = create_folder_sink(dir.file("npy"));
      write_some(*folder->create("x.npy"));
      ::raise(sig);
      return 1;  // not reached
    });
    ASSERT_TRUE(WIFSIGNALED(status)) << sig;
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_TRUE(names_in(dir.path()).empty());
  }
}

TEST(Temporaries, SignalCleanupLeavesIgnoredSignalsIgnored) {
  test::TempDir dir;
  const int status = in_child([&] {
    ::signal(SIGHUP, SIG_IGN);  // nohup
    install_signal_cleanup();
    auto file = create_file_sink(dir.file("m.pt"));
    write_some(*file);
    ::raise(SIGHUP);
    file->commit();
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"m.pt"}));
}

TEST(Temporaries, MoreThanTheRegistryHoldsStillWrite) {
  test::TempDir dir;
  std::vector<std::unique_ptr<ByteSink>> sinks;
  for (int i = 0; i < 140; ++i) {
    sinks.push_back(create_file_sink(dir.file("f" + std::to_string(i)), {.fsync = false}));
    sinks.back()->write(std::string_view("data"));
  }
  for (auto& s : sinks) s->commit();
  sinks.clear();
  EXPECT_EQ(names_in(dir.path()).size(), 140u);
  EXPECT_FALSE(any_temporary(dir.path()));
}

// ---------------------------------------------------------------------------------------------
// FolderSink

void fill(FolderSink& f, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    auto s = f.create(n);
    s->write(std::string_view(n));
    s->commit();
  }
}

TEST(FolderSink, AppearsOnlyOnCommitWithItsParents) {
  test::TempDir dir;
  const std::string target = dir.file("x/y/out");
  auto f = create_folder_sink(target, {.fsync = false});
  fill(*f, {"a.npy", "index.json"});
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(any_temporary(dir.file("x/y")));
  f->commit();
  EXPECT_EQ(names_in(target), (std::set<std::string>{"a.npy", "index.json"}));
  EXPECT_EQ(test::to_string(test::read_file(target + "/a.npy")), "a.npy");
  EXPECT_EQ(names_in(dir.file("x/y")), (std::set<std::string>{"out"}));
}

TEST(FolderSink, WithoutCommitNothingIsLeft) {
  test::TempDir dir;
  {
    auto f = create_folder_sink(dir.file("out"), {.fsync = false});
    fill(*f, {"a", "b"});
  }
  EXPECT_TRUE(names_in(dir.path()).empty());
}

TEST(FolderSink, EmptyFolderIsReplacedNonEmptyRefusedUnlessReplace) {
  test::TempDir dir;
  const std::string target = dir.file("out");
  fs::create_directory(target);
  {
    auto f = create_folder_sink(target + "/", {.fsync = false});
    fill(*f, {"one"});
    f->commit();
  }
  EXPECT_EQ(names_in(target), (std::set<std::string>{"one"}));
  Error e = test::capture_error([&] { create_folder_sink(target, {.fsync = false}); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("not empty"), std::string::npos) << e.what();
  fs::create_directories(target + "/deep/er");
  test::write_file(target + "/deep/er/f", test::to_bytes("old"));
  {
    auto f = create_folder_sink(target, {.replace = true, .fsync = true});
    fill(*f, {"two"});
    f->commit();
  }
  EXPECT_EQ(names_in(target), (std::set<std::string>{"two"}));
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"out"}));
}

TEST(FolderSink, RefusesFilesLinksAndBadNames) {
  test::TempDir dir;
  test::write_file(dir.file("file"), test::to_bytes("x"));
  fs::create_directory(dir.file("real"));
  fs::create_directory_symlink("real", dir.file("link"));
  for (const char* t : {"file", "link"})
    for (bool replace : {false, true})
      EXPECT_EQ(test::capture_error([&] {
                  create_folder_sink(dir.file(t), {.replace = replace, .fsync = false});
                }).code(),
                ErrorCode::kInvalidArgument)
          << t;
  auto f = create_folder_sink(dir.file("out"), {.fsync = false});
  for (const char* n : {"", ".", "..", "a/b"})
    EXPECT_EQ(test::capture_error([&] { f->create(n); }).code(), ErrorCode::kInvalidArgument) << n;
}

TEST(FolderSink, StaleTemporaryFoldersAreSweptLiveOnesKept) {
  test::TempDir dir;
  auto make = [&](const std::string& suffix) {
    std::string p = dir.file(".out.tmp-" + suffix);
    fs::create_directories(p + "/inner");
    test::write_file(p + "/a.npy", test::to_bytes("partial"));
    test::write_file(p + "/inner/b", test::to_bytes("partial"));
    timespec t[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
    EXPECT_EQ(::utimensat(AT_FDCWD, p.c_str(), t, 0), 0);
    return p;
  };
  const std::string stale = make("AAAAAA"), locked = make("BBBBBB");
  int fd = ::open(locked.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  {
    auto f = create_folder_sink(dir.file("out"), {.fsync = false});
    fill(*f, {"a"});
    f->commit();
  }
  ::close(fd);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(locked + "/inner/b"));
}

}  // namespace
}  // namespace ckpt
