// StatusServer: what every role that serves members shows behind --http, written once.
//
//   /metrics       the role's Prometheus registry, with the process's own metrics added
//   /api/<role>    the JSON the role published last (publish()), e.g. /api/swarm
//   /              the role's page, web/<role>.html, embedded in the binary; it reads
//                  /api/<role> from the browser, so the server never renders HTML itself
//   /<file>        the other embedded files the page loads (web/role_page.js, .css)
//
// Handlers run on the HTTP server's threads (obs/http_server.h, with its hardening: GET only,
// the Host allowlist, timeouts). They read only the snapshot publish() stored, under a mutex,
// and the registry, which is thread-safe: never the role's live state, which one thread owns.
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "agora/obs/http_server.h"
#include "agora/obs/metrics.h"

namespace agora::serve {

class StatusServer {
 public:
  // Binds `address` and serves. `role` names the API path and the page ("swarm": /api/swarm,
  // web/swarm.html), which must be embedded (web/CMakeLists.txt). Throws Error when the address
  // cannot be bound.
  StatusServer(const obs::HttpAddress& address, std::string role, obs::Registry& metrics);

  // Replaces what /api/<role> answers. Thread-safe.
  void publish(nlohmann::json status);

  // http://HOST:PORT, as a browser on this machine opens it.
  std::string url() const { return http_->url(); }

 private:
  std::string role_;
  obs::Registry& metrics_;
  std::mutex mutex_;
  std::string status_ = "{}";  // dumped once per publish, not once per request
  std::unique_ptr<obs::HttpServer> http_;
};

}  // namespace agora::serve
