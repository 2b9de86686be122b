// A small HTTP/1.1 client for tests of the project's HTTP servers (and of
// llama.cpp's llama-server): one request per connection, the whole answer
// (chunked bodies decoded), within a timeout. Built on the same
// BlockingStream as the service client.
#pragma once

#include <boost/beast/http.hpp>

#include <optional>
#include <string>

#include "service/blocking_stream.h"

namespace testing_http {

struct Answer {
  int status = 0;
  std::string body;
  std::string content_type;
  std::string retry_after;
};

class Client {
 public:
  Client(std::string host, int port, int timeout_ms = 60000)
      : host_(std::move(host)), port_(port), timeout_ms_(timeout_ms) {}
  // Every request carries "Authorization: Bearer <key>".
  Client& Bearer(std::string key) {
    bearer_ = std::move(key);
    return *this;
  }

  std::optional<Answer> Get(const std::string& target) const { return Call(boost::beast::http::verb::get, target, "", ""); }
  std::optional<Answer> Post(const std::string& target, const std::string& body, const std::string& type) const {
    return Call(boost::beast::http::verb::post, target, body, type);
  }

  // nullopt when no whole answer came (no server, a timeout, a broken answer).
  std::optional<Answer> Call(boost::beast::http::verb verb, const std::string& target, const std::string& body,
                             const std::string& type) const {
    namespace http = boost::beast::http;
    cachegen::BlockingStream s;
    if (s.Connect(host_, port_, timeout_ms_)) return std::nullopt;
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, host_);
    req.set(http::field::connection, "close");
    if (!type.empty()) req.set(http::field::content_type, type);
    if (!bearer_.empty()) req.set(http::field::authorization, "Bearer " + bearer_);
    req.body() = body;
    req.prepare_payload();
    if (s.Run(timeout_ms_, [&](auto done) { http::async_write(s.socket(), req, done); })) return std::nullopt;
    boost::beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(1u << 30);
    if (s.Run(timeout_ms_, [&](auto done) { http::async_read(s.socket(), buffer, parser, done); }))
      return std::nullopt;
    Answer a;
    a.status = parser.get().result_int();
    a.body = parser.get().body();
    a.content_type = std::string(parser.get()[http::field::content_type]);
    a.retry_after = std::string(parser.get()[http::field::retry_after]);
    return a;
  }

 private:
  std::string host_;
  int port_;
  int timeout_ms_;
  std::string bearer_;
};

}  // namespace testing_http
