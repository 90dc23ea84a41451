// HttpServer over a real socket: routes, the fallback, query strings, 404, a handler's
// exception, port 0, a port in use, and bad addresses.
#include "agora/obs/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "agora/core/error.h"

namespace agora::obs {
namespace {

TEST(HttpServer, ServesRoutesAndFallback) {
  HttpServer server({"127.0.0.1", 0});
  server.get("/hello", [](const HttpRequest& r) {
    return HttpResponse{200, "text/plain", "hi " + (r.query.count("who") ? r.query.at("who") : "")};
  });
  server.get("/boom", [](const HttpRequest&) -> HttpResponse { throw std::runtime_error("x"); });
  server.fallback([](const HttpRequest& r) {
    if (r.path == "/asset.css") return HttpResponse{200, "text/css", "body{}"};
    return HttpResponse{404, "text/plain", "no"};
  });
  server.start();
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), "http://127.0.0.1:" + std::to_string(server.port()));

  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/hello?who=a%20b");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "hi a b");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain");
  res = client.Get("/asset.css");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "body{}");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/css");
  res = client.Get("/missing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  res = client.Get("/boom");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
}

TEST(HttpServer, NotFoundWithoutFallback) {
  HttpServer server({"127.0.0.1", 0});
  server.start();
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
}

TEST(HttpServer, PortInUseIsAClearError) {
  HttpServer first({"127.0.0.1", 0});
  first.start();
  HttpServer second({"127.0.0.1", first.port()});
  try {
    second.start();
    FAIL() << "binding a port in use succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())),
              std::string::npos)
        << e.what();
  }
}

TEST(HttpServer, StopsCleanly) {
  int port = 0;
  {
    HttpServer server({"127.0.0.1", 0});
    server.get("/x", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "x"}; });
    server.start();
    port = server.port();
  }
  // The port is free again once the server is gone.
  HttpServer again({"127.0.0.1", port});
  EXPECT_NO_THROW(again.start());
}

TEST(HttpServer, ParsesAddresses) {
  const HttpAddress a = parse_http_address("0.0.0.0:7480", "--http");
  EXPECT_EQ(a.host, "0.0.0.0");
  EXPECT_EQ(a.port, 7480);
  EXPECT_EQ(parse_http_address("localhost:0", "--http").port, 0);
  for (const char* bad : {"7480", ":7480", "host:", "host:x", "host:70000", "host:-1", ""}) {
    try {
      parse_http_address(bad, "--http");
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--http"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("HOST:PORT"), std::string::npos) << e.what();
    }
  }
}

TEST(HttpServer, RefusesRequestBodies) {
  HttpServer server({"127.0.0.1", 0});
  server.get("/x", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "x"}; });
  server.start();
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Post("/x", std::string(64 << 10, 'b'), "application/octet-stream");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  res = client.Get("/x");  // and still serves
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(HttpServer, AnswersOnlyAllowedHosts) {
  HttpServer server({"127.0.0.1", 0}, HttpServerOptions{{"Agora.Example.org"}});
  server.get("/api/peers", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "p"}; });
  server.start();
  httplib::Client client("127.0.0.1", server.port());
  const auto status = [&](const std::string& host) {
    auto res = client.Get("/api/peers", httplib::Headers{{"Host", host}});
    return res ? res->status : -1;
  };
  EXPECT_EQ(status("attacker.example:" + std::to_string(server.port())), 421);
  EXPECT_EQ(status("attacker.example"), 421);
  EXPECT_EQ(status("127.0.0.1:" + std::to_string(server.port())), 200);
  EXPECT_EQ(status("localhost:80"), 200);
  EXPECT_EQ(status("[::1]:80"), 200);
  EXPECT_EQ(status("10.1.2.3"), 200);
  EXPECT_EQ(status("agora.example.ORG:443"), 200);
  EXPECT_EQ(status(""), 421);
  EXPECT_EQ(status("[not-an-address]"), 421);
}

TEST(HttpServer, AllowedHostsFromTheEnvironment) {
  setenv(kAllowedHostsVariable, " one.example , two.example", 1);
  HttpServer server({"127.0.0.1", 0});
  unsetenv(kAllowedHostsVariable);
  server.get("/x", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "x"}; });
  server.start();
  httplib::Client client("127.0.0.1", server.port());
  for (const char* host : {"one.example", "two.example:7480"}) {
    auto res = client.Get("/x", httplib::Headers{{"Host", host}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << host;
  }
  auto res = client.Get("/x", httplib::Headers{{"Host", "three.example"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 421);
}

TEST(HttpServer, IdleConnectionsDoNotHoldEveryWorker) {
  HttpServer server({"127.0.0.1", 0});
  server.get("/x", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "x"}; });
  server.start();
  // More idle connections than workers, each sending nothing: each frees its worker within
  // the 1 s keep-alive wait (a guard: this held before the hardening too).
  std::vector<int> idle;
  for (int i = 0; i < kHttpWorkers + 4; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto started = std::chrono::steady_clock::now();
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/x");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_LT(took, 1.5);
  for (int fd : idle) close(fd);
}

}  // namespace
}  // namespace agora::obs
