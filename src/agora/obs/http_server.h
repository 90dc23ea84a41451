// HttpServer: a small HTTP server on its own threads, for /metrics, the coordinator's JSON API
// and its web page.
//
// A wrapper around cpp-httplib's Server that keeps httplib.h (8000 lines) out of every other
// translation unit and gives agora's error style: binding HOST:PORT happens in start(), and a
// failure is an Error naming the address and the likely cause. Port 0 picks a free port;
// port() reports the one bound. Handlers answer GET requests with (status, content type, body)
// and run on the server's worker threads, several at once: whatever they read must be
// thread-safe (the coordinator hands them an immutable snapshot, never its live state).
//
// Hardening, since the coordinator's page and a peer's /metrics face networks nobody controls:
//   - GET only: a request body over kMaxHttpBodyBytes is refused with 413 before it is read;
//   - Host allowlist: a request whose Host header names something other than an IP address,
//     localhost, the bound host or one of HttpServerOptions::allowed_hosts gets 421. This stops
//     DNS rebinding (a page on attacker.example whose name is made to resolve to this machine
//     would otherwise read /api/peers through the visitor's browser); an IP address cannot be
//     rebound, so scraping by address works without configuration. An operator who serves the
//     page under a DNS name adds that name (docs/monitoring.md);
//   - slow clients: kHttpWorkers workers; a read waits at most kHttpReadTimeoutSeconds for the
//     next bytes and a write kHttpWriteTimeoutSeconds; a keep-alive connection serves at most
//     kHttpKeepAliveRequests requests and idles at most 1 s. Idle connections free their worker
//     within seconds; a client that trickles a byte at a time can still hold one (cpp-httplib
//     has no whole-request deadline): see docs/monitoring.md for exposing the page publicly.
//
// What it promises: after start() returns, requests are served until the destructor, which
// stops accepting, waits for the handlers in flight and joins every thread. Unlike cpp-httplib's
// default, the socket is bound without SO_REUSEPORT, so a port another process listens on is an
// error instead of a silently shared port.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace httplib {
class Server;
}

namespace agora::obs {

struct HttpRequest {
  std::string path;
  std::map<std::string, std::string> query;  // ?a=1&b=2, decoded
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

inline constexpr size_t kMaxHttpBodyBytes = 1024;
inline constexpr int kHttpWorkers = 16;
inline constexpr int kHttpReadTimeoutSeconds = 2;
inline constexpr int kHttpWriteTimeoutSeconds = 5;
inline constexpr int kHttpKeepAliveRequests = 32;

struct HttpServerOptions {
  // Names (without port) this server answers to besides IP addresses, localhost and the bound
  // host, e.g. "agora.example.org"; compared case-insensitively. The names in the environment
  // variable kAllowedHostsVariable (comma-separated) are added: an operator serving the page
  // under a DNS name sets AGORA_HTTP_ALLOWED_HOSTS=agora.example.org.
  std::vector<std::string> allowed_hosts;
};
inline constexpr const char* kAllowedHostsVariable = "AGORA_HTTP_ALLOWED_HOSTS";

// True when a request's Host header value (with or without :port) is one `options` and the
// bound `host` allow (see above).
bool http_host_allowed(std::string_view host_header, std::string_view bound_host,
                       const HttpServerOptions& options);

// HOST:PORT, as given to a --http or --metrics flag.
struct HttpAddress {
  std::string host;
  int port = 0;
};

// Parses "HOST:PORT" (IPv4 address or name; port 0-65535, 0 = any free port). Throws Error
// naming `flag`, the value and what is allowed.
HttpAddress parse_http_address(std::string_view text, std::string_view flag);

class HttpServer {
 public:
  explicit HttpServer(HttpAddress address, HttpServerOptions options = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes, registered before start(): an exact path, and a fallback for every other GET path
  // (static assets); without a fallback other paths get 404.
  void get(std::string path, HttpHandler handler);
  void fallback(HttpHandler handler);

  // Binds and starts serving. Throws Error when the address cannot be bound.
  void start();

  int port() const { return port_; }
  // http://HOST:PORT, with 0.0.0.0 shown as 127.0.0.1 (what a browser on this machine opens).
  std::string url() const;

 private:
  HttpAddress address_;
  HttpServerOptions options_;
  int port_ = 0;
  std::unique_ptr<httplib::Server> server_;
  std::map<std::string, HttpHandler> routes_;
  HttpHandler fallback_;
  std::thread thread_;
};

}  // namespace agora::obs
