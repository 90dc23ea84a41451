// LinkShaper: bytes arrive intact and in order through delay, jitter and loss; delay and
// bandwidth are at least what the profile says; profiles parse and reject bad input clearly;
// stop() returns with connections open. Timing checks are lower bounds only: the machines that
// run these are shared and noisy, so nothing here asserts that anything is fast.
#include "agora/net/link_shaper.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "agora/core/error.h"

namespace agora::net {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int listen_local(uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(fd, 16) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length))
    throw std::runtime_error("cannot listen on loopback");
  port = ntohs(address.sin_port);
  return fd;
}

int connect_local(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0)
    throw std::runtime_error("cannot connect to loopback port " + std::to_string(port));
  return fd;
}

void send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("send failed");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Reads until EOF (or an error, e.g. a reset) and returns everything read.
std::string read_to_end(int fd) {
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return out;
    out.append(buffer, static_cast<size_t>(n));
  }
}

std::string random_bytes(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(size, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// A TCP server on loopback that serves `connections` connections one after the other: echo
// mode writes back whatever arrives and closes after the client's EOF; sink mode only counts.
class TestServer {
 public:
  enum Mode { kEcho, kSink };
  TestServer(Mode mode, int connections) : fd_(listen_local(port_)) {
    thread_ = std::thread([this, mode, connections] {
      for (int i = 0; i < connections; ++i) {
        const int client = ::accept(fd_, nullptr, nullptr);
        if (client < 0) return;
        char buffer[1 << 16];
        while (true) {
          const ssize_t n = ::recv(client, buffer, sizeof(buffer), 0);
          if (n <= 0) break;
          received_ += static_cast<size_t>(n);
          if (mode == kEcho) {
            try {
              send_all(client, buffer, static_cast<size_t>(n));
            } catch (const std::exception&) {
              break;
            }
          }
        }
        ::close(client);
      }
    });
  }
  ~TestServer() {
    ::shutdown(fd_, SHUT_RDWR);  // wakes an accept that no connection will satisfy
    thread_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }
  size_t received() const { return received_.load(); }

 private:
  uint16_t port_ = 0;
  int fd_;
  std::atomic<size_t> received_{0};
  std::thread thread_;
};

LinkShaperOptions options_to(uint16_t target_port, LinkProfile both) {
  LinkShaperOptions options;
  options.target_port = target_port;
  options.to_target = both;
  options.to_client = both;
  options.to_client.seed = both.seed + 1;
  return options;
}

// Sends `data` through the shaper to an echo server, concurrently reads the echo, returns it.
std::string echo_through(LinkShaper& shaper, const std::string& data) {
  const int fd = connect_local(shaper.port());
  std::thread sender([&] {
    send_all(fd, data.data(), data.size());
    ::shutdown(fd, SHUT_WR);  // the EOF travels through the shaper, the echo server closes
  });
  std::string echoed = read_to_end(fd);
  sender.join();
  ::close(fd);
  return echoed;
}

TEST(LinkShaper, PerfectLinkCarriesBytesIntactBothWays) {
  TestServer server(TestServer::kEcho, 2);
  LinkShaper shaper(options_to(server.port(), LinkProfile{}));
  EXPECT_NE(shaper.port(), 0);
  const std::string data = random_bytes(4 << 20, 1);
  EXPECT_TRUE(echo_through(shaper, data) == data);
  const std::string more = random_bytes(100000, 2);
  EXPECT_TRUE(echo_through(shaper, more) == more);
  const auto stats = shaper.stats();
  EXPECT_EQ(stats.connections_accepted, 2u);
  EXPECT_EQ(stats.bytes_to_target, data.size() + more.size());
  EXPECT_EQ(stats.bytes_to_client, data.size() + more.size());
  EXPECT_EQ(stats.segments_lost_to_target + stats.segments_lost_to_client, 0u);
}

TEST(LinkShaper, LossyJitteryLinkStillDeliversEverythingInOrder) {
  TestServer server(TestServer::kEcho, 1);
  const LinkProfile profile =
      parse_link_profile("rate=200mbit,delay=1ms,jitter=3ms,loss=3%,seed=5");
  LinkShaperOptions options = options_to(server.port(), profile);
  options.max_queued_bytes = 256 << 10;  // exercises the back-pressure path too
  LinkShaper shaper(options);
  const std::string data = random_bytes(1 << 20, 3);
  EXPECT_TRUE(echo_through(shaper, data) == data);
  const auto stats = shaper.stats();
  EXPECT_EQ(stats.bytes_to_target, data.size());
  EXPECT_EQ(stats.bytes_to_client, data.size());
  // 724 segments each way at 3%: about 22 losses; none at all would mean loss is not modelled.
  EXPECT_GT(stats.segments_lost_to_target, 0u);
  EXPECT_GT(stats.segments_lost_to_client, 0u);
}

TEST(LinkShaper, RoundTripTakesAtLeastTwiceTheOneWayDelay) {
  TestServer server(TestServer::kEcho, 1);
  LinkShaper shaper(options_to(server.port(), parse_link_profile("delay=100ms,jitter=20ms")));
  const int fd = connect_local(shaper.port());
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    send_all(fd, "x", 1);
    char reply = 0;
    ASSERT_EQ(::recv(fd, &reply, 1, MSG_WAITALL), 1);
    EXPECT_EQ(reply, 'x');
    EXPECT_GE(seconds_since(start), 0.2) << "round trip " << i;
  }
  ::close(fd);
}

TEST(LinkShaper, BandwidthIsAtMostTheRate) {
  TestServer server(TestServer::kSink, 1);
  const double rate = 16e6;  // 2 MB/s
  const size_t size = 1 << 20;
  LinkShaper shaper(options_to(server.port(), LinkProfile{.bandwidth_bits_per_second = rate}));
  const int fd = connect_local(shaper.port());
  const std::string data = random_bytes(size, 4);
  const auto start = Clock::now();
  send_all(fd, data.data(), data.size());
  while (server.received() < size) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GE(seconds_since(start), size * 8 / rate * 0.8);
  ::close(fd);
}

// The way benchmarks use it: a ZeroMQ socket connects to the shaper's port instead of the real
// one. Messages must survive delay, jitter and loss whole and in order.
TEST(LinkShaper, CarriesZeroMqMessagesBetweenPeers) {
  zmq::context_t context;
  zmq::socket_t router(context, zmq::socket_type::router);
  router.bind("tcp://127.0.0.1:*");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  const auto real_port = static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  LinkShaper shaper(
      options_to(real_port, parse_link_profile("rate=100mbit,delay=5ms,jitter=2ms,loss=2%")));
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::linger, 0);
  dealer.connect("tcp://127.0.0.1:" + std::to_string(shaper.port()));
  constexpr int kMessages = 20;
  for (int i = 0; i < kMessages; ++i) {
    const std::string body = random_bytes(50000, 100 + i);
    dealer.send(zmq::buffer(body), zmq::send_flags::none);
  }
  for (int i = 0; i < kMessages; ++i) {
    zmq::message_t identity, body;
    ASSERT_TRUE(router.recv(identity));
    ASSERT_TRUE(router.recv(body));
    EXPECT_TRUE(body.to_string() == random_bytes(50000, 100 + i)) << "message " << i;
    router.send(identity, zmq::send_flags::sndmore);
    router.send(body, zmq::send_flags::none);
  }
  for (int i = 0; i < kMessages; ++i) {
    zmq::message_t reply;
    ASSERT_TRUE(dealer.recv(reply));
    EXPECT_TRUE(reply.to_string() == random_bytes(50000, 100 + i)) << "reply " << i;
  }
  EXPECT_GT(shaper.stats().segments_lost_to_target + shaper.stats().segments_lost_to_client, 0u);
}

TEST(LinkShaper, StopWithOpenConnectionsReturns) {
  TestServer server(TestServer::kEcho, 3);
  auto shaper = std::make_unique<LinkShaper>(
      options_to(server.port(), parse_link_profile("rate=1mbit,delay=10s")));
  std::vector<int> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(connect_local(shaper->port()));
  const std::string data = random_bytes(1 << 20, 5);
  // Data in flight in both queues and in the kernel; one client stays idle.
  for (int i = 0; i < 2; ++i) ::send(clients[i], data.data(), data.size(), MSG_DONTWAIT);
  while (shaper->stats().connections_open < 3)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  shaper->stop();
  EXPECT_EQ(shaper->stats().connections_open, 0u);
  shaper->stop();  // idempotent
  for (int fd : clients) {
    read_to_end(fd);  // the shaper closed its end: EOF (or a reset), not a hang
    ::close(fd);
  }
  shaper.reset();
}

TEST(LinkShaper, DestructorWithOpenConnectionReturns) {
  TestServer server(TestServer::kEcho, 1);
  int fd = -1;
  {
    LinkShaper shaper(options_to(server.port(), parse_link_profile("delay=5s")));
    fd = connect_local(shaper.port());
    send_all(fd, "hello", 5);
    while (shaper.stats().connections_open < 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(read_to_end(fd), "");
  ::close(fd);
}

TEST(LinkShaper, UnreachableTargetClosesTheClient) {
  uint16_t dead_port = 0;
  ::close(listen_local(dead_port));  // a port nobody listens on any more
  LinkShaper shaper(options_to(dead_port, LinkProfile{}));
  const int fd = connect_local(shaper.port());
  EXPECT_EQ(read_to_end(fd), "");
  ::close(fd);
  EXPECT_EQ(shaper.stats().connect_failures, 1u);
}

TEST(LinkShaper, RejectsBadOptions) {
  LinkShaperOptions options;
  options.target_port = 1;
  options.to_client.loss = 1;
  EXPECT_THROW(LinkShaper{options}, Error);
  options.to_client.loss = 0;
  options.max_queued_bytes = 100;
  EXPECT_THROW(LinkShaper{options}, Error);
}

std::string error_of(const LinkProfile& profile) {
  try {
    validate(profile);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of(std::string_view spec) {
  try {
    parse_link_profile(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LinkProfile, ValidateNamesFieldValueAndRange) {
  EXPECT_EQ(error_of(LinkProfile{}), "");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(error_of(LinkProfile{.delay_seconds = -0.5}),
            "link profile: delay_seconds is -0.5; allowed: 0 to 3600 seconds");
  EXPECT_EQ(error_of(LinkProfile{.jitter_seconds = nan}),
            "link profile: jitter_seconds is nan; allowed: 0 to 3600 seconds");
  EXPECT_EQ(error_of(LinkProfile{.loss = 1}),
            "link profile: loss is 1; allowed: 0 <= loss < 1 (a probability: 1% is 0.01)");
  EXPECT_NE(error_of(LinkProfile{.loss = nan}), "");
  EXPECT_NE(error_of(LinkProfile{.loss = -0.1}), "");
  EXPECT_NE(error_of(LinkProfile{.bandwidth_bits_per_second = -1})
                .find("bandwidth_bits_per_second is -1; allowed: 0 (unlimited) or 8 and up"),
            std::string::npos);
  EXPECT_NE(error_of(LinkProfile{.bandwidth_bits_per_second = INFINITY}), "");
  EXPECT_NE(error_of(LinkProfile{.bandwidth_bits_per_second = nan}), "");
}

TEST(LinkProfile, ParsesCompactSpecs) {
  const LinkProfile p = parse_link_profile("rate=20mbit, delay=50ms,jitter=5ms,loss=1%,seed=7");
  EXPECT_DOUBLE_EQ(p.bandwidth_bits_per_second, 20e6);
  EXPECT_DOUBLE_EQ(p.delay_seconds, 0.05);
  EXPECT_DOUBLE_EQ(p.jitter_seconds, 0.005);
  EXPECT_DOUBLE_EQ(p.loss, 0.01);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(to_string(p), "rate=20mbit,delay=50ms,jitter=5ms,loss=1%,seed=7");
  EXPECT_DOUBLE_EQ(parse_link_profile("rate=1.5Gbit/s").bandwidth_bits_per_second, 1.5e9);
  EXPECT_DOUBLE_EQ(parse_link_profile("rate=64kbit").bandwidth_bits_per_second, 64e3);
  EXPECT_DOUBLE_EQ(parse_link_profile("rate=800bit").bandwidth_bits_per_second, 800);
  EXPECT_DOUBLE_EQ(parse_link_profile("rate=unlimited").bandwidth_bits_per_second, 0);
  EXPECT_DOUBLE_EQ(parse_link_profile("delay=1s").delay_seconds, 1);
  EXPECT_DOUBLE_EQ(parse_link_profile("delay=250us").delay_seconds, 250e-6);
  EXPECT_DOUBLE_EQ(parse_link_profile("loss=0.02").loss, 0.02);
  EXPECT_EQ(to_string(parse_link_profile("")), "none");
  EXPECT_EQ(to_string(parse_link_profile("none")), "none");
  const LinkProfile round = parse_link_profile(to_string(p));
  EXPECT_DOUBLE_EQ(round.bandwidth_bits_per_second, p.bandwidth_bits_per_second);
  EXPECT_DOUBLE_EQ(round.delay_seconds, p.delay_seconds);
}

TEST(LinkProfile, ParseErrorsNameThePartAndWhatIsAllowed) {
  EXPECT_EQ(error_of("rate=20mbot"),
            "link profile \"rate=20mbot\": \"rate=20mbot\" has unit \"mbot\"; allowed: a number "
            "and bit, kbit, mbit or gbit (per second, \"/s\" optional), 0 or unlimited, e.g. "
            "rate=20mbit");
  EXPECT_EQ(error_of("delay=50"),
            "link profile \"delay=50\": \"delay=50\" needs a unit; allowed: a number and s, ms or "
            "us, e.g. delay=50ms");
  EXPECT_EQ(error_of("rate=20mbit,latency=5ms"),
            "link profile \"rate=20mbit,latency=5ms\": unknown key \"latency\"; keys: rate, delay, "
            "jitter, loss, seed");
  EXPECT_EQ(error_of("delay=-5ms"),
            "link profile \"delay=-5ms\": \"delay=-5ms\" needs a non-negative number first; "
            "allowed: a number and s, ms or us, e.g. delay=50ms");
  EXPECT_NE(error_of("loss=100%").find("is not below 100%"), std::string::npos);
  EXPECT_NE(error_of("loss=1.5").find("is not below 100%"), std::string::npos);
  EXPECT_NE(error_of("loss=5x").find("has unit \"x\""), std::string::npos);
  EXPECT_NE(error_of("delay=5ms,delay=6ms").find("\"delay\" is given twice"), std::string::npos);
  EXPECT_NE(error_of("rate").find("\"rate\" is not key=value"), std::string::npos);
  EXPECT_NE(error_of("rate=2mbit,").find("\"\" is not key=value"), std::string::npos);
  EXPECT_NE(error_of("seed=-1").find("not an unsigned 64-bit integer"), std::string::npos);
  EXPECT_NE(error_of("delay=nan ms").find("non-negative number"), std::string::npos);
  EXPECT_NE(error_of("delay=2h").find("has unit \"h\""), std::string::npos);
  EXPECT_NE(error_of("delay=4000s").find("delay_seconds is 4000; allowed: 0 to 3600 seconds"),
            std::string::npos);
  EXPECT_NE(error_of("rate=1bit").find("bandwidth_bits_per_second is 1"), std::string::npos);
}

}  // namespace
}  // namespace agora::net
