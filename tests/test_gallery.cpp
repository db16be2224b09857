// The export-attention gallery (DIR/index.html): self-contained markup, and a real headless Chromium that renders
// it without console errors, shows every image and enlarges a map on a click (tests/chromium_check.py).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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

std::string quoted(const std::string& path) { return "'" + path + "'"; }

// Exports the tiny32 images, a non-square picture with an awkward name and a broken file into `out`, with a head
// switched off, so the page shows every kind of entry. Returns the card names it must show.
std::vector<std::string> export_sample(const TempDir& dir, const std::string& out) {
  const std::string config = dir.file("tiny32.json");
  write_file_atomic(config, R"({
    "model": {"img_size": 32, "patch_size": 16, "in_chans": 3, "num_classes": 10, "embed_dim": 64, "depth": 2,
              "num_heads": 2},
    "data": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 1.0}
  })");
  cv::Mat wide(90, 240, CV_8UC3);
  cv::randu(wide, 0, 255);
  const std::string odd = dir.file("wide #1 <b>.png");
  EXPECT_TRUE(cv::imwrite(odd, wide));
  const std::string broken = dir.file("broken.jpg");
  write_file_atomic(broken, "not a jpeg");
  const auto result = test::run_vit(
      "export-attention --checkpoint " + quoted(test::data_path("tiny32/weights.safetensors")) + " --config " +
      quoted(config) + " --out " + quoted(out) + " --grad-rollout --faithfulness --mask-heads 1:0 " +
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

// /usr/bin/chromium, installing Debian's package when running as root; "" when there is none and cannot be one.
std::string ensure_chromium(std::string& why_not) {
  const std::vector<std::string> candidates = {"/usr/bin/chromium", "/usr/bin/chromium-browser"};
  auto find = [&] {
    for (const auto& c : candidates) {
      if (::access(c.c_str(), X_OK) == 0) return c;
    }
    return std::string();
  };
  if (auto found = find(); !found.empty()) return found;
  if (::geteuid() != 0) {
    why_not = "Chromium is not installed and this test is not root (apt-get install -y chromium)";
    return "";
  }
  std::printf("installing chromium with apt-get (once)...\n");
  if (std::system("apt-get install -y chromium >/tmp/vit-chromium-install.log 2>&1") != 0) {
    std::system("apt-get update >>/tmp/vit-chromium-install.log 2>&1 && "
                "apt-get install -y chromium >>/tmp/vit-chromium-install.log 2>&1");
  }
  if (auto found = find(); !found.empty()) return found;
  why_not = "apt-get install -y chromium failed (see /tmp/vit-chromium-install.log)";
  return "";
}

TEST(GalleryBrowser, ChromiumRendersShowsAllImagesAndEnlargesAClickedMap) {
  std::string why_not;
  const std::string chromium = ensure_chromium(why_not);
  if (chromium.empty()) GTEST_SKIP() << "SKIPPED (no browser): " << why_not;
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "SKIPPED: /usr/bin/python3 is missing";

  TempDir dir;
  const std::string out = dir.file("out");
  const auto names = export_sample(dir, out);
  // Screenshots stay next to the binary under test, for people to look at.
  const auto shots = std::filesystem::path(VIT_BINARY).parent_path();
  const std::string page_shot = (shots / "gallery_screenshot.png").string();
  const std::string zoom_shot = (shots / "gallery_screenshot_enlarged.png").string();
  std::filesystem::remove(page_shot);
  std::filesystem::remove(zoom_shot);
  std::string command = "/usr/bin/python3 " + quoted(std::string(VIT_TEST_DATA) + "/../chromium_check.py") + " " +
                        quoted(out + "/index.html") + " --chromium " + quoted(chromium) + " --screenshot " +
                        quoted(page_shot) + " --zoom-screenshot " + quoted(zoom_shot) + " --expect";
  for (const auto& name : names) command += " " + quoted(name);
  const std::string log = dir.file("chromium.log");
  const int status = std::system((command + " >" + quoted(log) + " 2>&1").c_str());
  const std::string report = read_file(log);
  std::printf("%s", report.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << report;
  ASSERT_EQ(WEXITSTATUS(status), 0) << report;

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
}

}  // namespace
}  // namespace vit
