#include "agora/net/link_shaper.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <system_error>
#include <vector>

#include "agora/core/error.h"

namespace agora::net {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRead = 64 << 10;        // largest chunk one recv takes
constexpr int kConnectTimeoutMs = 10000;

Clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// splitmix64's finaliser: a well-mixed 64-bit function of z, the same on every platform.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The next draw of a splitmix64 stream, as a double in [0, 1) with 53 random bits.
double next_uniform(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ULL;
  return static_cast<double>(mix64(state) >> 11) * 0x1.0p-53;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void set_no_delay(int fd) {
  // The shaper decides when bytes leave; Nagle's algorithm must not add its own waits.
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ---- LinkProfile ----------------------------------------------------------------------------

}  // namespace


// ---- LinkShaper internals -------------------------------------------------------------------

struct LinkShaper::Counters {
  std::atomic<uint64_t> connections_accepted{0};
  std::atomic<uint64_t> connections_open{0};
  std::atomic<uint64_t> connect_failures{0};
  std::atomic<uint64_t> bytes[2]{};  // [0] to the target, [1] to the client
  std::atomic<uint64_t> lost[2]{};
};

// One direction: a reader thread turns what it reads into chunks stamped with a release time; a
// writer thread writes each chunk once its time has come. The queue, its byte count and the
// wake-ups are under mutex_; the token bucket, the draws and last_release_ belong to the reader.
class LinkShaper::Direction {
 public:
  Direction(LinkShaper::Connection& connection, int from, int to, const LinkProfile& profile,
            uint64_t stream, size_t max_queued, std::atomic<uint64_t>& bytes,
            std::atomic<uint64_t>& lost)
      : connection_(connection),
        from_(from),
        to_(to),
        profile_(profile),
        byte_rate_(profile.bandwidth_bits_per_second / 8),
        // A TCP sender detects a loss and retransmits after about two round trips.
        rto_(to_duration(std::max(0.2, 4 * profile.delay_seconds))),
        max_queued_(max_queued),
        bytes_(bytes),
        lost_(lost),
        draws_(mix64(profile.seed ^ mix64(stream + 1))),
        capacity_(std::max<double>(LinkShaper::kSegmentBytes, byte_rate_ * 0.01)),
        tokens_(capacity_),
        refilled_(Clock::now()) {}

  void read_loop();
  void write_loop();

  // Wakes both threads to look at the connection's state again.
  void wake() {
    { std::lock_guard lock(mutex_); }  // a waiter is either before its check or already waiting
    changed_.notify_all();
  }

 private:
  struct Chunk {
    Clock::time_point release;
    std::string bytes;  // empty: the sender closed; shut down the sending half towards `to_`
  };

  bool broken() const;
  // Waits until the token bucket holds a positive balance; false when the connection broke.
  bool wait_for_tokens();
  // Stamps n freshly read bytes with release times (delay, jitter, loss) and queues them.
  void schedule(const char* data, size_t n, bool eof);
  void push(Clock::time_point release, std::string bytes);

  LinkShaper::Connection& connection_;
  const int from_, to_;
  const LinkProfile profile_;
  const double byte_rate_;  // bytes per second; 0 = unlimited
  const Clock::duration rto_;
  const size_t max_queued_;
  std::atomic<uint64_t>& bytes_;
  std::atomic<uint64_t>& lost_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Chunk> queue_;
  size_t queued_bytes_ = 0;  // read and not yet fully written, including the chunk being written

  // Reader thread only.
  uint64_t draws_;
  const double capacity_;  // token bucket size in bytes: a segment or 10 ms of rate
  double tokens_;
  Clock::time_point refilled_;
  Clock::time_point last_release_{};
};

class LinkShaper::Connection {
 public:
  Connection(int client_fd, int target_fd, const LinkShaperOptions& options, uint64_t index,
             Counters& counters)
      : counters_(counters),
        client_fd_(client_fd),
        target_fd_(target_fd),
        to_target_(*this, client_fd, target_fd, options.to_target, 2 * index,
                   options.max_queued_bytes, counters.bytes[0], counters.lost[0]),
        to_client_(*this, target_fd, client_fd, options.to_client, 2 * index + 1,
                   options.max_queued_bytes, counters.bytes[1], counters.lost[1]) {}

  ~Connection() {
    abort();
    join();
    close_fd(client_fd_);
    close_fd(target_fd_);
  }

  // Starts the four threads. When one cannot start, the connection is torn down instead.
  void start() {
    counters_.connections_open.fetch_add(1);
    Direction* directions[2] = {&to_target_, &to_client_};
    for (Direction* d : directions) {
      for (const bool reader : {true, false}) {
        try {
          threads_.emplace_back([this, d, reader] {
            run([d, reader] { reader ? d->read_loop() : d->write_loop(); });
          });
        } catch (const std::system_error&) {
          abort();
          thread_done();
        }
      }
    }
  }

  bool finished() const { return threads_done_.load() == 4; }
  bool broken() const { return broken_.load(); }

  // Tears the connection down: every blocked recv and send returns, every wait wakes. The
  // sockets stay open (so no other thread's descriptor is reused) until the destructor.
  void abort() {
    broken_.store(true);
    ::shutdown(client_fd_, SHUT_RDWR);
    ::shutdown(target_fd_, SHUT_RDWR);
    to_target_.wake();
    to_client_.wake();
  }

 private:
  template <typename Body>
  void run(Body body) {
    try {
      body();
    } catch (...) {
      abort();  // out of memory, most likely: give up on this connection, not the process
    }
    thread_done();
  }

  void thread_done() {
    if (threads_done_.fetch_add(1) + 1 == 4) counters_.connections_open.fetch_sub(1);
  }

  void join() {
    for (auto& thread : threads_)
      if (thread.joinable()) thread.join();
    threads_.clear();
  }

  Counters& counters_;
  int client_fd_, target_fd_;
  std::atomic<bool> broken_{false};
  std::atomic<int> threads_done_{0};
  Direction to_target_, to_client_;
  std::vector<std::thread> threads_;
};

bool LinkShaper::Direction::broken() const {
  return connection_.broken();
}

bool LinkShaper::Direction::wait_for_tokens() {
  while (true) {
    const auto now = Clock::now();
    tokens_ = std::min(
        capacity_, tokens_ + std::chrono::duration<double>(now - refilled_).count() * byte_rate_);
    refilled_ = now;
    if (tokens_ > 0) return true;
    const auto ready = now + to_duration(-tokens_ / byte_rate_) + std::chrono::microseconds(1);
    std::unique_lock lock(mutex_);
    if (changed_.wait_until(lock, ready, [this] { return broken(); })) return false;
  }
}

void LinkShaper::Direction::read_loop() {
  std::vector<char> buffer(kMaxRead);
  while (true) {
    size_t budget = kMaxRead;
    if (byte_rate_ > 0) {
      if (!wait_for_tokens()) return;
      // Read what the bucket allows, but at least a segment (the balance may go negative and
      // the next read waits it off), so a slow link still moves whole segments.
      budget = std::clamp(static_cast<size_t>(tokens_), kSegmentBytes, kMaxRead);
    }
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return broken() || queued_bytes_ + kSegmentBytes <= max_queued_; });
      if (broken()) return;
      budget = std::min(budget, max_queued_ - queued_bytes_);
    }
    const ssize_t n = ::recv(from_, buffer.data(), budget, 0);
    if (n < 0 && errno == EINTR) continue;
    if (broken()) return;
    if (n < 0) {  // reset or worse: nothing more will come, and nothing should go
      connection_.abort();
      return;
    }
    if (byte_rate_ > 0) tokens_ -= static_cast<double>(n);
    schedule(buffer.data(), static_cast<size_t>(n), n == 0);
    if (n == 0) return;
  }
}

void LinkShaper::Direction::schedule(const char* data, size_t n, bool eof) {
  const auto now = Clock::now();
  double extra = profile_.delay_seconds;
  if (profile_.jitter_seconds > 0) extra += profile_.jitter_seconds * next_uniform(draws_);
  const auto base = now + to_duration(extra);
  // Never before what was read earlier: jitter may delay a chunk but not reorder it.
  auto release = std::max(last_release_, base);
  if (eof) {
    push(release, {});
    return;
  }
  size_t start = 0;
  if (profile_.loss > 0) {
    for (size_t offset = 0; offset < n; offset += kSegmentBytes) {
      if (next_uniform(draws_) >= profile_.loss) continue;
      lost_.fetch_add(1, std::memory_order_relaxed);
      // The lost segment arrives one retransmission timeout late, and TCP delivers nothing
      // behind it until it has. Losses within one timeout are recovered together.
      const auto retransmitted = std::max(release, base + rto_);
      if (retransmitted == release) continue;
      if (offset > start) push(release, std::string(data + start, offset - start));
      start = offset;
      release = retransmitted;
    }
  }
  push(release, std::string(data + start, n - start));
  last_release_ = release;
}

void LinkShaper::Direction::push(Clock::time_point release, std::string bytes) {
  {
    std::lock_guard lock(mutex_);
    queued_bytes_ += bytes.size();
    queue_.push_back(Chunk{release, std::move(bytes)});
  }
  changed_.notify_all();
}

void LinkShaper::Direction::write_loop() {
  while (true) {
    Chunk chunk;
    {
      std::unique_lock lock(mutex_);
      while (true) {
        if (broken()) return;
        if (queue_.empty()) {
          changed_.wait(lock);
        } else if (Clock::now() < queue_.front().release) {
          changed_.wait_until(lock, queue_.front().release);
        } else {
          break;
        }
      }
      chunk = std::move(queue_.front());
      queue_.pop_front();
    }
    if (chunk.bytes.empty()) {  // the sender closed; pass the FIN on after everything before it
      ::shutdown(to_, SHUT_WR);
      return;
    }
    size_t sent = 0;
    while (sent < chunk.bytes.size()) {
      const ssize_t n =
          ::send(to_, chunk.bytes.data() + sent, chunk.bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || broken()) {
        connection_.abort();
        return;
      }
      sent += static_cast<size_t>(n);
      bytes_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    }
    {
      std::lock_guard lock(mutex_);
      queued_bytes_ -= chunk.bytes.size();
    }
    changed_.notify_all();  // the reader may be waiting for room
  }
}

// ---- LinkShaper -----------------------------------------------------------------------------

LinkShaper::LinkShaper(LinkShaperOptions options)
    : options_(std::move(options)), counters_(std::make_shared<Counters>()) {
  validate(options_.to_target);
  validate(options_.to_client);
  if (options_.max_queued_bytes < kSegmentBytes)
    fail("link shaper: max_queued_bytes is {}; allowed: {} and up", options_.max_queued_bytes,
         kSegmentBytes);

  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string target_port = std::to_string(options_.target_port);
  if (const int rc =
          ::getaddrinfo(options_.target_host.c_str(), target_port.c_str(), &hints, &found);
      rc != 0)
    fail("link shaper: cannot resolve target {}:{}: {}", options_.target_host, options_.target_port,
         ::gai_strerror(rc));
  target_address_.reset(found, ::freeaddrinfo);

  hints.ai_flags = AI_PASSIVE;
  addrinfo* local = nullptr;
  const std::string listen_port = std::to_string(options_.listen_port);
  if (const int rc =
          ::getaddrinfo(options_.listen_host.c_str(), listen_port.c_str(), &hints, &local);
      rc != 0)
    fail("link shaper: cannot resolve listen address {}: {}", options_.listen_host,
         ::gai_strerror(rc));
  std::shared_ptr<addrinfo> local_owner(local, ::freeaddrinfo);
  std::string why = "no address";
  for (const addrinfo* a = local; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    listen_fd_ = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (listen_fd_ < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listen_fd_, a->ai_addr, a->ai_addrlen) != 0 || ::listen(listen_fd_, 128) != 0) {
      why = std::strerror(errno);
      close_fd(listen_fd_);
    }
  }
  if (listen_fd_ < 0)
    fail("link shaper: cannot listen on {}:{}: {}; pick another port (0 lets the kernel choose)",
         options_.listen_host, options_.listen_port, why);

  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    const int error = errno;
    close_fd(listen_fd_);
    fail("link shaper: pipe: {}", std::strerror(error));
  }
  accept_thread_ = std::thread([this] { accept_loop(); });
}

LinkShaper::~LinkShaper() {
  stop();
}

void LinkShaper::stop() {
  std::lock_guard lock(stop_mutex_);
  if (!accept_thread_.joinable()) return;
  stopping_.store(true);
  // The byte stays in the pipe, so every poll that watches it from now on returns at once.
  if (::write(wake_pipe_[1], "x", 1) < 0) {
  }
  accept_thread_.join();  // it tears down and joins every connection on its way out
  close_fd(listen_fd_);
  close_fd(wake_pipe_[0]);
  close_fd(wake_pipe_[1]);
}

LinkShaper::Stats LinkShaper::stats() const {
  const Counters& c = *counters_;
  Stats s;
  s.connections_accepted = c.connections_accepted.load();
  s.connections_open = c.connections_open.load();
  s.connect_failures = c.connect_failures.load();
  s.bytes_to_target = c.bytes[0].load();
  s.bytes_to_client = c.bytes[1].load();
  s.segments_lost_to_target = c.lost[0].load();
  s.segments_lost_to_client = c.lost[1].load();
  return s;
}

int LinkShaper::connect_to_target() {
  for (const addrinfo* a = target_address_.get(); a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      // Wait for the handshake, but not past stop().
      pollfd fds[2] = {{fd, POLLOUT, 0}, {wake_pipe_[0], POLLIN, 0}};
      int error = 0;
      socklen_t length = sizeof(error);
      connected = ::poll(fds, 2, kConnectTimeoutMs) > 0 && fds[1].revents == 0 &&
                  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    }
    if (connected && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0) return fd;
    close_fd(fd);
    if (stopping_.load()) break;
  }
  return -1;
}

void LinkShaper::accept_loop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    const int ready = ::poll(fds, 2, 200);
    reap_connections(false);
    if (ready <= 0 || fds[1].revents != 0) continue;
    int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      // Out of descriptors or memory: let a moment pass rather than spin on a ready socket.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const uint64_t index = counters_->connections_accepted.fetch_add(1);
    int target = connect_to_target();
    if (target < 0) {
      counters_->connect_failures.fetch_add(1);
      close_fd(client);  // the client sees EOF, as if the real target had refused
      continue;
    }
    set_no_delay(client);
    set_no_delay(target);
    try {
      connections_.push_back(
          std::make_unique<Connection>(client, target, options_, index, *counters_));
    } catch (const std::bad_alloc&) {  // drop this connection, keep serving the others
      close_fd(client);
      close_fd(target);
      continue;
    }
    connections_.back()->start();
  }
  reap_connections(true);
}

void LinkShaper::reap_connections(bool all) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (all || (*it)->finished())
      it = connections_.erase(it);  // the destructor aborts (a no-op when finished) and joins
    else
      ++it;
  }
}

}  // namespace agora::net
