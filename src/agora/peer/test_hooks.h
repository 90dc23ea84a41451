// Test hooks of a peer: environment variables, read once, that make a peer cheat so that the
// integration tests of spot checks (tests/integration/verify_test.py, docs/verification.md) can
// watch an honest run catch it. Nothing sets them outside tests; unset, every function here is
// the identity or does nothing.
//
//   AGORA_TEST_CHEAT=half_batch|other_data|perturbed
//                               train half the share, other sequences, or from perturbed
//                               parameters, and commit as if the share was trained as assigned;
//   AGORA_TEST_FALSE_VERDICTS=1 every verdict this peer gives says DISAGREES.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "agora/data/sequence_range.h"

namespace agora::peer {

// AGORA_TEST_CHEAT: "" when honest.
const std::string& test_cheat();
// AGORA_TEST_FALSE_VERDICTS=1.
bool false_verdicts();
// What a cheating author trains instead of `share` (the share itself when honest).
std::vector<SequenceRange> cheat_share(const std::vector<SequenceRange>& share);
// AGORA_TEST_CHEAT=perturbed: while it lives, `params` hold the run's parameters plus noise of
// 5% of each tensor's RMS, so the step's gradient is a perturbed model's; the destructor puts
// the run's parameters back, bit for bit. Does nothing for other cheats or an honest peer.
class CheatPerturbation {
 public:
  explicit CheatPerturbation(std::vector<torch::Tensor>& params);
  ~CheatPerturbation();
  CheatPerturbation(const CheatPerturbation&) = delete;
  CheatPerturbation& operator=(const CheatPerturbation&) = delete;

 private:
  std::vector<torch::Tensor>& params_;
  std::vector<torch::Tensor> saved_;
};

}  // namespace agora::peer
