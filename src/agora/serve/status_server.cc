#include "agora/serve/status_server.h"

#include "agora/core/error.h"
#include "web/web_assets.h"

namespace agora::serve {

StatusServer::StatusServer(const obs::HttpAddress& address, std::string role,
                           obs::Registry& metrics)
    : role_(std::move(role)), metrics_(metrics) {
  const web::Asset* page = web::find_asset("/" + role_ + ".html");
  if (page == nullptr) fail("no page web/{}.html is embedded for the role {}", role_, role_);
  obs::add_process_metrics(metrics_);
  http_ = std::make_unique<obs::HttpServer>(address);
  http_->get("/metrics", [this](const obs::HttpRequest&) {
    return obs::HttpResponse{200, std::string(obs::kPrometheusContentType), metrics_.render()};
  });
  http_->get("/api/" + role_, [this](const obs::HttpRequest&) {
    std::lock_guard lock(mutex_);
    return obs::HttpResponse{200, "application/json", status_};
  });
  http_->get("/", [page](const obs::HttpRequest&) {
    return obs::HttpResponse{200, std::string(page->content_type), std::string(page->body)};
  });
  // What the page loads: role_page.js and .css, and any other embedded file.
  http_->fallback([](const obs::HttpRequest& request) {
    const web::Asset* asset = web::find_asset(request.path);
    if (asset == nullptr) return obs::HttpResponse{404, "text/plain; charset=utf-8", "not found\n"};
    return obs::HttpResponse{200, std::string(asset->content_type), std::string(asset->body)};
  });
  http_->start();
}

void StatusServer::publish(nlohmann::json status) {
  std::string text = status.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard lock(mutex_);
  status_ = std::move(text);
}

}  // namespace agora::serve
