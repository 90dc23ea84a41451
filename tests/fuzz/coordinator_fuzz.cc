// Fuzzes the coordinator's state machine with what peers may send: any sequence of joins,
// heartbeats, signed and unsigned commits, witnesses, state reports, leaves, raw envelopes and
// ticks from three members and a stranger. The machine must never throw, and its promises must
// hold after every call: the ledger only grows (but for a restart from a checkpoint), finalized
// steps never exceed the run's steps, and no sequence id is handed to two members of the open
// round.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agora/coord/state_machine.h"
#include "agora/core/error.h"
#include "agora/net/envelope.h"

namespace {

using agora::coord::StateMachine;

void check(bool ok) {
  if (!ok) std::abort();
}

struct Input {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  bool empty() const { return at >= size; }
  uint8_t byte() { return at < size ? data[at++] : 0; }
  std::string bytes(size_t n) {
    std::string out;
    while (n-- > 0 && at < size) out.push_back(static_cast<char>(data[at++]));
    return out;
  }
};

const std::vector<agora::net::Identity>& identities() {
  static const std::vector<agora::net::Identity> ids = [] {
    std::vector<agora::net::Identity> v;
    for (char c = 'a'; c <= 'd'; ++c)
      v.push_back(agora::net::Identity::from_seed(std::string(32, c)));
    return v;
  }();
  return ids;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& ids = identities();
  agora::coord::Options options;
  options.run_id = "fuzz";
  options.total_steps = 6;
  options.batch_size = 7;
  options.network.min_peers = 2;
  options.network.warmup_seconds = 1;
  options.network.hash_interval = 2;
  options.network.overlap = data && size > 0 ? data[0] % 2 : 1;
  options.allowlist = {ids[0].public_key(), ids[1].public_key(), ids[2].public_key()};
  // Spot checks on half the runs, with seeds the input cannot see (a count), so verdicts meet
  // open checks.
  options.verify.rate = data && size > 1 ? (data[1] % 2) * 0.5 : 0.0;
  options.verify.seconds = 5;
  options.verify.window = 3;
  options.random_seed = [n = 0]() mutable { return std::string(32, static_cast<char>(++n)); };
  StateMachine machine(options, {});
  Input in{data, size};
  double now = 1'000'000.0;
  size_t ledger = 0;
  uint64_t restarts = 0;
  while (!in.empty()) {
    const uint8_t op = in.byte();
    const auto& id = ids[in.byte() % ids.size()];
    const uint64_t step = in.byte() % 8;
    agora::wire::Envelope e;
    switch (op % 10) {
      case 0:
        e.mutable_join()->set_key(id.public_key());
        // Each identity its own port (a shared endpoint is refused), now and then another's.
        e.mutable_join()->set_endpoint(
            in.byte() % 4 ? "tcp://127.0.0.1:" + std::to_string(7500 + in.byte() % ids.size())
                          : in.bytes(8));
        e.mutable_join()->set_sequences_per_second(in.byte());
        break;
      case 1:
        e.mutable_heartbeat()->set_applied_steps(step);
        e.mutable_heartbeat()->set_next_round(in.byte() % 8);
        break;
      case 2: {  // a correctly signed commit for some hash
        const std::string hash(32, static_cast<char>(in.byte() % 4));
        auto* r = e.mutable_commit()->mutable_record();
        r->set_author(id.public_key());
        r->set_step(step);
        r->set_payload_hash(hash);
        r->set_signature(id.sign(agora::net::commit_signing_bytes("fuzz", step, hash)));
        e.mutable_commit()->set_sequences(in.byte());
        e.mutable_commit()->set_compute_seconds(in.byte() / 16.0);
        if (in.byte() % 4 != 0) {  // with a signed strategy commitment, mostly
          const std::string before(32, static_cast<char>(in.byte())), after(32, 'z');
          e.mutable_commit()->set_strategy_before(before);
          e.mutable_commit()->set_strategy_after(after);
          e.mutable_commit()->set_strategy_signature(id.sign(
              agora::net::strategy_signing_bytes("fuzz", step, hash, 0, before, after)));
        }
        break;
      }
      case 3:
        e.mutable_witness()->set_step(step);
        if (in.byte() % 2) {  // bits over the Collect, of any length and padding
          e.mutable_witness()->set_of_collect(in.bytes(in.byte() % 3));
        } else {
          for (int i = in.byte() % 4; i > 0; --i)
            e.mutable_witness()->add_held(std::string(32, static_cast<char>(in.byte() % 4)));
        }
        break;
      case 4: {
        auto* s = e.mutable_state_report()->mutable_state();
        s->set_applied_steps(step);
        s->set_state_hash(std::string(32, static_cast<char>(in.byte() % 3)));
        break;
      }
      case 5:
        e.mutable_leave();
        break;
      case 6:
        e.mutable_get_finalized()->set_step(step);
        break;
      case 7: {  // arbitrary bytes, as a malicious peer would send them
        const agora::net::Decoded d = agora::net::decode_envelope(in.bytes(in.byte()));
        if (!std::holds_alternative<agora::wire::Envelope>(d)) continue;
        e = std::get<agora::wire::Envelope>(d);
        break;
      }
      case 8: {  // a verdict on any author, asked for or not
        auto* v = e.mutable_verdict();
        v->set_step(step);
        v->set_author(ids[in.byte() % ids.size()].public_key());
        v->set_outcome(static_cast<agora::wire::Verdict::Outcome>(in.byte() % 4));
        break;
      }
      default:
        now += in.byte() / 8.0;
        machine.tick(now);
        continue;
    }
    try {
      machine.handle(id.public_key(), e, now);
    } catch (const agora::Error&) {
      std::abort();  // nothing a peer sends may throw
    }
    const auto& state = machine.state();
    // The ledger only grows, except when every member left and the run went back to a
    // checkpoint (counted in restarts).
    check(state.finalized_steps() >= ledger || state.counters.restarts > restarts);
    restarts = state.counters.restarts;
    check(state.finalized_steps() <= options.total_steps);
    ledger = state.finalized_steps();
    if (state.round) {
      std::set<uint64_t> seen;
      for (const auto& [key, ranges] : state.round->assignments) {
        for (const auto& r : ranges) {
          for (uint64_t q = r.first; q < r.first + r.count; ++q) check(seen.insert(q).second);
        }
      }
    }
  }
  return 0;
}
