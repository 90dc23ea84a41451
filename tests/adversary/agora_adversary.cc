// agora_adversary: a member of a run that attacks it (test-only; never part of the agora binary).
//
//   agora_adversary --coordinator tcp://127.0.0.1:7400 --coordinator-key HEX --key adv.key
//                   --attack wrong-step [--from-round N] [...]
//
// The attacks and their parameters: adversary.h and docs/security.md, "The adversary". It prints
// one JSON object per line on stdout for each thing it does (tests/integration/adversary_test.py
// reads them) and exits 0 when the run finishes, when the coordinator refuses it for good, or
// after --duration seconds; 2 for bad arguments or a key it cannot load.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <set>

#include "adversary.h"
#include "agora/core/error.h"

int main(int argc, char** argv) {
  using agora::adversary::Options;
  Options o;
  std::string factor = "1e6";
  CLI::App app("agora_adversary: join a run and attack it (tests only)");
  app.add_option("--coordinator", o.coordinator, "The coordinator's endpoint")->required();
  app.add_option("--coordinator-key", o.coordinator_key, "Its public key (64 hex)")->required();
  app.add_option("--key", o.key, "This member's key file (agora keygen), on the allowlist")
      ->required();
  app.add_option("--attack", o.attack, "What to do (adversary.h lists them)")->required();
  app.add_option("--listen", o.listen, "Where its server binds");
  app.add_option("--advertise", o.advertise, "The endpoint it joins with (steal-endpoint)");
  app.add_option("--data", o.data, "Token folder, for model.vocab_size when the config has none");
  app.add_option("--from-round", o.from_round, "Rounds before this one commit copies");
  app.add_option("--claim-step", o.claim_step, "wrong-step: the payload's step (default round-1)");
  app.add_option("--replay-source", o.replay_source, "replay: honest | own");
  app.add_option("--factor", factor,
                 "scale: the multiplier; |factor| >= 1e38 sends +-3e38 (near FLT_MAX); negative "
                 "flips the signs too (write --factor=-1e6)");
  app.add_option("--state-mode", o.state_mode, "forged-state: huge | evict | empty | fake");
  app.add_option("--flood-kind", o.flood_kind,
                 "flood: heartbeat | get-finalized | join | witness | state-report | commit | "
                 "verdict | get-blob | get-tensor | get-strategy");
  app.add_option("--rate", o.rate, "flood: messages per second (0: as fast as it can)");
  app.add_option("--flood-seconds", o.flood_seconds, "flood, oversized: how long");
  app.add_option("--flood-after", o.flood_after, "flood, oversized: seconds after joining");
  app.add_option("--bytes", o.bytes, "oversized: frame size");
  app.add_option("--target", o.target, "oversized: coordinator | peers");
  app.add_option("--claim-throughput", o.claim_throughput,
                 "Sequences per second it acts: it commits share / this seconds after a round "
                 "opens (1e9: at once, taking the batch)")
      ->check(CLI::PositiveNumber);
  app.add_option("--ally", o.allies, "Another adversary's key (8 hex; repeatable): never a base");
  app.add_flag("--silent", o.silent, "Never witness (with any attack)");
  app.add_option("--duration", o.duration, "Give up after this many seconds (0: never)");
  app.add_option("--seed", o.seed, "Random seed (noise, forged hashes)");
  CLI11_PARSE(app, argc, argv);
  o.factor = std::stod(factor);
  static const std::set<std::string> kAttacks = {
      "copy",         "garbage", "wrong-step", "replay",        "scale",
      "sign-flip",    "noise",   "zero",       "withhold",      "steal-endpoint",
      "forged-state", "flood",   "oversized",  "lying-witness", "silent-witness"};
  if (!kAttacks.contains(o.attack)) {
    std::fprintf(stderr, "error: unknown --attack %s\n", o.attack.c_str());
    return 2;
  }
  if (o.attack == "steal-endpoint" && o.advertise.empty()) {
    std::fprintf(stderr, "error: steal-endpoint needs --advertise (the victim's endpoint)\n");
    return 2;
  }
  try {
    agora::adversary::Adversary adversary(o);
    return adversary.run();
  } catch (const agora::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
