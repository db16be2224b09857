// `vit export-attention` over many images, one at a time.
#include "explain/export_run.h"

#include <chrono>
#include <set>

#include "infer/inputs.h"
#include "util/fs.h"

namespace vit {

ExportRun export_images(LoadedModel& model, const std::vector<std::string>& paths, const std::string& out_dir,
                        const ExportOptions& options, const ExportProgress& on_image) {
  make_dirs(out_dir);
  ExportRun run;
  std::set<std::string> taken;
  for (const auto& path : paths) {
    const auto start = std::chrono::steady_clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    const PreparedImage image =
        std::move(prepare_images({path}, model.preprocess, model.model, /*keep_bgr=*/true).front());
    if (!image.ok()) {
      run.errors.push_back({path, image.error});
      if (on_image) on_image(path, nullptr, image.error, seconds());
      continue;
    }
    const std::string dir_name = unique_dir_name(path, taken);
    run.results.push_back(
        export_image_attention(model, path, image.image_bgr, image.input, out_dir, dir_name, options));
    if (on_image) on_image(path, &run.results.back(), "", seconds());
  }
  return run;
}

}  // namespace vit
