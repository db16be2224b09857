// The export-attention gallery (DIR/index.html): self-contained markup, and a real headless Chromium that renders
// it without console errors, shows every image and enlarges a map on a click (tests/chromium_check.py). Chromium
// comes from scripts/setup.sh (VIT_SETUP_TEST_EXTRAS=1, as scripts/test.sh runs it); without it the browser test
// skips. Its screenshots stay in the test's temp folder; VIT_TEST_SCREENSHOTS=DIR keeps a copy in DIR.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "explain/gallery.h"
#include "test_util.h"
#include "util/fs.h"

namespace vit {
namespace {

using test::TempDir;
using test::quoted;

// Exports the tiny32 images, a non-square picture with an awkward name and a broken file into `out`, with a head
// switched off, so the page shows every kind of entry. Returns the card names it must show.
std::vector<std::string> export_sample(const TempDir& dir, const std::string& out) {
  const std::string config = test::write_tiny32_config(dir);
  cv::Mat wide(90, 240, CV_8UC3);
  cv::randu(wide, 0, 255);
  const std::string odd = dir.file("wide #1 <b>.png");
  EXPECT_TRUE(cv::imwrite(odd, wide));
  const std::string broken = dir.file("broken.jpg");
  write_file_atomic(broken, "not a jpeg");
  const auto result = test::run_vit(
      "export-attention --checkpoint " + quoted(test::data_path("tiny32/weights.safetensors")) + " --config " +
      quoted(config) + " --out " + quoted(out) + " --method all --faithfulness --mask-heads 1:0 " +
      quoted(test::data_path("tiny32/chelsea.png")) + " " + quoted(test::data_path("tiny32/synthetic.png")) + " " +
      quoted(odd) + " " + quoted(broken));
  EXPECT_EQ(result.status, 3) << result.output << result.errors;  // the broken file
  return {"chelsea", "synthetic", "wide #1 <b>"};
}

TEST(GalleryPage, IsSelfContained) {
  TempDir dir;
  const std::string out = dir.file("out");
  export_sample(dir, out);
  const std::string page = read_file(out + "/index.html");
  // No fetches from anywhere: no external scripts, styles, fonts or pictures.
  for (const char* pattern : {"src=\"http", "href=\"http", "src=\"//", "href=\"//", "url(http", "@import",
                              "<script src", "<link rel=\"stylesheet\""}) {
    EXPECT_EQ(page.find(pattern), std::string::npos) << pattern;
  }
  // The image name holding "<b>" is data, never markup: the data block escapes '<'.
  EXPECT_EQ(page.find("<b>"), std::string::npos);
  EXPECT_NE(page.find("wide #1 \\u003cb>"), std::string::npos);
  // Relative links to the files next to the page, percent-encoded.
  EXPECT_NE(page.find(R"("dir":"wide%20%231%20%3Cb%3E")"), std::string::npos);
  EXPECT_TRUE(file_exists(out + "/wide #1 <b>/rollout.png"));
  EXPECT_NE(page.find("broken.jpg"), std::string::npos);  // the failed file is listed with its error
}

TEST(GalleryPage, EmptyExportStillRenders) {
  const std::string page = gallery_html({}, {{"a.png", "a.png: cannot decode"}}, {{"checkpoint", "m.safetensors"}},
                                        "turbo", 0.5);
  EXPECT_NE(page.find("a.png: cannot decode"), std::string::npos);
  EXPECT_NE(page.find("</html>"), std::string::npos);
}

// The installed Chromium, or "" when there is none.
std::string find_chromium() {
  for (const char* candidate : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (::access(candidate, X_OK) == 0) return candidate;
  }
  return "";
}

TEST(GalleryBrowser, ChromiumRendersShowsAllImagesAndEnlargesAClickedMap) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) {
    GTEST_SKIP() << "SKIPPED (no browser): neither /usr/bin/chromium nor /usr/bin/chromium-browser is installed "
                    "(VIT_SETUP_TEST_EXTRAS=1 scripts/setup.sh installs Debian's chromium)";
  }
  SKIP_WITHOUT_PYTHON();  // the check needs only the standard library

  TempDir dir;
  const std::string out = dir.file("out");
  const auto names = export_sample(dir, out);
  const std::string page_shot = dir.file("gallery_screenshot.png");
  const std::string zoom_shot = dir.file("gallery_screenshot_enlarged.png");
  std::string arguments = quoted(out + "/index.html") + " --chromium " + quoted(chromium) + " --screenshot " +
                          quoted(page_shot) + " --zoom-screenshot " + quoted(zoom_shot) + " --expect";
  for (const auto& name : names) arguments += " " + quoted(name);
  std::printf("%s", test::run_python("chromium_check.py", arguments).c_str());

  // The screenshots are real renderings: large enough, and far from one flat colour.
  for (const auto& shot : {page_shot, zoom_shot}) {
    ASSERT_TRUE(file_exists(shot)) << shot;
    EXPECT_GT(std::filesystem::file_size(shot), 20000u) << shot;
    const cv::Mat pixels = cv::imread(shot, cv::IMREAD_GRAYSCALE);
    ASSERT_FALSE(pixels.empty()) << shot;
    EXPECT_EQ(pixels.cols, 1280);
    EXPECT_EQ(pixels.rows, 900);
    cv::Scalar mean, spread;
    cv::meanStdDev(pixels, mean, spread);
    EXPECT_GT(spread[0], 15.0) << shot << " looks blank";
    std::printf("screenshot: %s (%ju bytes, grey mean %.0f, std %.0f)\n", shot.c_str(),
                static_cast<uintmax_t>(std::filesystem::file_size(shot)), mean[0], spread[0]);
  }
  // For people to look at: a copy outside the temp folder only when asked for.
  if (const char* keep = std::getenv("VIT_TEST_SCREENSHOTS"); keep != nullptr && *keep != '\0') {
    std::filesystem::create_directories(keep);
    for (const auto& shot : {page_shot, zoom_shot}) {
      const auto kept = std::filesystem::path(keep) / std::filesystem::path(shot).filename();
      std::filesystem::copy_file(shot, kept, std::filesystem::copy_options::overwrite_existing);
      std::printf("kept %s\n", kept.c_str());
    }
  }
}

}  // namespace
}  // namespace vit
