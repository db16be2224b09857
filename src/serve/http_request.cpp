// What `vit serve` reads from an HTTP request (serve/http_request.h): checks, query parameters, bodies under limits.
#include "serve/http_request.h"

#include <cctype>
#include <chrono>
#include <optional>

#include "util/text.h"

namespace vit::serve_http {
namespace {

using Clock = std::chrono::steady_clock;

// Equal keys, in a time that depends on the expected key's length only, never on where a guess first differs.
bool same_key(const std::string& given, const std::string& key) {
  volatile unsigned char difference = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    difference = difference | (g ^ static_cast<unsigned char>(key[i]));
  }
  return difference == 0;
}

bool is_image_type(const std::string& type) {
  return type.rfind("image/", 0) == 0 || type == "application/octet-stream";
}

}  // namespace

std::string json_text(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // class names may not be UTF-8
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(json_text({{"error", printable(message)}}), "application/json");
  if (status == 503) res.set_header("Retry-After", "1");
}

// The media type of a Content-Type value, lower case, without parameters.
std::string media_type(const std::string& content_type) {
  std::string type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
  for (auto& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return type;
}

// A query parameter as a whole number in [low, high]; `fallback` when absent.
int64_t int_param(const httplib::Request& req, const std::string& name, int64_t fallback, int64_t low, int64_t high) {
  if (!req.has_param(name)) return fallback;
  const std::string text = req.get_param_value(name);
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoll(text) < low || std::stoll(text) > high) {
    throw HttpError(400, name + "=" + text + " is not a whole number in " + std::to_string(low) + ".." +
                             std::to_string(high));
  }
  return std::stoll(text);
}

bool flag_param(const httplib::Request& req, const std::string& name) {
  if (!req.has_param(name)) return false;
  const std::string text = req.get_param_value(name);
  if (text == "1" || text == "true" || text.empty()) return true;
  if (text == "0" || text == "false") return false;
  throw HttpError(400, name + "=" + text + " is not 1, true, 0 or false");
}

void check_params(const httplib::Request& req, std::initializer_list<const char*> known) {
  for (const auto& [name, value] : req.params) {
    bool ok = false;
    std::string names;
    for (const char* k : known) {
      ok = ok || name == k;
      names += names.empty() ? k : std::string(", ") + k;
    }
    if (!ok) throw HttpError(400, "unknown query parameter '" + name + "' (known: " + names + ")");
  }
}

void check_key(const httplib::Request& req, const RequestLimits& options) {
  if (options.api_key.empty()) return;
  std::string given = req.get_header_value("X-API-Key");
  const std::string authorization = req.get_header_value("Authorization");
  if (authorization.rfind("Bearer ", 0) == 0) given = authorization.substr(7);
  if (given.empty()) throw HttpError(401, "this server needs an API key: Authorization: Bearer KEY or X-API-Key");
  if (!same_key(given, options.api_key)) throw HttpError(401, "wrong API key");
}

void check_image_request(const httplib::Request& req, const RequestLimits& options, bool ready) {
  check_key(req, options);
  if (!ready) throw HttpError(503, "the model is still warming up");
  const bool chunked = media_type(req.get_header_value("Transfer-Encoding")) == "chunked";
  if (!chunked && !req.has_header("Content-Length")) {
    throw HttpError(411, "a request body needs a Content-Length (or chunked transfer encoding)");
  }
  if (req.has_header("Content-Length") &&
      req.get_header_value<uint64_t>("Content-Length") > static_cast<uint64_t>(options.max_body_bytes)) {
    throw HttpError(413, "the body of " + req.get_header_value("Content-Length") + " bytes is over --max-body-mb (" +
                             std::to_string(options.max_body_bytes >> 20) + " MiB)");
  }
  if (req.is_multipart_form_data()) return;
  const std::string type = media_type(req.get_header_value("Content-Type"));
  if (!is_image_type(type)) {
    throw HttpError(415, "Content-Type " + (type.empty() ? std::string("(none)") : type) +
                             " is not an image: send one image as image/jpeg, image/png, ... (curl: -H "
                             "'Content-Type: image/jpeg' --data-binary @FILE), or files as multipart/form-data "
                             "(curl -F image=@FILE)");
  }
}

void drain(const httplib::Request& req, const httplib::ContentReader& reader, httplib::Response& res,
           const RequestLimits& options) {
  const bool small = req.has_header("Content-Length") &&
                     req.get_header_value<uint64_t>("Content-Length") <=
                         static_cast<uint64_t>(options.max_body_bytes);
  if (!small) {
    res.set_header("Connection", "close");
    return;
  }
  const auto deadline = Clock::now() + std::chrono::seconds(options.timeout_s);
  auto drop = [&](const char*, size_t) { return Clock::now() < deadline; };
  const int status = res.status;
  const bool whole = req.is_multipart_form_data()
                         ? reader([](const httplib::MultipartFormData&) { return true; }, drop)
                         : reader(drop);
  if (!whole) res.set_header("Connection", "close");
  res.status = status;
}

std::vector<Upload> read_uploads(const httplib::Request& req, const httplib::ContentReader& reader,
                                 httplib::Response& res, const RequestLimits& options) {
  const auto deadline = Clock::now() + std::chrono::seconds(options.timeout_s);
  std::vector<Upload> uploads;
  int64_t total = 0;
  std::optional<HttpError> failure;
  auto take = [&](const char* data, size_t n) {
    total += static_cast<int64_t>(n);
    if (total > options.max_body_bytes) {
      failure.emplace(413, "the body is over --max-body-mb (" + std::to_string(options.max_body_bytes >> 20) +
                               " MiB)");
    } else if (Clock::now() > deadline) {
      failure.emplace(408, "the body did not arrive within --timeout-s (" + std::to_string(options.timeout_s) +
                               " s)");
    } else if (uploads.empty()) {
      failure.emplace(400, "form data before the first part");
    }
    if (failure) return false;
    uploads.back().bytes.append(data, n);
    return true;
  };
  bool whole = false;
  if (req.is_multipart_form_data()) {
    whole = reader(
        [&](const httplib::MultipartFormData& part) {
          if (part.filename.empty() && !is_image_type(media_type(part.content_type))) {
            failure.emplace(400, "form field '" + part.name +
                                     "' holds no file: send images as files (curl -F image=@FILE)");
            return false;
          }
          uploads.push_back({part.filename.empty() ? part.name : part.filename, {}});
          return true;
        },
        take);
  } else {
    uploads.push_back({"body", {}});
    whole = reader(take);
  }
  if (!whole) {
    res.set_header("Connection", "close");  // the rest of a body cut short cannot be told from a next request
    if (failure) throw *failure;
    if (res.status == 413) throw HttpError(413, "the body is over --max-body-mb");
    const std::string why = "ended before its Content-Length, or nothing arrived for --timeout-s (" +
                            std::to_string(options.timeout_s) + " s)";
    throw HttpError(400, req.is_multipart_form_data() ? "the multipart form is malformed, or the body " + why
                                                      : "the body " + why);
  }
  if (uploads.empty()) throw HttpError(400, "the form holds no file: send images as files (curl -F image=@FILE)");
  for (const auto& upload : uploads) {
    if (upload.bytes.empty()) throw HttpError(400, printable(upload.name) + ": empty: no image was sent");
  }
  return uploads;
}

}  // namespace vit::serve_http
