#include "agora/data/sampler.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "agora/core/error.h"

namespace agora {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15;
// "agorasmp": keeps these keys apart from any other use of splitmix64 on the same seed.
constexpr uint64_t kDomain = 0x61676f7261736d70;

// splitmix64's output for state z (Steele, Lea and Flood 2014; the same constants as Java's
// SplittableRandom): a bijection on 64-bit words with good avalanche.
uint64_t mix(uint64_t z) {
  z += kGolden;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}

uint64_t low_mask(int bits) {
  return bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}

// True when the file name, split at '_', has `split` as one of its words (the ".bin" removed).
bool names_split(const std::string& file_name, std::string_view split) {
  constexpr std::string_view kExt = ".bin";
  if (file_name.size() <= kExt.size() || !file_name.ends_with(kExt)) return false;
  const std::string_view stem(file_name.data(), file_name.size() - kExt.size());
  size_t start = 0;
  while (start <= stem.size()) {
    size_t end = stem.find('_', start);
    if (end == std::string_view::npos) end = stem.size();
    if (stem.substr(start, end - start) == split) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// KeyedPermutation

KeyedPermutation::KeyedPermutation(uint64_t size, uint64_t seed, uint64_t epoch) : size_(size) {
  if (size == 0) fail("KeyedPermutation: size is 0; a permutation needs at least one element");
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < size) ++bits;
  high_bits_ = bits / 2;
  low_bits_ = bits - high_bits_;
  const uint64_t base = mix(mix(seed ^ kDomain) ^ epoch);
  for (int r = 0; r < kRounds; ++r) keys_[r] = mix(base + static_cast<uint64_t>(r + 1) * kGolden);
}

uint64_t KeyedPermutation::network(uint64_t x) const {
  const uint64_t low_m = low_mask(low_bits_);
  const uint64_t high_m = low_mask(high_bits_);
  uint64_t left = (x >> low_bits_) & high_m;
  uint64_t right = x & low_m;
  for (int r = 0; r < kRounds; ++r) {
    if (r % 2 == 0) {
      left ^= mix(keys_[r] ^ right) & high_m;
    } else {
      right ^= mix(keys_[r] ^ left) & low_m;
    }
  }
  // low_bits_ <= 32, so the shift is defined; when high_bits_ is 0, left is 0.
  return (left << low_bits_) | right;
}

uint64_t KeyedPermutation::operator()(uint64_t k) const {
  if (k >= size_) fail("KeyedPermutation: index {} is out of range [0, {})", k, size_);
  // Cycle walking: the network permutes [0, 2^b); following k's cycle until it re-enters
  // [0, size) restricts it to a permutation of [0, size). Terminates because k's cycle contains
  // k itself.
  uint64_t x = k;
  do {
    x = network(x);
  } while (x >= size_);
  return x;
}

// ---------------------------------------------------------------------------------------------
// Sampler

Sampler::Sampler(std::vector<std::shared_ptr<const ShardReader>> shards, uint32_t seq_len,
                 uint64_t seed, uint32_t bag)
    : Sampler(std::move(shards), seq_len, seed, bag, "") {}

Sampler::Sampler(std::vector<std::shared_ptr<const ShardReader>> shards, uint32_t seq_len,
                 uint64_t seed, uint32_t bag, const std::string& source)
    : shards_(std::move(shards)), seq_len_(seq_len), bag_(bag), seed_(seed) {
  if (shards_.empty()) fail("sampler: no shards given{}", source.empty() ? "" : " by " + source);
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (!shards_[i]) fail("sampler: shard {} is null", i);
  }
  if (shards_.size() > UINT32_MAX) {
    fail("sampler: {} shards, at most {}", shards_.size(), UINT32_MAX);
  }
  if (seq_len == 0) fail("sampler: seq_len is 0; a window needs at least one input token");
  if (bag == 0) fail("sampler: bag is 0; a bag holds at least one token");
  const std::string where = source.empty()
                                ? fmt::format("{} shard(s) starting with {}", shards_.size(),
                                              shards_.front()->path().string())
                                : source;
  window_end_.reserve(shards_.size());
  uint64_t total_tokens = 0;
  for (const auto& shard : shards_) {
    const uint64_t n = shard->num_tokens();
    total_tokens += n;
    total_windows_ += n < window_tokens() ? 0 : (n - bag_) / stride();
    window_end_.push_back(total_windows_);
  }
  if (total_windows_ == 0) {
    fail(
        "sampler: {} hold(s) {} tokens in all, but no shard has the {} tokens that one window of "
        "seq_len {}{} needs",
        where, total_tokens, window_tokens(), seq_len_,
        bag_ > 1 ? fmt::format(" in bags of {}", bag_) : "");
  }
}

Sampler Sampler::from_directory(const std::filesystem::path& dir, std::string_view split,
                                uint32_t seq_len, uint64_t seed, uint32_t bag) {
  if (split.empty() || split.find_first_of("_/") != std::string_view::npos) {
    fail("sampler: split name \"{}\" is not allowed; use a word such as \"train\" or \"val\"",
         split);
  }
  std::vector<std::filesystem::path> paths;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) fail("sampler: cannot list shard folder {}: {}", dir.string(), ec.message());
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::filesystem::path& path = it->path();
    // A name that cannot be stat'ed (a dangling link) is not a shard; skip it, not the listing.
    std::error_code stat_ec;
    if (names_split(path.filename().string(), split) && it->is_regular_file(stat_ec)) {
      paths.push_back(path);
    }
  }
  if (ec) fail("sampler: cannot list shard folder {}: {}", dir.string(), ec.message());
  if (paths.empty()) {
    fail(
        "sampler: no \"{}\" shards in {}: expected files named {}_*.bin (or *_{}_*.bin as llm.c "
        "names them)",
        split, dir.string(), split, split);
  }
  // Byte order of the names, not locale order: every peer must list the shards identically.
  std::sort(paths.begin(), paths.end(), [](const auto& a, const auto& b) {
    return a.filename().string() < b.filename().string();
  });
  std::vector<std::shared_ptr<const ShardReader>> shards;
  shards.reserve(paths.size());
  for (const auto& path : paths) {
    shards.push_back(std::make_shared<const ShardReader>(ShardReader::open(path)));
  }
  return Sampler(std::move(shards), seq_len, seed, bag,
                 fmt::format("the {} \"{}\" shard(s) in {}", paths.size(), split, dir.string()));
}

Sampler::Window Sampler::window_at(uint64_t index) const {
  if (index >= total_windows_) {
    fail("sampler: window index {} is out of range; there are {} windows", index, total_windows_);
  }
  // The first shard whose windows end after `index`; shards without windows are skipped since
  // their end equals their predecessor's.
  const auto it = std::upper_bound(window_end_.begin(), window_end_.end(), index);
  const size_t shard = static_cast<size_t>(it - window_end_.begin());
  const uint64_t shard_begin = shard == 0 ? 0 : window_end_[shard - 1];
  return Window{static_cast<uint32_t>(shard), (index - shard_begin) * stride()};
}

Sampler::Window Sampler::window(uint64_t sequence_id) const {
  const uint64_t epoch = sequence_id / total_windows_;
  const uint64_t slot = sequence_id % total_windows_;
  return window_at(KeyedPermutation(total_windows_, seed_, epoch)(slot));
}

void Sampler::read(uint64_t sequence_id, TokenId* out) const {
  const Window w = window(sequence_id);
  shards_[w.shard]->copy(w.first_token, window_tokens(), out);
}

}  // namespace agora
