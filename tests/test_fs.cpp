// The checked file helpers (src/util/fs.h): atomic writes, failures that name the path and the operation, image
// extensions, directories and the expansion of image inputs.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"
#include "util/fs.h"
#include "util/text.h"

namespace {
namespace fs = std::filesystem;
using vit::test::TempDir;
using vit::test::error_of;

TEST(FsAtomicWrite, ReplacesContentAndLeavesNoTempFile) {
  TempDir dir;
  const std::string path = dir.file("out.json");
  vit::write_file_atomic(path, "old content that is longer");
  vit::write_file_atomic(path, "new");
  EXPECT_EQ(vit::read_file(path), "new");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"out.json"});

  vit::write_file_atomic(path, "");
  EXPECT_EQ(vit::read_file(path), "");
  const std::string binary("\0\x01\xff\n", 4);
  vit::write_file_atomic(path, binary);
  EXPECT_EQ(vit::read_file(path), binary);
}

TEST(FsAtomicWrite, FailuresNameThePathAndOperation) {
  TempDir dir;
  const std::string into_missing = dir.file("missing/out.bin");
  std::string message = error_of([&] { vit::write_file_atomic(into_missing, "x"); });
  EXPECT_NE(message.find(into_missing), std::string::npos) << message;
  EXPECT_NE(message.find("cannot open for writing"), std::string::npos) << message;
  EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;

  // Renaming a file over a non-empty directory fails after the temp file was written: the temp must go.
  const std::string directory = dir.file("occupied");
  vit::make_dirs(directory + "/inner");
  message = error_of([&] { vit::write_file_atomic(directory, "x"); });
  EXPECT_NE(message.find("cannot rename"), std::string::npos) << message;
  EXPECT_FALSE(vit::file_exists(directory + ".tmp." + std::to_string(::getpid())));

  const std::string absent = dir.file("absent.txt");
  message = error_of([&] { vit::read_file(absent); });
  EXPECT_EQ(message.rfind(absent + ": cannot open for reading", 0), 0u) << message;
  message = error_of([&] { vit::read_file(dir.path()); });
  EXPECT_EQ(message, dir.path() + ": is a directory, not a regular file");
}

// A write that fails midway (here a file-size limit, as a full disk would) leaves the previous file intact and no temp
// file behind, and says so naming the file: every model, state, summary and attention-map write goes through here.
TEST(FsAtomicWrite, AFailedWriteKeepsThePreviousFile) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  vit::write_file_atomic(path, "the previous, complete file");
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  void (*previous_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);  // as vit's main does: EFBIG instead of a signal
  struct rlimit limited = saved;
  limited.rlim_cur = 1 << 16;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string message = error_of([&] { vit::write_file_atomic(path, std::string(1 << 20, 'x')); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_EQ(message.rfind(path + ": cannot write (its temp file " + path + ".tmp.", 0), 0u) << message;
  EXPECT_NE(message.find("File too large; the previous " + path + " is unchanged"), std::string::npos) << message;
  EXPECT_EQ(vit::read_file(path), "the previous, complete file");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"model.safetensors"});
}

TEST(FsHelpers, ExtensionsAndDirectories) {
  EXPECT_EQ(vit::lower_extension("a/b/Photo.JPeG"), ".jpeg");
  EXPECT_EQ(vit::lower_extension("a.dir/noext"), "");
  EXPECT_EQ(vit::lower_extension(".hidden"), "");
  EXPECT_TRUE(vit::is_image_path("x.PNG"));
  EXPECT_TRUE(vit::is_image_path("x.tiff"));
  EXPECT_FALSE(vit::is_image_path("x.txt"));
  EXPECT_FALSE(vit::is_image_path("png"));

  TempDir dir;
  const std::string nested = dir.file("a/b/c");
  vit::make_dirs(nested);
  vit::make_dirs(nested);  // existing: fine
  EXPECT_TRUE(fs::is_directory(nested));
  vit::write_file_atomic(dir.file("file"), "x");
  EXPECT_NE(error_of([&] { vit::make_dirs(dir.file("file")); }).find(dir.file("file")), std::string::npos);
  EXPECT_NE(error_of([&] { vit::make_dirs(dir.file("file/sub")); }).find(dir.file("file/sub")), std::string::npos);
}

TEST(FsHelpers, ExpandImageInputsSortedAndRecursive) {
  TempDir dir;
  const std::string root = dir.file("images");
  for (const char* name :
       {"b.png", "a.jpg", "notes.txt", "sub/e.jpeg", "sub/c.PNG", "sub/deeper/d.webp", "sub/deeper/readme.md"}) {
    vit::make_dirs(fs::path(root + "/" + name).parent_path().string());
    vit::write_file_atomic(root + "/" + name, "x");
  }
  const std::string single = dir.file("single.bmp");
  vit::write_file_atomic(single, "x");

  const std::vector<std::string> expected = {
      root + "/a.jpg", root + "/b.png", root + "/sub/c.PNG", root + "/sub/deeper/d.webp", root + "/sub/e.jpeg", single};
  EXPECT_EQ(vit::expand_image_inputs({root, single}), expected);
  EXPECT_TRUE(vit::expand_image_inputs({dir.file("images/sub/deeper/readme.md")}).size() == 1)
      << "a file named explicitly is passed through";

  // Inputs that cannot be expanded are kept, each to fail alone when read: a missing path, an empty directory.
  const std::string missing = dir.file("nope.jpg");
  const std::string empty = dir.file("empty.jpg");
  vit::make_dirs(empty);
  const std::vector<std::string> kept = vit::expand_image_inputs({missing, root, empty});
  ASSERT_EQ(kept.size(), expected.size() + 1);
  EXPECT_EQ(kept.front(), missing);
  EXPECT_EQ(kept.back(), empty);
}

// Only regular files are read: every other kind fails at once, by its type, naming the path; nothing waits.
TEST(FsRegularFile, RefusesDirectoriesFifosSocketsAndDevicesWithoutWaiting) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.jpg");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string zero = dir.file("zero.jpg");
  fs::create_symlink("/dev/zero", zero);
  const std::string folder = dir.file("folder.jpg");
  vit::make_dirs(folder);
  const std::string socket_path = dir.file("socket.jpg");
  const int socket_fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", socket_path.c_str());
  ASSERT_EQ(::bind(socket_fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);

  const std::pair<std::string, const char*> cases[] = {{fifo, "is a FIFO (named pipe), not a regular file"},
                                                       {zero, "is a character device, not a regular file"},
                                                       {folder, "is a directory, not a regular file"},
                                                       {socket_path, "is a socket, not a regular file"}};
  for (const auto& [name, expected] : cases) {
    const std::string& path = name;  // a plain reference: C++17 lambdas cannot capture a structured binding
    const std::string message = error_of([&] { vit::read_regular_file(path, 1 << 20); });
    EXPECT_EQ(message, path + ": " + expected);
    EXPECT_EQ(error_of([&] { vit::read_file(path); }), message);
  }
  ::close(socket_fd);
  EXPECT_EQ(error_of([&] { vit::read_file(dir.file("missing")); }),
            dir.file("missing") + ": cannot open for reading: No such file or directory");
}

TEST(FsRegularFile, RefusesAFileOverTheLimitUnread) {
  TempDir dir;
  const std::string path = dir.file("big.bin");
  vit::write_file_atomic(path, std::string(1001, 'x'));
  EXPECT_EQ(vit::read_regular_file(path, 1001).size(), 1001u);
  EXPECT_EQ(error_of([&] { vit::read_regular_file(path, 1000); }),
            path + ": 1001 bytes is over the limit of 1000 bytes for this file");
}

// Names and fields from files reach the terminal and JSON reports escaped: control bytes and broken UTF-8 as \xNN.
TEST(Printable, EscapesControlBytesAndInvalidUtf8Only) {
  EXPECT_EQ(vit::printable("plain ascii/\\ ok"), "plain ascii/\\ ok");
  const std::string utf8 = "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80";  // é 日 😀
  EXPECT_EQ(vit::printable(utf8), utf8);
  EXPECT_EQ(vit::printable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(vit::printable(std::string("\x1b[31mred\x00\x7f", 10)), "\\x1b[31mred\\x00\\x7f");
  EXPECT_EQ(vit::printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(vit::printable("\xc3"), "\\xc3");                  // cut short
  EXPECT_EQ(vit::printable("\xc0\xaf"), "\\xc0\\xaf");          // overlong '/'
  EXPECT_EQ(vit::printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate
}

}  // namespace
