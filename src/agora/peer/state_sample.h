// Which tensors of an author's strategy state a spot check fetches and compares.
//
// A check used to move the author's whole momentum before and after the step: 8 bytes per
// parameter, 86 MB for the small preset, over the same slow links that carry the payloads
// (docs/results.md, "The network over emulated internet links"). DeMo's momentum update, DCT and
// top-k are per tensor (only the gradient couples them, and a verifier recomputes the whole
// gradient anyway), so a check of some tensors is a check of those tensors exactly.
//
// The draw: tensors ranked by BLAKE2b-256(sample | name), taken in that order until they hold
// `fraction` of the state's bytes (at least one tensor). `sample` is the SpotCheck's, made from
// the coordinator's seed after the commits closed: the author could not aim a cheat at the
// tensors left out, and every verifier of a check (second and third opinions too) compares the
// same ones, so honest verifiers agree. An empty sample or a fraction of 1 takes every tensor.
//
// What a member that cheats on some tensors only (a momentum it bends on one layer) risks per
// check is about `fraction`; work skipped at all (a partial batch, stale parameters) changes the
// gradient of every tensor and shows in any sample. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace agora::peer {

struct StateTensor {
  std::string name;
  uint64_t bytes = 0;
};

// Indices into `tensors` of the sample, in the order of `tensors`.
std::vector<size_t> sample_state(const std::string& sample, const std::vector<StateTensor>& tensors,
                                 double fraction);

}  // namespace agora::peer
