#include "lockstep/io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"

namespace {

using lockstep::IoError;
using lockstep::io::read_file;
using lockstep::io::write_file_atomic;
using lockstep::test_util::TempDir;

TEST(AtomicFile, WritesNewFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  std::string bytes("a\0b\xff", 4);
  write_file_atomic(path, bytes);
  EXPECT_EQ(read_file(path), bytes);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.bin"});
}

TEST(AtomicFile, ReplacesExistingFileAndWritesEmptyFiles) {
  TempDir dir;
  const std::string path = dir.file("out.txt");
  write_file_atomic(path, "a longer first version");
  write_file_atomic(path, "short");
  EXPECT_EQ(read_file(path), "short");
  write_file_atomic(path, "");
  EXPECT_EQ(read_file(path), "");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.txt"});
}

// Renaming a file over a directory fails late, after the temporary file has been written.
TEST(AtomicFile, FailureOnDirectoryTargetKeepsItAndRemovesTemporary) {
  TempDir dir;
  const std::string target = dir.file("target");
  std::filesystem::create_directory(target);
  lockstep::test_util::write_bytes(target + "/keep.txt", "old");
  try {
    write_file_atomic(target, "new contents");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_directory(target));
  EXPECT_EQ(read_file(target + "/keep.txt"), "old");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"target"});
}

TEST(AtomicFile, MissingParentDirectoryThrowsWithPathAndReason) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/out.bin");
  try {
    write_file_atomic(path, "x");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(dir.entries().empty());
}

// Ranks run as threads may save to the same path; every reader must see one complete version.
TEST(AtomicFile, ConcurrentWritersNeverInterleave) {
  TempDir dir;
  const std::string path = dir.file("shared.bin");
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) write_file_atomic(path, std::string(4096 + t, static_cast<char>('a' + t)));
    });
  }
  for (auto& th : threads) th.join();
  const std::string got = read_file(path);
  ASSERT_GE(got.size(), 4096u);
  const int t = static_cast<int>(got.size()) - 4096;
  EXPECT_EQ(got, std::string(got.size(), static_cast<char>('a' + t)));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"shared.bin"});
}

TEST(AtomicFile, ReadFileErrorsNameThePath) {
  TempDir dir;
  const std::string missing = dir.file("missing.bin");
  try {
    read_file(missing);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_file(dir.path()), IoError);
}

// The rename would turn a device or FIFO into a plain file (as root, /dev/null too): refused.
TEST(AtomicFile, SpecialFilesAreRefusedNotReplaced) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& path : {fifo, std::string("/dev/null")}) {
    try {
      write_file_atomic(path, "x");
      FAIL() << "wrote to " << path;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("regular files only"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  struct stat st {};
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"pipe"});
}

// A symlink is refused by name, whether its target exists or not: the link and its target stay
// as they were, and no temporary file is left.
TEST(AtomicFile, SymlinksAreRefusedNotWrittenThrough) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("real"));
  const std::string target = dir.file("real/notes.txt");
  lockstep::test_util::write_bytes(target, "old");
  for (const std::string& to : {target, dir.file("real/absent.txt")}) {
    const std::string link = dir.file("link.txt");
    std::filesystem::remove(link);
    std::filesystem::create_symlink(to, link);
    try {
      write_file_atomic(link, "new");
      FAIL() << "wrote through " << link;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("is a symbolic link to '" + to + "'"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(std::filesystem::is_symlink(link));
  }
  EXPECT_EQ(read_file(target), "old");
  EXPECT_FALSE(std::filesystem::exists(dir.file("real/absent.txt")));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"link.txt", "real"}));
}

// A FIFO would block the open until someone writes, /dev/zero would be read until memory runs out.
TEST(AtomicFile, ReadingRefusesWhatIsNotARegularFileWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    try {
      read_file(path);
      FAIL() << "read " << path;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
}

}  // namespace

namespace {

using lockstep::io::write_files_atomic;

TEST(AtomicFiles, WritesEveryFileOfABatchAndLeavesNoTemporary) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("sub"));
  lockstep::test_util::write_bytes(dir.file("b.png"), "old");
  write_files_atomic({{dir.file("a.png"), "first"}, {dir.file("b.png"), ""}, {dir.file("sub/c.png"), "third"}});
  EXPECT_EQ(read_file(dir.file("a.png")), "first");
  EXPECT_EQ(read_file(dir.file("b.png")), "");
  EXPECT_EQ(read_file(dir.file("sub/c.png")), "third");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"a.png", "b.png", "sub"}));
  write_files_atomic({});  // nothing to write, nothing done
}

// A link among the names: nothing of the batch is written (each name is checked before any rename),
// the link's target is untouched and no temporary file is left.
TEST(AtomicFiles, ALinkInABatchIsRefusedBeforeAnyFileIsWritten) {
  TempDir dir;
  const std::string target = dir.file("notes.txt");
  lockstep::test_util::write_bytes(target, "old");
  std::filesystem::create_symlink(target, dir.file("b.png"));
  try {
    write_files_atomic({{dir.file("a.png"), "first"}, {dir.file("b.png"), "second"}, {dir.file("c.png"), "third"}});
    FAIL() << "wrote through a link";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("is a symbolic link to '" + target + "'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(target), "old");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"b.png", "notes.txt"}));
}

}  // namespace
