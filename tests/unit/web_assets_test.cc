// The coordinator's page is embedded in the binary: the pages and the vendored uPlot files are
// found under their URL paths with the content types browsers need, and nothing else is.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "web/web_assets.h"

namespace agora::web {
namespace {

std::string read_source(const std::string& relative) {
  std::ifstream in(std::string(AGORA_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(WebAssets, RootIsTheIndexPage) {
  const Asset* root = find_asset("/");
  const Asset* index = find_asset("/index.html");
  ASSERT_NE(root, nullptr);
  ASSERT_EQ(root, index);
  EXPECT_EQ(index->content_type, "text/html; charset=utf-8");
  EXPECT_NE(index->body.find("<!doctype html>"), std::string_view::npos);
  EXPECT_EQ(find_asset(""), index);
  EXPECT_EQ(find_asset("/?refresh=1"), index);
}

TEST(WebAssets, PagesAreEmbeddedByteForByte) {
  for (const char* name : {"index.html", "app.js", "style.css"}) {
    const Asset* asset = find_asset(std::string("/") + name);
    ASSERT_NE(asset, nullptr) << name;
    EXPECT_EQ(asset->body, read_source(std::string("web/") + name)) << name;
  }
  EXPECT_EQ(find_asset("/app.js")->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(find_asset("/style.css")->content_type, "text/css; charset=utf-8");
}

TEST(WebAssets, VendoredUplotIsServed) {
  const Asset* js = find_asset("/vendor/uPlot.iife.min.js");
  const Asset* css = find_asset("/vendor/uPlot.min.css");
  ASSERT_NE(js, nullptr);
  ASSERT_NE(css, nullptr);
  EXPECT_EQ(js->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(css->content_type, "text/css; charset=utf-8");
  EXPECT_NE(js->body.find("uPlot"), std::string_view::npos);
  EXPECT_GT(js->body.size(), 10000u);
  EXPECT_NE(css->body.find(".uplot"), std::string_view::npos);
}

TEST(WebAssets, UnknownPathsAreNotFound) {
  EXPECT_EQ(find_asset("/missing.html"), nullptr);
  EXPECT_EQ(find_asset("/vendor/"), nullptr);
  EXPECT_EQ(find_asset("/../CMakeLists.txt"), nullptr);
  EXPECT_EQ(find_asset("index.html"), nullptr);
}

TEST(WebAssets, PathsAreUniqueAndTyped) {
  std::set<std::string_view> paths;
  for (const Asset& asset : all_assets()) {
    EXPECT_TRUE(paths.insert(asset.path).second) << asset.path;
    EXPECT_EQ(asset.path.front(), '/');
    EXPECT_FALSE(asset.content_type.empty()) << asset.path;
    EXPECT_FALSE(asset.body.empty()) << asset.path;
  }
}

}  // namespace
}  // namespace agora::web
