// `vit serve`: an HTTP server (Debian's cpp-httplib) that classifies and embeds images with one loaded model,
// batching concurrent requests into one forward pass (serve/batcher.h). Endpoints: POST /v1/classify, POST /v1/embed,
// GET /v1/model, /healthz, /readyz, /metrics. Vision library (decodes images with OpenCV).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/image.h"
#include "io/model_file.h"
#include "serve/batcher.h"

namespace vit {

struct ServeOptions {
  std::string host = "127.0.0.1";  // the loopback address unless told otherwise
  int port = 8080;                 // 0: a free port, chosen by the system (Server::port())
  BatcherOptions batching;
  int64_t max_body_bytes = int64_t{32} << 20;  // a larger body is refused (413) from its Content-Length, unread
  int timeout_s = 30;        // a request body must arrive whole within this; a silent client is dropped after it
  std::string api_key;       // when set, every endpoint but /healthz and /readyz needs it (Bearer or X-API-Key)
  ImageLimits limits;        // per image: its pixel count from the header (max_file_bytes is max_body_bytes)
  std::string source;        // what the model was loaded from, for GET /v1/model
};

// Serves `model` (on its device, in eval mode and its precision) until stop(). The model must outlive the server.
class Server {
 public:
  Server(LoadedModel& model, ServeOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and starts answering (/healthz at once; /readyz and the model's endpoints after warm_up).
  // Throws std::runtime_error naming the address when it cannot listen.
  void start();
  // Runs the model once at batch 1 and at max_batch, then reports ready. On the thread that will call run().
  void warm_up();
  // Runs the model's batches on the calling thread (serve/batcher.h says why it should be the one that loaded the
  // model) until stop() is called from another, and every request read has been answered.
  void run();
  int port() const;
  bool ready() const;
  // Stops accepting connections, lets every request already read be answered (by run()), then returns and lets
  // run() return. Idempotent; from any thread but run()'s.
  void stop();
  // Requests read / answered so far (a request is read once its headers are).
  int64_t requests_read() const;
  int64_t requests_answered() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Blocks SIGTERM and SIGINT in the calling thread and in every thread it starts afterwards, for serve()'s watcher to
// take them alone. Call it before anything starts a thread (before loading the model).
void block_stop_signals();
// `vit serve`: start(), warm_up() and run() on the calling thread until SIGTERM or SIGINT, then stop() and return
// (every request read answered). A second signal during the drain exits at once (status 130).
void serve(LoadedModel& model, const ServeOptions& options);

}  // namespace vit
