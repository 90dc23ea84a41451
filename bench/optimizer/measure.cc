#include "measure.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <random>
#include <span>

#include "agora/config/model_config.h"
#include "agora/core/error.h"
#include "agora/core/hash.h"
#include "agora/optim/adamw.h"
#include "agora/optim/decoupled_momentum.h"
#include "agora/optim/payload.h"

namespace agora::bench {
namespace {

// One untimed warm-up call, then `repeats` timed ones (seconds each).
template <typename F>
std::vector<double> time_repeats(int repeats, F&& fn) {
  fn();
  std::vector<double> out;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return out;
}

// Other peers' payloads made by DecoupledMomentum::contribute(); the rest are synthetic.
constexpr int64_t kRealPeers = 16;

// A payload with the layout and step of `like`: per chunk, topk distinct positions drawn
// uniformly (Floyd's algorithm), ascending, and values normal with the root mean square of
// like's values for the tensor (one-bit: random signs).
std::string synthetic_payload(const Payload& like, uint64_t seed) {
  std::mt19937_64 random(seed);
  Payload out = like;
  for (TensorPayload& entry : out.tensors) {
    const TensorLayout& layout = entry.layout;
    const int64_t size = layout.chunk_size(), k = layout.topk;
    double squares = 0;
    for (const float v : entry.values) squares += static_cast<double>(v) * v;
    const double rms = std::sqrt(squares / std::max<size_t>(1, entry.values.size()));
    std::normal_distribution<float> normal(0.0f, static_cast<float>(rms));
    for (int64_t c = 0; c < layout.num_chunks(); ++c) {
      uint32_t* chosen = entry.positions.data() + c * k;
      int64_t n = 0;
      for (int64_t top = size - k; top < size; ++top) {
        const auto t =
            static_cast<uint32_t>(std::uniform_int_distribution<int64_t>(0, top)(random));
        const bool taken = std::find(chosen, chosen + n, t) != chosen + n;
        chosen[n++] = taken ? static_cast<uint32_t>(top) : t;
      }
      std::sort(chosen, chosen + k);
    }
    for (float& v : entry.values) {
      v = layout.value_type == ValueType::kOneBit ? (random() & 1 ? 1.0f : -1.0f) : normal(random);
    }
  }
  return encode_payload(out);
}

}  // namespace

int repeats_for(int repeats, int64_t peers) {
  return peers > 100 ? std::min(repeats, 3) : repeats;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

AgoraBench::AgoraBench(const Options& o) : options_(o) {
  if (o.batch % o.micro_batch != 0) {
    fail("--batch {} is not a multiple of --micro-batch {}", o.batch, o.micro_batch);
  }
  torch::set_num_threads(o.threads);
  torch::manual_seed(o.seed);
  model_ = Llama(model_preset(o.preset, o.vocab, o.seq_len));
  model_->train();
  for (auto& item : model_->named_parameters()) {
    named_.push_back({item.key(), item.value(), item.value().dim() >= 2});
    parameters_ += item.value().numel();
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed + 1);
  tokens_ = torch::randint(0, o.vocab, {o.batch, o.seq_len + 1}, generator,
                           torch::TensorOptions().dtype(torch::kInt64));
}

std::vector<double> AgoraBench::forward_backward() {
  const int64_t micro = options_.micro_batch, steps = options_.batch / micro;
  const int64_t T = options_.seq_len;
  return time_repeats(options_.repeats, [&] {
    for (NamedParameter& p : named_) p.tensor.mutable_grad() = torch::Tensor();
    for (int64_t m = 0; m < steps; ++m) {
      const torch::Tensor tokens = tokens_.narrow(0, m * micro, micro);
      const torch::Tensor logits = model_->forward(tokens.narrow(1, 0, T));
      // The trainer's loss (next_token_loss), scaled for accumulation over the micro-batches.
      const torch::Tensor loss =
          torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                               tokens.narrow(1, 1, T).reshape({-1})) /
          static_cast<double>(steps);
      loss.backward();
    }
  });
}

DemoSamples AgoraBench::demo(const DemoConfig& config, const std::vector<int64_t>& peers) {
  DemoOptions options;
  options.beta = kBeta;
  options.topk = config.topk;
  options.chunk = config.chunk;
  options.weight_decay = kWeightDecay;
  options.one_bit = config.one_bit;
  const StepContext context{0, kLr, 1};

  DemoSamples out;
  DecoupledMomentum strategy(named_, options);
  Contribution own;
  out.contribute = time_repeats(options_.repeats, [&] { own = strategy.contribute(context); });
  own.peer = "peer-0000";
  out.payload_bytes = own.bytes.size();

  // The other peers: the first kRealPeers - 1 are fresh strategies over the same parameters, each
  // on its own random gradients (normal, with each tensor's real gradient's standard deviation),
  // then the real ones back; beyond them, payloads drawn directly (synthetic_payload), since
  // 999 contribute() calls would take minutes and select the same way (random gradients give
  // uniformly spread top-k positions).
  const int64_t most = *std::max_element(peers.begin(), peers.end());
  std::vector<Contribution> contributions = {own};
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> real;
    std::vector<double> scale;
    for (NamedParameter& p : named_) {
      real.push_back(p.tensor.grad());
      scale.push_back(real.back().defined() ? real.back().std().item<double>() : 1e-3);
    }
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + 2);
    for (int64_t j = 1; j < std::min(most, kRealPeers); ++j) {
      for (size_t i = 0; i < named_.size(); ++i) {
        named_[i].tensor.mutable_grad() =
            torch::randn(named_[i].tensor.sizes(), generator) * scale[i];
      }
      DecoupledMomentum other(named_, options);
      Contribution c = other.contribute(context);
      c.peer = fmt::format("peer-{:04d}", j);
      contributions.push_back(std::move(c));
    }
    for (size_t i = 0; i < named_.size(); ++i) named_[i].tensor.mutable_grad() = real[i];
  }
  const Payload like = decode_payload(own.bytes, strategy.payload_layout());
  for (int64_t j = kRealPeers; j < most; ++j) {
    contributions.push_back({fmt::format("peer-{:04d}", j),
                             synthetic_payload(like, options_.seed + static_cast<uint64_t>(j))});
  }

  // Each payload's hash, as a network peer knows it (checked against its commitment): what
  // finds the payloads decoded at fetch. Bytes with a hash still decode in apply() when the store
  // holds nothing.
  for (Contribution& c : contributions) c.hash = blake2b256_bytes(c.bytes);
  for (const int64_t p : peers) {
    const std::span<const Contribution> set(contributions.data(), static_cast<size_t>(p));
    const StepContext step{0, kLr, p};
    out.apply[p] =
        time_repeats(repeats_for(options_.repeats, p), [&] { strategy.apply(step, set); });
    // As a network peer applies: each payload decoded when it was fetched (untimed here).
    std::vector<double>& decoded = out.apply_decoded[p];
    for (int r = 0; r <= repeats_for(options_.repeats, p); ++r) {
      for (const Contribution& c : set) strategy.decoded_payloads()->decode(c.hash, c.bytes, 0);
      const auto start = std::chrono::steady_clock::now();
      strategy.apply(step, set);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (r > 0) decoded.push_back(took.count());  // the first is the warm-up
    }
  }
  return out;
}

std::vector<double> AgoraBench::adamw() {
  AdamWStrategy strategy(named_, AdamWOptions{});
  const StepContext context{0, kLr, 1};
  return time_repeats(options_.repeats, [&] {
    const Contribution own = strategy.contribute(context);  // empty with one peer
    strategy.apply(context, std::span<const Contribution>(&own, 1));
  });
}

}  // namespace agora::bench
