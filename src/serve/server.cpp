// The HTTP side of `vit serve` on Debian's cpp-httplib 0.11 (thread per connection): the routes, images decoded on
// the connection's thread, the model run by the batcher, answers as JSON (or .npy), metrics, and a shutdown that
// answers every request already read. What a request is checked and read by is serve/http_request.h.
#include "serve/server.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include <httplib.h>  // with the compile definitions Debian's library was built with (CMakeLists.txt)
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "config/config.h"
#include "image/decode.h"
#include "infer/embed.h"
#include "infer/predict.h"
#include "io/npy.h"
#include "serve/http_request.h"
#include "serve/metrics.h"
#include "util/log.h"
#include "util/text.h"

namespace vit {
namespace {

using Clock = std::chrono::steady_clock;
using serve_http::HttpError;
using serve_http::Upload;
using serve_http::check_image_request;
using serve_http::check_key;
using serve_http::check_params;
using serve_http::drain;
using serve_http::flag_param;
using serve_http::int_param;
using serve_http::json_text;
using serve_http::media_type;
using serve_http::read_uploads;
using serve_http::send_error;

const char* kClassify = "/v1/classify";
const char* kEmbed = "/v1/embed";
const char* kModel = "/v1/model";

// The metrics label of a path: the server's own paths, anything else "other" (a client cannot add labels).
std::string endpoint_label(const std::string& path) {
  for (const char* known : {kClassify, kEmbed, kModel, "/healthz", "/readyz", "/metrics"}) {
    if (path == known) return known;
  }
  return "other";
}

// The connections' threads read the batcher's answers through data pointers only, never calling a LibTorch operator:
// a thread's first operator that asks for the thread count runs LibTorch's per-thread set-up, at::set_num_threads,
// which clears oneDNN's primitive cache and resizes a thread pool under the model's feet (a heap corruption once in
// three load runs before this rule). The batcher hands over contiguous float32 (or int64) CPU rows.

// Row `row` of contiguous float32 rows (n, ...) as JSON numbers: a list, nested for (n, N, D).
nlohmann::json rows_json(const torch::Tensor& rows, int64_t row) {
  const int64_t size = rows.numel() / rows.size(0);
  const float* data = rows.data_ptr<float>() + row * size;
  if (rows.dim() == 2) return std::vector<float>(data, data + size);
  nlohmann::json out = nlohmann::json::array();
  const int64_t width = rows.size(-1);
  for (int64_t i = 0; i < size / width; ++i) out.push_back(std::vector<float>(data + i * width, data + (i + 1) * width));
  return out;
}

// What an image endpoint does with its request's images: the batch key (requests with the same key share forward
// passes), the batch's run, and the answer from this request's rows of the outputs.
struct ImageEndpoint {
  std::string key;
  Batcher::Run run;
  std::function<void(const std::vector<std::string>& names, const std::vector<torch::Tensor>& outputs,
                     const httplib::Request& req, httplib::Response& res)>
      respond;
};

// Per connection thread: when the request it is serving was read (its metrics and counts happen at its answer).
thread_local std::optional<Clock::time_point> t_request_start;

}  // namespace

struct Server::Impl {
  LoadedModel& model;
  const ModelConfig config;  // the model as it runs, read once: serving never changes its input size
  ServeOptions options;
  serve_http::RequestLimits request_limits;  // options' body size, time and key
  torch::Device device;
  ServeMetrics metrics;
  Batcher batcher;
  Normalizer normalizer;
  httplib::Server http;
  std::thread listener;
  std::atomic<bool> listening{false}, listen_done{false}, ready{false};
  std::atomic<int64_t> read_count{0}, answered_count{0};
  int port = 0;
  int listen_socket = -1;
  std::once_flag stopped;

  Impl(LoadedModel& loaded, ServeOptions opts)
      : model(loaded),
        config(loaded.config()),
        options(std::move(opts)),
        request_limits{options.max_body_bytes, options.timeout_s, options.api_key},
        device(model.net->parameters().front().device()),
        batcher(options.batching, [this](int64_t images, double seconds) { metrics.batch(images, seconds); }),
        normalizer(model.preprocess, config.in_chans) {
    if (options.max_body_bytes <= 0 || options.timeout_s <= 0) {
      throw std::invalid_argument("serve: --max-body-mb and --timeout-s must be positive");
    }
    routes();
  }

  torch::Tensor on_device(const torch::Tensor& inputs) const {
    return device.is_cuda() ? inputs.pin_memory().to(device, /*non_blocking=*/true) : inputs;
  }





  // An uploaded image to the model's input, on the batcher's intra-op threads (serve/batcher.h).
  torch::Tensor prepare(const BatchItem& item) {
    const auto start = Clock::now();
    ImageLimits limits = options.limits;
    limits.max_file_bytes = options.max_body_bytes;
    const RawImage raw = decode_image_bytes(item.bytes, item.name, limits);
    torch::Tensor input = preprocess(raw, model.preprocess, normalizer, config.img_h, config.img_w);
    metrics.decode(std::chrono::duration<double>(Clock::now() - start).count());
    return input;
  }

  void post_images(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                   const std::function<ImageEndpoint()>& endpoint_of) {
    ImageEndpoint endpoint;
    Batcher::Ticket ticket;
    try {
      check_image_request(req, request_limits, ready);
      endpoint = endpoint_of();
      try {
        ticket = batcher.admit();
      } catch (const QueueFull& e) {
        throw HttpError(503, e.what());
      }
    } catch (const HttpError& e) {
      send_error(res, e.status, e.what());
      drain(req, reader, res, request_limits);
      return;
    }
    try {
      auto uploads = read_uploads(req, reader, res, request_limits);
      std::vector<std::string> names;
      std::vector<BatchItem> items;
      for (auto& upload : uploads) {
        names.push_back(printable(upload.name));
        items.push_back({std::move(upload.bytes), names.back()});
      }
      auto answer = batcher.submit(ticket, endpoint.key, std::move(items),
                                   [this](const BatchItem& item) { return prepare(item); }, endpoint.run);
      const auto outputs = answer.get();
      res.status = 200;
      endpoint.respond(names, outputs, req, res);
    } catch (const HttpError& e) {
      send_error(res, e.status, e.what());
    } catch (const BadItem& e) {
      send_error(res, 400, e.what());
    } catch (const QueueFull& e) {
      send_error(res, 503, e.what());
    } catch (const std::exception& e) {
      log::error(std::string(req.path) + ": " + e.what());
      send_error(res, 500, e.what());
    }
  }

  ImageEndpoint classify_endpoint(const httplib::Request& req) {
    check_params(req, {"topk", "logits"});
    const int64_t topk = int_param(req, "topk", 5, 1, 1 << 20);
    const bool logits = flag_param(req, "logits");
    ImageEndpoint endpoint;
    endpoint.key = "classify";
    // Logits and their softmax, as vit predict computes them (predictions_from_logits), on the batcher's thread; the
    // top-k is picked by the same rule (top_k) on the connection's thread.
    endpoint.run = [this](const torch::Tensor& inputs) {
      const auto logits = eval_logits(model.net, on_device(inputs), model.preprocess.eval_hflip)
                              .to(torch::kCPU, torch::kFloat32)
                              .contiguous();
      return std::vector<torch::Tensor>{logits, logits.softmax(-1).contiguous()};
    };
    endpoint.respond = [this, topk, logits](const std::vector<std::string>& names,
                                            const std::vector<torch::Tensor>& outputs, const httplib::Request&,
                                            httplib::Response& res) {
      const int64_t classes = outputs[0].size(1);
      nlohmann::json answer = nlohmann::json::array();
      for (size_t i = 0; i < names.size(); ++i) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& [index, prob] : top_k(outputs[1].data_ptr<float>() + i * classes, classes, topk)) {
          top.push_back({{"index", index}, {"label", model.class_names[index]}, {"prob", prob}});
        }
        nlohmann::json entry{{"image", names[i]}, {"topk", top}};
        if (logits) {
          const float* row = outputs[0].data_ptr<float>() + i * classes;
          entry["logits"] = std::vector<float>(row, row + classes);
        }
        answer.push_back(entry);
      }
      res.set_content(json_text(answer), "application/json");
    };
    return endpoint;
  }

  ImageEndpoint embed_endpoint(const httplib::Request& req) {
    check_params(req, {"layers", "pool"});
    EmbedOptions embed;
    try {
      if (req.has_param("layers")) embed.layers = parse_block_indices(req.get_param_value("layers"), config.depth, "layers");
      if (req.has_param("pool")) {
        const auto pool = enum_from_name<EmbedPool>(req.get_param_value("pool"));
        if (!pool) throw std::invalid_argument("pool=" + req.get_param_value("pool") + " is not cls, avg or none");
        embed.pool = *pool;
      }
      check_embed_options(config, embed, "the model");
    } catch (const std::invalid_argument& e) {
      throw HttpError(400, e.what());
    }
    ImageEndpoint endpoint;
    endpoint.key = "embed " + req.get_param_value("layers") + " " + (embed.pool ? name_of(*embed.pool) : "");
    endpoint.run = [this, embed](const torch::Tensor& inputs) {
      EmbeddedBatch batch = embed_batch(model.net, on_device(inputs), embed);
      batch.outputs.push_back(batch.predicted);  // last: the top-1 class (undefined without a head)
      return batch.outputs;
    };
    endpoint.respond = [this, embed](const std::vector<std::string>& images, const std::vector<torch::Tensor>& outputs,
                                     const httplib::Request& req, httplib::Response& res) {
      const auto names = embedding_output_names(embed);
      if (media_type(req.get_header_value("Accept")) == "application/x-npy") {
        // One output as it is; several layers stacked as (layers, images, ...), named in X-Vit-Outputs.
        std::vector<int64_t> shape = outputs[0].sizes().vec();
        if (names.size() > 1) shape.insert(shape.begin(), static_cast<int64_t>(names.size()));
        std::string body = npy_preamble(shape);
        std::string joined;
        for (size_t k = 0; k < names.size(); ++k) {
          body.append(static_cast<const char*>(outputs[k].data_ptr()), outputs[k].numel() * sizeof(float));
          joined += (joined.empty() ? "" : ",") + names[k];
        }
        res.set_header("X-Vit-Outputs", joined);
        res.set_content(body, "application/x-npy");
        return;
      }
      const torch::Tensor& predicted = outputs.back();
      nlohmann::json answer = nlohmann::json::array();
      for (size_t i = 0; i < images.size(); ++i) {
        nlohmann::json entry{{"image", images[i]}};
        if (predicted.defined()) {
          const int64_t index = predicted.data_ptr<int64_t>()[i];
          entry["predicted"] = {{"index", index}, {"label", model.class_names[index]}};
        }
        for (size_t k = 0; k < names.size(); ++k) entry[names[k]] = rows_json(outputs[k], static_cast<int64_t>(i));
        answer.push_back(entry);
      }
      res.set_content(json_text(answer), "application/json");
    };
    return endpoint;
  }

  nlohmann::json model_json() const {
    return {{"source", options.source},
            {"model", to_json(config)},
            {"preprocess", to_json(model.preprocess)},
            {"input_size", {config.img_h, config.img_w}},
            {"num_classes", config.num_classes},
            {"class_names", model.class_names},
            {"parameters", count_parameters(*model.net)},
            {"precision", name_of(model.net->precision())},
            {"device", device.str()},
            {"max_batch", options.batching.max_batch}};
  }

  void routes() {
    http.set_pre_routing_handler([this](const httplib::Request&, httplib::Response&) {
      t_request_start = Clock::now();
      ++read_count;
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      if (!t_request_start) return;  // refused by the library before routing (a malformed request line)
      metrics.request(endpoint_label(req.path), res.status,
                      std::chrono::duration<double>(Clock::now() - *t_request_start).count());
      t_request_start.reset();
      ++answered_count;
    });
    // Refused before the body is sent, for clients that ask first (curl does for bodies over 1 MiB).
    http.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.path != kClassify && req.path != kEmbed) return 100;
      try {
        check_image_request(req, request_limits, ready);
        if (batcher.in_flight() >= options.batching.max_queue) throw HttpError(503, "the server is at capacity");
      } catch (const HttpError& e) {
        send_error(res, e.status, e.what());
        return e.status;
      }
      return 100;
    });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string message = "HTTP status " + std::to_string(res.status);
      if (res.status == 400) message = "malformed request";
      if (res.status == 404) message = "no such endpoint: " + printable(req.path);
      if (res.status == 413) message = "the body is over --max-body-mb";
      send_error(res, res.status, message);
    });
    http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr error) {
      std::string message = "internal error";
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      log::error(req.path + ": " + message);
      send_error(res, 500, message);
    });

    http.Post(kClassify, [this](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) {
      post_images(req, res, reader, [&] { return classify_endpoint(req); });
    });
    http.Post(kEmbed, [this](const httplib::Request& req, httplib::Response& res,
                             const httplib::ContentReader& reader) {
      post_images(req, res, reader, [&] { return embed_endpoint(req); });
    });
    for (const char* path : {kClassify, kEmbed}) {
      http.Get(path, [](const httplib::Request&, httplib::Response& res) {
        res.set_header("Allow", "POST");
        send_error(res, 405, "this endpoint takes POST with one image or a multipart form of images");
      });
    }
    http.Get(kModel, [this](const httplib::Request& req, httplib::Response& res) {
      try {
        check_key(req, request_limits);
      } catch (const HttpError& e) {
        return send_error(res, e.status, e.what());
      }
      res.set_content(json_text(model_json()), "application/json");
    });
    http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
      if (!ready) return send_error(res, 503, "the model is still warming up");
      res.set_content("{\"status\":\"ready\"}", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        check_key(req, request_limits);
      } catch (const HttpError& e) {
        return send_error(res, e.status, e.what());
      }
      res.set_content(metrics.prometheus(batcher.in_flight(), ready), "text/plain; version=0.0.4");
    });

    // One thread per connection: enough for every request the queue admits, plus a few to answer 503 beyond it.
    const auto threads = static_cast<size_t>(options.batching.max_queue + 8);
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
    http.set_read_timeout(options.timeout_s, 0);
    http.set_write_timeout(options.timeout_s, 0);
    http.set_keep_alive_timeout(5);
    http.set_keep_alive_max_count(1000);
    http.set_tcp_nodelay(true);  // an answer goes out as soon as it is written, not after the client's delayed ACK
    // Address reuse after a restart, but never SO_REUSEPORT (the library's default): a second server on the same port
    // must fail, not silently share it.
    http.set_socket_options([this](socket_t socket) {
      int yes = 1;
      setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_socket = socket;
    });
  }
};

Server::Server(LoadedModel& model, ServeOptions options) : impl_(std::make_unique<Impl>(model, std::move(options))) {}

Server::~Server() { stop(); }

void Server::start() {
  Impl& s = *impl_;
  const std::string address = s.options.host + ":" + std::to_string(s.options.port);
  errno = 0;
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
  } else {
    s.port = s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1;
  }
  if (s.port <= 0) {
    const std::string why = errno ? std::strerror(errno) : "the address cannot be resolved or bound";
    throw std::runtime_error("cannot listen on " + address + ": " + why);
  }
  // The library listens with a backlog of 5; a burst of clients connecting at once would see dropped SYNs (a
  // 1 s retry each). Listening again on the bound socket only deepens its queue.
  if (s.listen_socket >= 0) ::listen(s.listen_socket, SOMAXCONN);
  s.listener = std::thread([&s] {
    s.http.listen_after_bind();
    s.listen_done = true;
  });
  while (!s.http.is_running() && !s.listen_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void Server::warm_up() {
  Impl& s = *impl_;
  c10::InferenceMode inference;
  for (const int64_t batch : {int64_t{1}, s.options.batching.max_batch}) {
    const auto inputs = torch::zeros({batch, s.config.in_chans, s.config.img_h, s.config.img_w});
    s.model.net->forward(s.on_device(inputs)).to(torch::kCPU);
  }
  s.ready = true;
}

void Server::run() { impl_->batcher.run(); }

int Server::port() const { return impl_->port; }
bool Server::ready() const { return impl_->ready; }
int64_t Server::requests_read() const { return impl_->read_count; }
int64_t Server::requests_answered() const { return impl_->answered_count; }

void Server::stop() {
  Impl& s = *impl_;
  std::call_once(s.stopped, [&s] {
    // Stops accepting; the library then lets each connection's thread finish the request it has read, and joins.
    if (s.listener.joinable()) {
      s.http.stop();
      s.listener.join();
    }
    s.batcher.stop();
  });
}

void block_stop_signals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
}

void serve(LoadedModel& model, const ServeOptions& options) {
  block_stop_signals();  // for the threads started from here on; the caller blocked them before loading the model
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-answer is an error on its socket, not the end of the server
  Server server(model, options);
  server.start();
  const std::string url = "http://" + options.host + ":" + std::to_string(server.port());
  log::info("listening on " + url + " (warming up)");
  server.warm_up();
  log::info("ready: " + url + " (POST /v1/classify, POST /v1/embed, GET /v1/model, /healthz, /readyz, /metrics)");

  // SIGTERM and SIGINT are taken by this watcher alone (blocked everywhere, so no other thread's system call is ever
  // interrupted): the first stops the server on a thread of its own, a second during the drain exits at once.
  std::atomic<bool> done{false};
  std::thread stopper;
  std::thread watcher([&] {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    while (!done) {
      const timespec wait{0, 100 * 1000 * 1000};
      if (sigtimedwait(&stop, nullptr, &wait) < 0) continue;  // timed out: is the server done?
      if (stopper.joinable()) _exit(130);
      log::info("stopping: answering the " + std::to_string(server.requests_read() - server.requests_answered()) +
                " requests in flight, accepting no more");
      stopper = std::thread([&server] { server.stop(); });
    }
  });
  try {
    server.run();  // until the stopper has stopped the HTTP side and the batcher
  } catch (...) {
    done = true;
    watcher.join();
    if (stopper.joinable()) stopper.join();
    throw;
  }
  done = true;
  watcher.join();
  if (stopper.joinable()) stopper.join();
  log::info("stopped: " + std::to_string(server.requests_read()) + " requests read, " +
            std::to_string(server.requests_answered()) + " answered");
}

}  // namespace vit
