// `vit serve`: classify and embed images over HTTP with one loaded model, batching concurrent requests
// (src/serve/server.h).
#include <string>

#include "commands.h"
#include "common.h"
#include "util/fs.h"
#include "vit/build_config.h"
#if VIT_WITH_SERVE
#include "serve/server.h"
#endif

namespace vit::app {
namespace {

struct ServeCommandOptions {
  ImageModelArgs image_model;  // its inputs and --max-file-mb unused: images come in requests
  std::string host = "127.0.0.1";
  int port = 8080;
  int max_batch = 32;
  double max_delay_ms = 5;
  int max_queue = 256;
  int max_body_mb = 32;
  int timeout_s = 30;
  std::string api_key_file;
};

#if VIT_WITH_SERVE
// The key in FILE, without the line break an editor leaves; an empty file is refused (it would be no key at all).
std::string read_api_key(const std::string& path) {
  std::string key = read_file(path);
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) key.pop_back();
  if (key.empty()) throw std::invalid_argument("--api-key-file " + path + ": the file is empty");
  return key;
}

int run_serve(const ServeCommandOptions& o) {
  block_stop_signals();  // first: every thread started from here on leaves SIGTERM and SIGINT to serve()'s watcher
  ServeOptions options;
  options.host = o.host;
  options.port = o.port;
  options.batching.max_batch = o.max_batch;
  options.batching.max_delay = std::chrono::microseconds(static_cast<int64_t>(o.max_delay_ms * 1000));
  options.batching.max_queue = o.max_queue;
  options.max_body_bytes = static_cast<int64_t>(o.max_body_mb) << 20;
  options.timeout_s = o.timeout_s;
  options.limits = o.image_model.limits;
  if (!o.api_key_file.empty()) options.api_key = read_api_key(o.api_key_file);
  auto model = load_image_model(o.image_model);
  start_model(model, o.image_model);
  options.source = model.path;
  serve(model, options);
  return kOk;
}
#else
int run_serve(const ServeCommandOptions&) {
  throw std::runtime_error("this vit was built without cpp-httplib or OpenCV: serve is unavailable");
}
#endif

}  // namespace

void setup_serve(CLI::App& app, int& status) {
  auto o = std::make_shared<ServeCommandOptions>();
  auto* command = app.add_subcommand("serve", "Classify and embed images over HTTP, batching concurrent requests");
  command->footer(
      "Endpoints (JSON answers; errors as {\"error\": \"...\"} with the HTTP status):\n"
      "  POST /v1/classify?topk=K&logits=1  one image as the body (Content-Type image/jpeg, image/png, ...), or\n"
      "                                     multipart/form-data files: vit predict --json's list, one per image\n"
      "  POST /v1/embed?layers=3,7&pool=avg  features as vit embed computes them; .npy with Accept: application/x-npy\n"
      "  GET  /v1/model    architecture, classes, preprocessing, input size, precision, source\n"
      "  GET  /healthz     alive;  GET /readyz: model loaded and warmed up;  GET /metrics: Prometheus text\n"
      "SIGTERM or SIGINT stops accepting, answers every request already read, then exits 0 (a second one: at once).\n"
      "Example: curl -H 'Content-Type: image/jpeg' --data-binary @cat.jpg localhost:8080/v1/classify");
  command->add_option("--checkpoint", o->image_model.checkpoint, kCheckpointHelp)->check(CLI::ExistingPath);
  add_config_args(command, o->image_model.config);
  add_img_size_option(command, o->image_model.img_size);
  o->image_model.limits.max_pixels = int64_t{64} << 20;  // a server's default: 64 Mpx, a 192 MiB decode at most
  command
      ->add_option("--max-pixels", o->image_model.limits.max_pixels,
                   "refuse (400), undecoded, images whose header declares more pixels (width x height)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_device_args(command, o->image_model.device, o->image_model.threads);
  add_precision_option(command, o->image_model.precision);
  command->add_option("--host", o->host, "address to listen on (0.0.0.0: every interface)")->capture_default_str();
  command->add_option("--port", o->port, "port to listen on (0: any free port, logged)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  command->add_option("--max-batch", o->max_batch, "images per forward pass, gathered across requests")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  command
      ->add_option("--max-delay-ms", o->max_delay_ms,
                   "longest a queued request waits for requests still being read or decoded to join its batch "
                   "(never when no other request is on its way)")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  command
      ->add_option("--max-queue", o->max_queue,
                   "requests in flight (read, decoded, queued or running); one more is answered 503 with Retry-After")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  command->add_option("--max-body-mb", o->max_body_mb, "largest request body in MiB; larger ones get 413, unread")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  command
      ->add_option("--timeout-s", o->timeout_s,
                   "a body must arrive whole within this many seconds (408), and a client silent this long is dropped")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  command
      ->add_option("--api-key-file", o->api_key_file,
                   "require the key in FILE (Authorization: Bearer KEY, or X-API-Key: KEY) on every endpoint but "
                   "/healthz and /readyz")
      ->check(CLI::ExistingFile);
  command->callback([o, &status] { status = run_serve(*o); });
}

}  // namespace vit::app
