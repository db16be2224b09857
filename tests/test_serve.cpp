// `vit serve` (src/serve/): the batcher alone (one batch for concurrent requests, a lone request served at once,
// admission, a bad item failing only its request, large requests in chunks), and the server over real loopback
// sockets: every endpoint, answers equal vit predict's and batched answers equal single ones, the bad-request corpus
// each followed by a good request, a full queue, a slow client, the API key, and SIGTERM under load answering every
// request read.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "infer/predict.h"
#include "serve/batcher.h"
#include "serve/server.h"
#include "test_util.h"

namespace vit {
namespace {
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---- the batcher alone ----

// Items "k" prepare to a (1, 1, 1) tensor holding k; "bad" fails; run doubles its inputs and records batch sizes.
struct Doubler {
  std::mutex mutex;
  std::vector<int64_t> batches;
  Batcher::Prepare prepare = [](const BatchItem& item) {
    if (item.bytes == "bad") throw std::runtime_error(item.name + ": not a number");
    return torch::full({1, 1, 1}, std::stof(item.bytes));
  };
  Batcher::Run run = [this](const torch::Tensor& inputs) {
    std::lock_guard<std::mutex> lock(mutex);
    batches.push_back(inputs.size(0));
    return std::vector<torch::Tensor>{inputs.flatten() * 2};
  };
};

std::vector<BatchItem> items(std::initializer_list<int> values) {
  std::vector<BatchItem> out;
  for (const int v : values) out.push_back({std::to_string(v), "item " + std::to_string(v)});
  return out;
}

std::vector<float> values(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

TEST(Batcher, GathersRequestsOnTheirWayIntoOneBatchAndAnswersEachItsRows) {
  BatcherOptions options;
  options.max_batch = 8;
  options.max_delay = std::chrono::seconds(5);  // long: the batch must close because nobody else is on the way
  Batcher batcher(options);
  Doubler doubler;
  std::thread runner([&] { batcher.run(); });
  // Three admitted requests: the first queued waits for the other two, which arrive later.
  auto a = batcher.admit(), b = batcher.admit(), c = batcher.admit();
  const auto start = Clock::now();
  auto fa = batcher.submit(a, "k", items({1}), doubler.prepare, doubler.run);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto fb = batcher.submit(b, "k", items({2, 3}), doubler.prepare, doubler.run);
  auto fc = batcher.submit(c, "k", items({4, 5, 6}), doubler.prepare, doubler.run);
  EXPECT_EQ(values(fa.get()[0]), (std::vector<float>{2}));
  EXPECT_EQ(values(fb.get()[0]), (std::vector<float>{4, 6}));
  EXPECT_EQ(values(fc.get()[0]), (std::vector<float>{8, 10, 12}));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4)) << "the batch waited for max_delay with nobody on the way";
  EXPECT_EQ(doubler.batches, (std::vector<int64_t>{6}));
  batcher.stop();
  runner.join();
}

TEST(Batcher, ServesALoneRequestAtOnceAndKeysApart) {
  BatcherOptions options;
  options.max_delay = std::chrono::seconds(30);
  Batcher batcher(options);
  Doubler doubler;
  std::thread runner([&] { batcher.run(); });
  auto ticket = batcher.admit();
  auto answer = batcher.submit(ticket, "k", items({7}), doubler.prepare, doubler.run);
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "a lone request waited";
  EXPECT_EQ(values(answer.get()[0]), (std::vector<float>{14}));
  // Requests of different keys never share a batch.
  auto x = batcher.admit(), y = batcher.admit();
  auto fx = batcher.submit(x, "one", items({1}), doubler.prepare, doubler.run);
  auto fy = batcher.submit(y, "two", items({2}), doubler.prepare, doubler.run);
  EXPECT_EQ(values(fx.get()[0]), (std::vector<float>{2}));
  EXPECT_EQ(values(fy.get()[0]), (std::vector<float>{4}));
  EXPECT_EQ(doubler.batches, (std::vector<int64_t>{1, 1, 1}));
  batcher.stop();
  runner.join();
}

std::string error_of_queue(Batcher& batcher) {
  try {
    batcher.admit();
  } catch (const QueueFull& e) {
    return e.what();
  }
  return "(admitted)";
}

TEST(Batcher, RefusesBeyondMaxQueueAndAfterStop) {
  BatcherOptions options;
  options.max_queue = 2;
  Batcher batcher(options);
  auto a = batcher.admit();
  {
    auto b = batcher.admit();
    EXPECT_EQ(batcher.in_flight(), 2);
    EXPECT_NE(error_of_queue(batcher).find("--max-queue 2"), std::string::npos);
  }
  auto c = batcher.admit();  // b's place is free again
  EXPECT_EQ(batcher.in_flight(), 2);
  batcher.stop();
  batcher.run();  // returns at once: stopped, nothing queued
  EXPECT_THROW(batcher.admit(), QueueFull);
}

TEST(Batcher, ABadItemFailsOnlyItsRequest) {
  BatcherOptions options;
  options.max_delay = std::chrono::seconds(5);
  Batcher batcher(options);
  Doubler doubler;
  auto a = batcher.admit(), b = batcher.admit();
  auto bad = batcher.submit(a, "k", {{"1", "good"}, {"bad", "broken.jpg"}}, doubler.prepare, doubler.run);
  auto good = batcher.submit(b, "k", items({3}), doubler.prepare, doubler.run);
  std::thread runner([&] { batcher.run(); });
  EXPECT_EQ(values(good.get()[0]), (std::vector<float>{6}));
  try {
    bad.get();
    ADD_FAILURE() << "a bad item was answered";
  } catch (const BadItem& e) {
    EXPECT_STREQ(e.what(), "broken.jpg: not a number");
  }
  EXPECT_EQ(doubler.batches, (std::vector<int64_t>{1}));
  batcher.stop();
  runner.join();
}

TEST(Batcher, ARequestLargerThanMaxBatchRunsInChunksInOrder) {
  BatcherOptions options;
  options.max_batch = 2;
  Batcher batcher(options);
  Doubler doubler;
  std::thread runner([&] { batcher.run(); });
  auto ticket = batcher.admit();
  auto answer = batcher.submit(ticket, "k", items({1, 2, 3, 4, 5}), doubler.prepare, doubler.run);
  EXPECT_EQ(values(answer.get()[0]), (std::vector<float>{2, 4, 6, 8, 10}));
  EXPECT_EQ(doubler.batches, (std::vector<int64_t>{2, 2, 1}));
  batcher.stop();
  runner.join();
}

// ---- the server over loopback sockets ----

constexpr int64_t kClasses = 5;

// A random tiny classifier (32x32 RGB, 5 classes, 2 blocks) in eval mode on the CPU.
LoadedModel serve_model() {
  torch::manual_seed(5);
  LoadedModel model;
  model.net = VisionTransformer(test::tiny_vit(/*img=*/32, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/kClasses,
                                              /*embed_dim=*/32, /*depth=*/2, /*num_heads=*/2, /*mlp_ratio=*/2.0));
  test::perturb_weights(model.net, 11);
  model.net->eval();
  model.class_names = {"ant", "bee", "cat", "dog", "eel"};
  model.path = "tiny";
  return model;
}

// A JPEG (or PNG) of random pixels.
std::string image_bytes(int height, int width, int seed, const std::string& ext = ".jpg") {
  cv::Mat image(height, width, CV_8UC3);
  cv::RNG rng(seed);
  rng.fill(image, cv::RNG::UNIFORM, 0, 256);
  std::vector<uchar> bytes;
  cv::imencode(ext, image, bytes);
  return std::string(bytes.begin(), bytes.end());
}

// A server on a free loopback port, its batches run on a thread of the test.
struct Running {
  LoadedModel model = serve_model();
  std::unique_ptr<Server> server;
  std::thread runner;
  int port = 0;

  explicit Running(ServeOptions options) {
    options.host = "127.0.0.1";
    options.port = 0;
    server = std::make_unique<Server>(model, options);
    server->start();
    server->warm_up();
    port = server->port();
    runner = std::thread([this] { server->run(); });
  }
  ~Running() {
    server->stop();
    runner.join();
  }
};

struct Reply {
  int status = 0;                              // 0: the connection closed without an answer
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the server closes (every request here says Connection: close) or `timeout`, then parses the answer.
Reply read_reply(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  std::string raw;
  const auto deadline = Clock::now() + timeout;
  char buffer[65536];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    raw.append(buffer, static_cast<size_t>(n));
  }
  Reply reply;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return reply;
  reply.status = std::stoi(raw.substr(9, 3));
  size_t line = raw.find("\r\n") + 2;
  while (line < end) {
    const size_t next = raw.find("\r\n", line);
    const std::string header = raw.substr(line, next - line);
    const size_t colon = header.find(':');
    std::string name = header.substr(0, colon);
    for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    reply.headers[name] = header.substr(header.find_first_not_of(' ', colon + 1));
    line = next + 2;
  }
  reply.body = raw.substr(end + 4);
  return reply;
}

// Sends `request` whole on a new connection and reads the answer.
Reply ask(int port, const std::string& request, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  send_all(fd, request);
  Reply reply = read_reply(fd, timeout);
  close(fd);
  return reply;
}

std::string post(const std::string& target, const std::string& content_type, const std::string& body,
                 const std::string& headers = "") {
  return "POST " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + headers + "\r\n" + body;
}

std::string get(const std::string& target, const std::string& headers = "") {
  return "GET " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + headers + "\r\n";
}

const std::string kBoundary = "vitTestBoundary7d3";

// A multipart/form-data body of files (field "image", its file name, its bytes).
std::string form(const std::vector<std::pair<std::string, std::string>>& files) {
  std::string body;
  for (const auto& [name, bytes] : files) {
    body += "--" + kBoundary + "\r\nContent-Disposition: form-data; name=\"image\"; filename=\"" + name +
            "\"\r\nContent-Type: image/jpeg\r\n\r\n" + bytes + "\r\n";
  }
  return body + "--" + kBoundary + "--\r\n";
}
const std::string kFormType = "multipart/form-data; boundary=" + kBoundary;

std::vector<float> logits_of(const json& entry) { return entry.at("logits").get<std::vector<float>>(); }

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = a.size() == b.size() ? 0.0 : 1e9;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  return diff;
}

// The class-probability answer for one image, as a fresh connection sees it.
Reply classify(int port, const std::string& image, const std::string& query = "?logits=1") {
  return ask(port, post("/v1/classify" + query, "image/jpeg", image));
}

TEST(Serve, EveryEndpointAnswersAsVitPredictAndVitEmbedWould) {
  Running running(ServeOptions{});
  const int port = running.port;
  EXPECT_EQ(ask(port, get("/healthz")).status, 200);
  EXPECT_EQ(ask(port, get("/readyz")).status, 200);

  const auto model = json::parse(ask(port, get("/v1/model")).body);
  EXPECT_EQ(model.at("num_classes"), kClasses);
  EXPECT_EQ(model.at("class_names")[2], "cat");
  EXPECT_EQ(model.at("input_size"), json::array({32, 32}));
  EXPECT_EQ(model.at("precision"), "fp32");

  // One image as the body: vit predict --json's entry, its logits those of predict_images on the same file.
  const test::TempDir dir;
  const std::string image = image_bytes(45, 61, 1);
  test::write_bytes(dir / "a.jpg", image);
  const Reply one = classify(port, image, "?topk=3&logits=1");
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(one.headers.at("content-type"), "application/json");
  const auto answer = json::parse(one.body);
  ASSERT_EQ(answer.size(), 1u);
  EXPECT_EQ(answer[0].at("image"), "body");
  ASSERT_EQ(answer[0].at("topk").size(), 3u);
  LoadedModel local = serve_model();
  const auto predicted = predict_images(local, {dir / "a.jpg"}, PredictOptions{3, 1, {}});
  const double diff = max_diff(logits_of(answer[0]), predicted[0].logits);
  std::cout << "served logits vs predict_images: max |d| " << diff << "\n";
  EXPECT_LE(diff, 1e-5);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(answer[0]["topk"][k].at("index"), predicted[0].top_index[k]);
    EXPECT_EQ(answer[0]["topk"][k].at("label"), running.model.class_names[predicted[0].top_index[k]]);
    EXPECT_NEAR(answer[0]["topk"][k].at("prob").get<double>(), predicted[0].top_prob[k], 1e-6);
  }
  EXPECT_FALSE(json::parse(classify(port, image, "").body)[0].contains("logits"));  // only with logits=1

  // A multipart form: one entry per file, in the form's order, named by their file names.
  const Reply two = ask(port, post("/v1/classify?topk=1", kFormType,
                                        form({{"z.jpg", image_bytes(30, 20, 2)}, {"a.png", image_bytes(40, 40, 3, ".png")}})));
  ASSERT_EQ(two.status, 200) << two.body;
  const auto pair = json::parse(two.body);
  ASSERT_EQ(pair.size(), 2u);
  EXPECT_EQ(pair[0].at("image"), "z.jpg");
  EXPECT_EQ(pair[1].at("image"), "a.png");
  EXPECT_EQ(pair[1].at("topk").size(), 1u);

  // Embeddings: the pooled features as JSON; blocks as .npy when asked.
  const Reply features = ask(port, post("/v1/embed", "image/jpeg", image));
  ASSERT_EQ(features.status, 200) << features.body;
  const auto embedded = json::parse(features.body);
  EXPECT_EQ(embedded[0].at("features").size(), 32u);
  EXPECT_EQ(embedded[0].at("predicted").at("index"), predicted[0].top_index[0]);
  const Reply blocks =
      ask(port, post("/v1/embed?layers=0,-1&pool=none", "image/jpeg", image, "Accept: application/x-npy\r\n"));
  ASSERT_EQ(blocks.status, 200) << blocks.body;
  EXPECT_EQ(blocks.headers.at("content-type"), "application/x-npy");
  EXPECT_EQ(blocks.headers.at("x-vit-outputs"), "block_0,block_1");
  EXPECT_EQ(blocks.body.substr(0, 6), "\x93NUMPY");
  EXPECT_NE(blocks.body.find("'shape': (2, 1, 17, 32)"), std::string::npos) << blocks.body.substr(0, 128);

  // Metrics: Prometheus text with the requests above.
  const Reply metrics = ask(port, get("/metrics"));
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("vit_requests_total{endpoint=\"/v1/classify\",status=\"200\"} 3"), std::string::npos)
      << metrics.body;
  for (const char* name : {"vit_request_duration_seconds_bucket{endpoint=\"/v1/embed\",le=\"+Inf\"} 2",
                           "vit_batch_images_bucket{le=\"1\"}", "vit_decode_seconds_count 6", "vit_images_total 6",
                           "vit_queue_depth 0", "vit_ready 1", "vit_images_per_second "}) {
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name << "\n" << metrics.body;
  }
}

TEST(Serve, BatchedAnswersEqualSingleAnswers) {
  ServeOptions options;
  options.batching.max_delay = std::chrono::milliseconds(500);  // concurrent requests surely share batches
  options.batching.max_batch = 8;
  Running running(options);
  constexpr int kImages = 8;
  std::vector<std::string> images;
  std::vector<std::vector<float>> alone;
  for (int i = 0; i < kImages; ++i) {
    images.push_back(image_bytes(20 + 7 * i, 50 - 3 * i, 10 + i));
    const Reply reply = classify(running.port, images.back());
    ASSERT_EQ(reply.status, 200) << reply.body;
    alone.push_back(logits_of(json::parse(reply.body)[0]));  // one request at a time: batches of one
  }
  // Eight clients send all but the last byte of their requests, so that all are admitted and on their way; then the
  // last bytes: the first request queued waits for the others, and they run together.
  std::vector<int> sockets;
  for (int i = 0; i < kImages; ++i) {
    const std::string request = post("/v1/classify?logits=1", "image/jpeg", images[i]);
    sockets.push_back(connect_to(running.port));
    ASSERT_GE(sockets.back(), 0);
    send_all(sockets.back(), request.substr(0, request.size() - 1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < kImages; ++i) send_all(sockets[i], images[i].substr(images[i].size() - 1));
  std::vector<Reply> together;
  for (const int fd : sockets) {
    together.push_back(read_reply(fd));
    close(fd);
  }
  double diff = 0;
  for (int i = 0; i < kImages; ++i) {
    ASSERT_EQ(together[i].status, 200) << together[i].body;
    diff = std::max(diff, max_diff(logits_of(json::parse(together[i].body)[0]), alone[i]));
  }
  std::cout << "batched vs single answers: max |d| " << diff << "\n";
  EXPECT_LE(diff, 1e-5);
  // 8 batches of one, then one batch of the 8 concurrent requests.
  const std::string metrics = ask(running.port, get("/metrics")).body;
  std::smatch count;
  ASSERT_TRUE(std::regex_search(metrics, count, std::regex("vit_batch_images_count ([0-9]+)")));
  std::cout << "batches for " << 2 * kImages << " requests: " << count[1] << "\n";
  EXPECT_EQ(std::stoi(count[1]), kImages + 1);
}

// Each bad request gets its status and a JSON error naming the problem; a good request right after succeeds.
TEST(Serve, EveryBadRequestIsAnsweredAndTheServerKeepsServing) {
  ServeOptions options;
  options.max_body_bytes = 1 << 20;
  options.limits.max_pixels = 40 * 40;
  options.timeout_s = 1;
  Running running(options);
  const int port = running.port;
  const std::string good = image_bytes(32, 32, 4);
  const std::string big = image_bytes(41, 41, 5);
  struct Case {
    std::string name, request;
    int status;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"not an image", post("/v1/classify", "image/jpeg", "plain text, not pixels"), 400, "not an image format"},
      {"truncated JPEG", post("/v1/classify", "image/jpeg", good.substr(0, good.size() / 3)), 400, "body: "},
      {"over the pixel limit", post("/v1/classify", "image/jpeg", big), 400, "pixels"},
      {"unknown content type", post("/v1/classify", "text/plain", good), 415, "not an image"},
      {"form-urlencoded (curl's default)", post("/v1/classify", "application/x-www-form-urlencoded", good), 415,
       "--data-binary"},
      {"no content type", "POST /v1/classify HTTP/1.1\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc", 415,
       "(none)"},
      {"no content length", "POST /v1/classify HTTP/1.1\r\nConnection: close\r\nContent-Type: image/jpeg\r\n\r\n", 411,
       "Content-Length"},
      {"body over --max-body-mb",
       "POST /v1/classify HTTP/1.1\r\nConnection: close\r\nContent-Type: image/jpeg\r\nContent-Length: 2097152\r\n\r\n",
       413, "--max-body-mb"},
      {"malformed multipart", post("/v1/classify", kFormType, "--wrongBoundary\r\n\r\nxyz\r\n--wrongBoundary--\r\n"),
       400, "multipart"},
      {"multipart cut short", post("/v1/classify", kFormType, form({{"a.jpg", good}}).substr(0, 200)), 400,
       "multipart"},
      {"form field without a file",
       post("/v1/classify", kFormType,
            "--" + kBoundary + "\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n--" + kBoundary +
                "--\r\n"),
       400, "holds no file"},
      {"empty form", post("/v1/classify", kFormType, "--" + kBoundary + "--\r\n"), 400, "multipart"},
      {"empty body", post("/v1/classify", "image/jpeg", ""), 400, "empty"},
      {"bad topk", post("/v1/classify?topk=zero", "image/jpeg", good), 400, "topk"},
      {"unknown parameter", post("/v1/classify?k=3", "image/jpeg", good), 400, "unknown query parameter 'k'"},
      {"block out of range", post("/v1/embed?layers=9", "image/jpeg", good), 400, "out of range"},
      {"unknown pooling", post("/v1/embed?pool=max", "image/jpeg", good), 400, "pool=max"},
      {"unknown endpoint", get("/v2/classify"), 404, "no such endpoint"},
      {"GET on a POST endpoint", get("/v1/classify"), 405, "POST"},
      {"garbage", "NONSENSE\r\n\r\n", 400, "malformed"},
  };
  for (const auto& c : cases) {
    // A request line the library cannot parse is answered, then the connection waits for a next request (5 s).
    const Reply reply = ask(port, c.request, std::chrono::seconds(c.name == "garbage" ? 1 : 60));
    EXPECT_EQ(reply.status, c.status) << c.name << ": " << reply.body;
    EXPECT_NE(reply.body.find(c.says), std::string::npos) << c.name << ": " << reply.body;
    const Reply after = classify(port, good);
    EXPECT_EQ(after.status, 200) << "after " << c.name << ": " << after.body;
  }
  // A body cut short: the client sends part of what Content-Length promised, then waits. After --timeout-s without a
  // byte the server answers. (A client that half-closes its socket instead cannot be answered: cpp-httplib writes
  // nothing to a peer it sees closing; its place is freed all the same.)
  for (const bool half_close : {false, true}) {
    const int fd = connect_to(port);
    send_all(fd, "POST /v1/classify HTTP/1.1\r\nConnection: close\r\nContent-Type: image/jpeg\r\nContent-Length: 5000\r\n\r\n" +
                     good.substr(0, 100));
    if (half_close) shutdown(fd, SHUT_WR);
    const Reply cut = read_reply(fd, std::chrono::seconds(10));
    close(fd);
    if (!half_close) {
      EXPECT_EQ(cut.status, 400) << cut.body;
      EXPECT_NE(cut.body.find("ended before its Content-Length"), std::string::npos) << cut.body;
    }
    EXPECT_EQ(classify(port, good).status, 200);
  }
  const std::string metrics = ask(port, get("/metrics")).body;
  EXPECT_NE(metrics.find("vit_queue_depth 0"), std::string::npos) << metrics;
}

TEST(Serve, AFullQueueAnswers503AndASlowClientIsDroppedWithItsPlaceFreed) {
  ServeOptions options;
  options.batching.max_queue = 1;
  options.timeout_s = 1;
  Running running(options);
  const int port = running.port;
  const std::string good = image_bytes(32, 32, 6);
  // A client that sends its headers and part of its body, then nothing: it holds the only place.
  const int slow = connect_to(port);
  send_all(slow, "POST /v1/classify HTTP/1.1\r\nConnection: close\r\nContent-Type: image/jpeg\r\nContent-Length: " +
                     std::to_string(good.size()) + "\r\n\r\n" + good.substr(0, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const Reply full = classify(port, good);
  EXPECT_EQ(full.status, 503) << full.body;
  EXPECT_EQ(full.headers.at("retry-after"), "1");
  EXPECT_NE(full.body.find("--max-queue 1"), std::string::npos) << full.body;
  // After --timeout-s the slow client is dropped (its read times out) and its place is free again.
  const Reply dropped = read_reply(slow, std::chrono::seconds(10));
  close(slow);
  EXPECT_EQ(dropped.status, 400) << dropped.body;
  EXPECT_EQ(classify(port, good).status, 200);
  // A client that keeps sending, too slowly: its body is refused once --timeout-s has passed since it began.
  const int trickle = connect_to(port);
  send_all(trickle, "POST /v1/classify HTTP/1.1\r\nConnection: close\r\nContent-Type: image/jpeg\r\nContent-Length: " +
                        std::to_string(good.size()) + "\r\n\r\n");
  for (int i = 0; i < 8; ++i) {
    if (!send_all(trickle, good.substr(i, 1))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  const Reply late = read_reply(trickle, std::chrono::seconds(10));
  close(trickle);
  EXPECT_EQ(late.status, 408) << late.body;
  EXPECT_NE(late.body.find("--timeout-s"), std::string::npos) << late.body;
  EXPECT_EQ(classify(port, good).status, 200);
}

TEST(Serve, AnApiKeyGuardsEveryEndpointButTheProbes) {
  ServeOptions options;
  options.api_key = "s3cret-key";
  Running running(options);
  const int port = running.port;
  const std::string image = image_bytes(32, 32, 8);
  EXPECT_EQ(ask(port, post("/v1/classify", "image/jpeg", image)).status, 401);
  const Reply wrong = ask(port, post("/v1/classify", "image/jpeg", image, "Authorization: Bearer s3cret-kez\r\n"));
  EXPECT_EQ(wrong.status, 401);
  EXPECT_NE(wrong.body.find("wrong API key"), std::string::npos);
  EXPECT_EQ(ask(port, post("/v1/classify", "image/jpeg", image, "X-API-Key: s3cret\r\n")).status, 401);
  EXPECT_EQ(ask(port, post("/v1/classify", "image/jpeg", image, "Authorization: Bearer s3cret-key\r\n")).status,
            200);
  EXPECT_EQ(ask(port, post("/v1/embed", "image/jpeg", image, "X-API-Key: s3cret-key\r\n")).status, 200);
  EXPECT_EQ(ask(port, get("/v1/model")).status, 401);
  EXPECT_EQ(ask(port, get("/metrics")).status, 401);
  EXPECT_EQ(ask(port, get("/metrics", "X-API-Key: s3cret-key\r\n")).status, 200);
  EXPECT_EQ(ask(port, get("/healthz")).status, 200);
  EXPECT_EQ(ask(port, get("/readyz")).status, 200);
}

// Clients that ask before sending a body (Expect: 100-continue, as curl does over 1 MiB) are refused before they send
// it, or told to go on.
TEST(Serve, ExpectContinueRefusesBeforeTheBodyOrLetsItCome) {
  ServeOptions options;
  options.max_body_bytes = 1 << 20;
  options.api_key = "k";
  Running running(options);
  const std::string image = image_bytes(32, 32, 12);
  auto headers = [](size_t length, const std::string& extra) {
    return "POST /v1/classify HTTP/1.1\r\nConnection: close\r\nContent-Type: image/jpeg\r\nExpect: 100-continue\r\n"
           "Content-Length: " + std::to_string(length) + "\r\n" + extra + "\r\n";
  };
  const Reply big = ask(running.port, headers(size_t{4} << 20, "X-API-Key: k\r\n"), std::chrono::seconds(5));
  EXPECT_EQ(big.status, 413) << big.body;
  EXPECT_NE(big.body.find("--max-body-mb"), std::string::npos) << big.body;
  const Reply keyless = ask(running.port, headers(image.size(), ""), std::chrono::seconds(5));
  EXPECT_EQ(keyless.status, 401) << keyless.body;
  // Told to continue, the client sends its body and gets its answer.
  const int fd = connect_to(running.port);
  send_all(fd, headers(image.size(), "X-API-Key: k\r\n"));
  std::string interim(25, '\0');
  ASSERT_EQ(recv(fd, interim.data(), interim.size(), MSG_WAITALL), 25);
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  send_all(fd, image);
  const Reply answer = read_reply(fd);
  close(fd);
  EXPECT_EQ(answer.status, 200) << answer.body;
}

// ---- the command ----

// `vit serve` on a free port with its stderr in `log`; returns its pid once it logs "ready", and its port.
pid_t start_vit_serve(const std::string& arguments, const std::string& log, int* port) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string command = std::string("exec '") + VIT_BINARY + "' serve --port 0 " + arguments + " 2>'" + log + "'";
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  std::smatch match;
  while (Clock::now() < deadline) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (std::regex_search(text, match, std::regex("ready: http://127\\.0\\.0\\.1:([0-9]+)"))) {
      *port = std::stoi(match[1]);
      return pid;
    }
    if (waitpid(pid, nullptr, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  std::ifstream in(log);
  ADD_FAILURE() << "vit serve did not get ready:\n" << std::string(std::istreambuf_iterator<char>(in), {});
  return -1;
}

TEST(ServeCli, ABusyPortOrAnEmptyKeyFileIsOneLineAndAnErrorStatus) {
  const test::TempDir dir;
  const std::string model = "--checkpoint '" + test::data_path("tiny32/weights.safetensors") + "' --config '" +
                            test::write_tiny32_config(dir) + "'";
  // A port already taken (without SO_REUSEPORT, the second server is refused, never sharing it).
  const int taken = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(listen(taken, 1), 0);
  socklen_t length = sizeof address;
  getsockname(taken, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  const auto busy = test::run_vit("serve --threads 1 --port " + std::to_string(port) + " " + model);
  close(taken);
  EXPECT_EQ(busy.status, 1) << busy.errors;
  EXPECT_NE(busy.errors.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos) << busy.errors;
  test::write_bytes(dir / "key", "\n");
  const auto keyless = test::run_vit("serve --api-key-file '" + dir / "key" + "' " + model);
  EXPECT_EQ(keyless.status, 2) << keyless.errors;
  EXPECT_NE(keyless.errors.find("the file is empty"), std::string::npos) << keyless.errors;
}

TEST(ServeCli, SigtermDuringLoadAnswersEveryRequestReadThenExitsZero) {
  const test::TempDir dir;
  const std::string config = test::write_tiny32_config(dir);
  int port = 0;
  const pid_t pid = start_vit_serve("--threads 1 --checkpoint '" + test::data_path("tiny32/weights.safetensors") +
                                        "' --config '" + config + "'",
                                    dir / "serve.log", &port);
  ASSERT_GT(pid, 0);
  const std::string image = image_bytes(64, 48, 9);
  std::atomic<bool> signalled{false};
  std::atomic<int> answered{0}, unanswered_after_send{0}, refused{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&] {
      for (;;) {
        const int fd = connect_to(port);
        if (fd < 0) {  // no longer accepting
          ++refused;
          return;
        }
        const bool sent = send_all(fd, post("/v1/classify", "image/jpeg", image));
        const Reply reply = read_reply(fd);
        close(fd);
        if (reply.status == 200) {
          ++answered;
        } else if (reply.status != 0) {
          ADD_FAILURE() << "status " << reply.status << ": " << reply.body;
          return;
        } else {
          if (sent && !signalled) ADD_FAILURE() << "a request went unanswered before SIGTERM";
          ++unanswered_after_send;
          return;
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  signalled = true;
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  for (auto& client : clients) client.join();
  std::ifstream in(dir / "serve.log");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
  std::smatch counts;
  ASSERT_TRUE(std::regex_search(log, counts, std::regex("stopped: ([0-9]+) requests read, ([0-9]+) answered"))) << log;
  std::cout << "answered " << answered << " (server: read " << counts[1] << ", answered " << counts[2]
            << "); connections closed unread after SIGTERM " << unanswered_after_send << ", refused " << refused
            << "\n";
  EXPECT_EQ(counts[1], counts[2]) << log;
  EXPECT_EQ(std::stoi(counts[2]), answered.load()) << "every request the server read reached its client";
  EXPECT_GT(answered.load(), 6);
}

}  // namespace
}  // namespace vit
