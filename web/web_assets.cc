#include "web/web_assets.h"

namespace agora::web {

const Asset* find_asset(std::string_view path) {
  if (auto query = path.find_first_of("?#"); query != std::string_view::npos) {
    path = path.substr(0, query);
  }
  if (path.empty() || path == "/") path = "/index.html";
  for (const Asset& asset : all_assets()) {
    if (asset.path == path) return &asset;
  }
  return nullptr;
}

}  // namespace agora::web
