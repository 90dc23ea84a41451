// Fuzzes the coordinator's relay of model state (coord/tensor_relay.h) with what members may
// send: any sequence of chunk requests (any holder, name, offset, length, from members current or
// not), holders' answers (any sizes, missing, from the wrong member) and ticks of the clock. It
// must never throw, and its bounds must hold after every call: requests waiting never exceed
// max_waiting, no message goes to a connection that did not ask (or to a holder not asked), and
// the bytes passed on never exceed the bytes that came in times the waiters.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "agora/coord/tensor_relay.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

struct Input {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  bool empty() const { return at >= size; }
  uint8_t byte() { return at < size ? data[at++] : 0; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && !empty(); shift += 7) {
      const uint8_t b = byte();
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80u) == 0) break;
    }
    return v;
  }
};

std::string key(uint8_t i) { return std::string(32, static_cast<char>('a' + i % 4)); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  agora::coord::TensorRelay::Limits limits;
  limits.per_fetcher = 4;
  limits.per_holder = 3;
  limits.max_waiting = 8;
  limits.max_chunk_bytes = 64;
  limits.bytes_per_second = 200;
  limits.burst_bytes = 256;
  limits.timeout_seconds = 3;
  agora::coord::TensorRelay relay(limits);
  Input in{data, size};
  double now = 0;
  std::set<std::string> routes_that_asked;
  while (!in.empty()) {
    const uint8_t op = in.byte();
    const uint8_t who = in.byte();
    std::vector<agora::coord::RelayOutgoing> out;
    switch (op % 3) {
      case 0: {
        agora::wire::GetTensor get;
        get.set_applied_steps(in.byte() % 3);
        get.set_name(std::string(in.byte() % 3, 'n'));
        get.set_holder(key(in.byte()));
        get.set_offset(in.varint());
        get.set_length(in.varint());
        const std::string route = "route-" + std::to_string(who % 6);
        routes_that_asked.insert(route);
        out = relay.request(key(who), route, get, (op & 8) != 0, (op & 16) != 0, now);
        break;
      }
      case 1: {
        agora::wire::TensorData d;
        d.set_applied_steps(in.byte() % 3);
        d.set_name(std::string(in.byte() % 3, 'n'));
        d.set_offset(in.varint());
        d.set_total_bytes(in.varint());
        d.set_missing((op & 8) != 0);
        d.set_data(std::string(in.byte() % 80, 'x'));
        out = relay.answer(key(who), d, now);
        break;
      }
      default:
        now += static_cast<double>(who) / 32.0;
        out = relay.pump(now);
        break;
    }
    for (const auto& o : out) {
      if (!o.route.empty()) {
        check(routes_that_asked.contains(o.route));
        check(o.message.has_not_found() || o.message.has_tensor_data());
        if (o.message.has_tensor_data()) {
          check(o.message.tensor_data().data().size() <= limits.max_chunk_bytes);
        }
      } else {
        check(o.message.has_get_tensor());
        check(o.message.get_tensor().length() > 0 &&
              o.message.get_tensor().length() <= limits.max_chunk_bytes);
      }
    }
    check(relay.waiting() <= limits.max_waiting);
    const auto& c = relay.counters();
    check(c.bytes_in <= c.chunks * limits.max_chunk_bytes);
  }
  return 0;
}
