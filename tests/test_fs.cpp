// The checked file helpers (src/util/fs.h): atomic writes, failures that name the path and the operation, image
// extensions, directories and the expansion of image inputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"
#include "util/fs.h"

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
  EXPECT_EQ(message.rfind(dir.path() + ": cannot read", 0), 0u) << message;
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

  const std::string missing = dir.file("nope.jpg");
  const std::string message = error_of([&] { vit::expand_image_inputs({root, missing}); });
  EXPECT_EQ(message.rfind(missing + ": no such file or directory", 0), 0u) << message;
}

}  // namespace
