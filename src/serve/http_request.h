// What `vit serve` reads from an HTTP request before the model sees it (src/serve/server.cpp's routes use these): the
// refusals as HTTP statuses, the API key, the query parameters, and the images of a body read under the size and
// time limits, or a refused body drained so that its connection stays usable.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include <httplib.h>  // with the compile definitions Debian's library was built with (CMakeLists.txt)
#include <nlohmann/json.hpp>

namespace vit::serve_http {

// What a request may be: vit serve's --max-body-mb, --timeout-s and --api-key (serve/server.h's ServeOptions).
struct RequestLimits {
  int64_t max_body_bytes = 0;
  int timeout_s = 0;
  std::string api_key;  // "" = none needed
};

// A request refused or failed: its HTTP status and the one-line reason sent back as {"error": ...}.
struct HttpError : std::runtime_error {
  int status;
  HttpError(int code, const std::string& message) : std::runtime_error(message), status(code) {}
};

// JSON for an answer; bytes that are not UTF-8 (class names may hold them) replaced.
std::string json_text(const nlohmann::json& value);
// Sets the status and {"error": message} (and Retry-After on 503).
void send_error(httplib::Response& res, int status, const std::string& message);

// The media type of a Content-Type (or Accept) value, lower case, without parameters.
std::string media_type(const std::string& content_type);
// A query parameter as a whole number in [low, high]; `fallback` when absent. Throws HttpError 400.
int64_t int_param(const httplib::Request& req, const std::string& name, int64_t fallback, int64_t low, int64_t high);
// A query parameter as 1/true/(empty) or 0/false; false when absent. Throws HttpError 400.
bool flag_param(const httplib::Request& req, const std::string& name);
// Throws HttpError 400 naming a query parameter that is not `known`, and the known ones.
void check_params(const httplib::Request& req, std::initializer_list<const char*> known);

// Throws HttpError 401 unless the request carries options.api_key (Bearer or X-API-Key); nothing without a key.
void check_key(const httplib::Request& req, const RequestLimits& options);
// Throws HttpError for what can be refused from the headers alone: key, readiness, length, content type.
void check_image_request(const httplib::Request& req, const RequestLimits& options, bool ready);

struct Upload {
  std::string name;   // the form's file name (or field name); "body" for a raw body. Only ever echoed back.
  std::string bytes;  // the encoded image
};

// Reads and drops the body of a refused request, so that its connection stays usable; a body over the limit is
// not read (the connection closes instead).
void drain(const httplib::Request& req, const httplib::ContentReader& reader, httplib::Response& res,
           const RequestLimits& options);
// The images of a raw body (one) or of a multipart form (each file), read whole within options.timeout_s and
// options.max_body_bytes. Throws HttpError (400, 408, 413) saying what was wrong; a body cut short closes the
// connection.
std::vector<Upload> read_uploads(const httplib::Request& req, const httplib::ContentReader& reader,
                                 httplib::Response& res, const RequestLimits& options);

}  // namespace vit::serve_http
