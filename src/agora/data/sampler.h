// Deterministic sampling: which tokens sequence id q trains on, computable by anyone, anywhere.
//
// The coordinator hands out ranges of sequence ids; every peer must turn an id into the same
// tokens without asking anyone and without a materialised shuffle list. A Sampler is a pure
// function of (shards in order, seq_len, seed, sequence id):
//
// Windows. With a stride of T = seq_len tokens, a window is T + 1 consecutive tokens (the T
//   inputs and the T targets, shifted by one). In a shard of n tokens window i starts at token
//   i * T, so neighbouring windows share one token and every token after a shard's first is a
//   target exactly once. A shard holds (n - 1) / T windows (0 when n < T + 1); windows never
//   cross shards. Global window indices run through the shards in the order given.
//
// Bags (Token Superposition Training, docs/algorithms.md section 4). With bag = s > 1 every unit
//   above is a bag of s consecutive tokens: a window is T + 1 bags (s * (T + 1) tokens: T input
//   bags and T target bags, shifted by one bag), window i starts at token i * s * T, neighbouring
//   windows share one bag, and a shard holds (n - s) / (s * T) windows (0 when n < s * (T + 1)).
//   bag = 1 is exactly the layout above.
//
// Order. W = windows per epoch. Sequence id q is slot k = q % W of epoch e = q / W, and trains
//   on window P_{seed,e}(k), where P is KeyedPermutation below. Each epoch therefore visits every
//   window exactly once, in an order that changes from epoch to epoch.
//
// Everything is integer arithmetic specified here (no std::hash, no std:: distributions), so
// the mapping is the same on every machine, compiler and run. Changing it changes which data a
// run trains on; the golden test in sampler_test.cc pins it.
//
// A Sampler is immutable; its const methods are thread-safe. Memory is O(number of shards).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agora/data/shard.h"
#include "agora/data/tokenizer.h"

namespace agora {

// A keyed bijection on [0, size), O(1) memory.
//
// Let b be the smallest number of bits with 2^b >= size. An index x < 2^b is split into a high
// part L (b / 2 bits) and a low part R (b - b / 2 bits). Eight rounds alternate
//   even rounds: L ^= F(key_r, R) mod 2^|L|      odd rounds: R ^= F(key_r, L) mod 2^|R|
// (an unbalanced Feistel network: each round is invertible on its own, so the whole is a
// permutation of [0, 2^b) for any b). F(key, v) = splitmix64_mix(key ^ v). Results >= size are
// fed through the network again ("cycle walking") until one lands in [0, size); since
// 2^b < 2 * size that takes fewer than two passes on average.
//
// Keys: base = mix(mix(seed ^ 0x61676f7261736d70) ^ epoch), and key_r = mix(base + (r + 1) *
// 0x9e3779b97f4a7c15), where mix is splitmix64's finaliser applied after adding
// 0x9e3779b97f4a7c15 (exactly splitmix64's output for state z).
class KeyedPermutation {
 public:
  static constexpr int kRounds = 8;

  // Throws Error when size is 0.
  KeyedPermutation(uint64_t size, uint64_t seed, uint64_t epoch);

  uint64_t size() const { return size_; }
  // The image of k; throws Error when k >= size().
  uint64_t operator()(uint64_t k) const;

 private:
  uint64_t network(uint64_t x) const;

  uint64_t size_;
  int high_bits_;  // |L|
  int low_bits_;   // |R|
  uint64_t keys_[kRounds];
};

class Sampler {
 public:
  struct Window {
    uint32_t shard;        // index into the shard list
    uint64_t first_token;  // position of the window's first token in that shard
    bool operator==(const Window&) const = default;
  };

  // Throws Error when `shards` is empty or null, seq_len or bag is 0, or no shard is long enough
  // for one window (the message says how many tokens one window needs).
  Sampler(std::vector<std::shared_ptr<const ShardReader>> shards, uint32_t seq_len, uint64_t seed,
          uint32_t bag = 1);

  // All `dir`/*.bin whose name, split at underscores, has `split` as a word: train_000000.bin
  // as agora writes them, and fineweb_train_000001.bin or tiny_val.bin as llm.c does. Sorted by
  // file name (byte order), so every peer sees the same order. Throws Error naming the folder
  // when it cannot be listed, holds no such file, or its shards hold no window.
  static Sampler from_directory(const std::filesystem::path& dir, std::string_view split,
                                uint32_t seq_len, uint64_t seed, uint32_t bag = 1);

  uint32_t seq_len() const { return seq_len_; }
  uint32_t bag() const { return bag_; }
  // bag() * (seq_len() + 1): the tokens read() writes.
  uint64_t window_tokens() const { return uint64_t{bag_} * (uint64_t{seq_len_} + 1); }
  uint64_t seed() const { return seed_; }
  // W: windows in one epoch (> 0).
  uint64_t windows_per_epoch() const { return total_windows_; }
  size_t num_shards() const { return shards_.size(); }
  const ShardReader& shard(size_t i) const { return *shards_.at(i); }

  // The window with global index `index` (< windows_per_epoch()), in shard order, unshuffled.
  Window window_at(uint64_t index) const;
  // The window that sequence id `sequence_id` trains on.
  Window window(uint64_t sequence_id) const;
  // Writes the window_tokens() tokens of sequence id `sequence_id` to `out`.
  void read(uint64_t sequence_id, TokenId* out) const;

 private:
  // Tokens from one window's start to the next's: bag * seq_len.
  uint64_t stride() const { return uint64_t{bag_} * seq_len_; }
  Sampler(std::vector<std::shared_ptr<const ShardReader>> shards, uint32_t seq_len, uint64_t seed,
          uint32_t bag, const std::string& source);

  std::vector<std::shared_ptr<const ShardReader>> shards_;
  // window_end_[i]: global index one past shard i's last window (a prefix sum).
  std::vector<uint64_t> window_end_;
  uint32_t seq_len_;
  uint32_t bag_;
  uint64_t seed_;
  uint64_t total_windows_ = 0;
};

}  // namespace agora
