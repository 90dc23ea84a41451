#include "agora/obs/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "agora/core/error.h"

namespace agora::obs {

HttpAddress parse_http_address(std::string_view text, std::string_view flag) {
  const auto colon = text.rfind(':');
  const auto bad = [&](std::string_view why) -> HttpAddress {
    fail(
        "{} {}: {}; allowed: HOST:PORT with PORT 0-65535 (0 = any free port), e.g. "
        "0.0.0.0:7480 or 127.0.0.1:0",
        flag, text.empty() ? "\"\"" : std::string(text), why);
  };
  if (colon == std::string_view::npos) return bad("no ':PORT'");
  const std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  if (host.empty()) return bad("no host before ':'");
  int value = -1;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value < 0 ||
      value > 65535) {
    return bad(fmt::format("'{}' is not a port number", port));
  }
  return {std::string(host), value};
}

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_ipv4(std::string_view host) {
  in_addr addr{};
  return inet_pton(AF_INET, std::string(host).c_str(), &addr) == 1;
}

}  // namespace

bool http_host_allowed(std::string_view host_header, std::string_view bound_host,
                       const HttpServerOptions& options) {
  std::string_view host = host_header;
  if (host.starts_with('[')) {
    // An IPv6 literal, "[::1]:7480": an address, never a name that could be rebound.
    const auto close = host.find(']');
    if (close == std::string_view::npos) return false;
    in6_addr addr{};
    return inet_pton(AF_INET6, std::string(host.substr(1, close - 1)).c_str(), &addr) == 1;
  }
  if (const auto colon = host.rfind(':'); colon != std::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (host.empty()) return false;
  const std::string name = lower(host);
  if (is_ipv4(name) || name == "localhost" || name == lower(bound_host)) return true;
  return std::any_of(options.allowed_hosts.begin(), options.allowed_hosts.end(),
                     [&](const std::string& allowed) { return lower(allowed) == name; });
}

HttpServer::HttpServer(HttpAddress address, HttpServerOptions options)
    : address_(std::move(address)),
      options_(std::move(options)),
      server_(std::make_unique<httplib::Server>()) {
  if (const char* names = std::getenv(kAllowedHostsVariable)) {
    std::string_view rest = names;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      std::string_view name = rest.substr(0, comma);
      while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
      while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
      if (!name.empty()) options_.allowed_hosts.emplace_back(name);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }
}

HttpServer::~HttpServer() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

void HttpServer::get(std::string path, HttpHandler handler) {
  routes_[std::move(path)] = std::move(handler);
}

void HttpServer::fallback(HttpHandler handler) {
  fallback_ = std::move(handler);
}

std::string HttpServer::url() const {
  const std::string host = address_.host == "0.0.0.0" ? "127.0.0.1" : address_.host;
  return fmt::format("http://{}:{}", host, port_);
}

void HttpServer::start() {
  // httplib parks a worker on each idle keep-alive connection; a browser opens about six at once
  // for the page's assets, so a short keep-alive and a few spare workers keep scrapes answered.
  server_->new_task_queue = [] { return new httplib::ThreadPool(kHttpWorkers); };
  server_->set_keep_alive_timeout(1);
  server_->set_keep_alive_max_count(kHttpKeepAliveRequests);
  server_->set_read_timeout(kHttpReadTimeoutSeconds, 0);
  server_->set_write_timeout(kHttpWriteTimeoutSeconds, 0);
  // Every route is a GET: a body is refused (413) from its Content-Length, before it is read.
  server_->set_payload_max_length(kMaxHttpBodyBytes);
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (http_host_allowed(req.get_header_value("Host"), address_.host, options_)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 421;
    res.set_content(
        "this server does not answer to that Host; allowed: an IP address, localhost, or a name "
        "the operator configured\n",
        "text/plain; charset=utf-8");
    return httplib::Server::HandlerResponse::Handled;
  });
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));  // not SO_REUSEPORT
  });
  server_->Get("/.*", [this](const httplib::Request& req, httplib::Response& res) {
    HttpRequest request;
    request.path = req.path;
    for (const auto& [key, value] : req.params) request.query[key] = value;
    HttpResponse response;
    const auto route = routes_.find(req.path);
    try {
      if (route != routes_.end()) {
        response = route->second(request);
      } else if (fallback_) {
        response = fallback_(request);
      } else {
        response = {404, "text/plain; charset=utf-8", "not found\n"};
      }
    } catch (const std::exception& e) {
      response = {500, "text/plain; charset=utf-8", fmt::format("internal error: {}\n", e.what())};
    }
    res.status = response.status;
    res.set_content(std::move(response.body), response.content_type.c_str());
    res.set_header("Cache-Control", "no-store");
  });
  errno = 0;
  const int bound =
      address_.port == 0
          ? server_->bind_to_any_port(address_.host)
          : (server_->bind_to_port(address_.host, address_.port) ? address_.port : -1);
  if (bound < 0) {
    const int error = errno;
    fail(
        "cannot serve HTTP on {}:{}: {} (is another process using the port? is the host an "
        "address of this machine?)",
        address_.host, address_.port, error != 0 ? std::strerror(error) : "bind failed");
  }
  port_ = bound;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() only takes effect once the loop runs; wait for it so the destructor cannot race it.
  for (int i = 0; i < 2000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace agora::obs
