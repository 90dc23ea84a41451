// TomlConfig: a parsed TOML document that hands out typed, range-checked values by dotted path and
// rejects every key nobody asked for.
//
// A schema is the code that reads it: a loader calls get_int("train.steps", 1000, ...) and friends
// for every key it knows, then reject_unknown_keys(). What it promises:
//   - every value is the type asked for (an integer key rejects 1.5 and "3"; a float key accepts 3)
//     and inside its range, or an Error names where it came from, the key, the value and what is
//     allowed: "configs/local.toml: optimizer.lr = -0.1 is invalid (allowed: a number > 0)";
//   - a key present in the document that no getter read is an error with the nearest known key as
//     a suggestion, so a typo never silently falls back to a default:
//     "configs/x.toml: unknown key 'optimzer.lr' (did you mean 'optimizer.lr'?)";
//   - a TOML syntax error names the source, line and column;
//   - a value set by apply_override ("--set a.b=value") is reported as coming from that override,
//     not from the file: "--set train.steps=abc: expected an integer".
// Only agora::Error leaves this class. toml++ stays out of this header (it is heavy to compile).
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace agora {

// Inclusive bounds on an integer key.
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();

  bool contains(int64_t value) const { return value >= min && value <= max; }
  // "an integer >= 1", "an integer in [0, 10]", "an integer".
  std::string describe() const;
};

// Bounds on a float key, each inclusive or open; NaN and infinities are never in range.
struct DoubleRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;
  bool max_open = false;

  static DoubleRange at_least(double min) { return {min, DoubleRange{}.max, false, false}; }
  static DoubleRange greater_than(double min) { return {min, DoubleRange{}.max, true, false}; }
  static DoubleRange between(double min, double max, bool min_open = false, bool max_open = false) {
    return {min, max, min_open, max_open};
  }

  bool contains(double value) const;
  // "a number > 0", "a number in [0, 1)", "a finite number".
  std::string describe() const;
};

class TomlConfig {
 public:
  // Throws Error "<source_name>:<line>:<column>: invalid TOML: <what>" on a syntax error.
  static TomlConfig parse(std::string_view text, std::string_view source_name);
  // Reads and parses the file; its path is the source name in every message.
  static TomlConfig load(const std::filesystem::path& path);

  TomlConfig(TomlConfig&&) noexcept;
  TomlConfig& operator=(TomlConfig&&) noexcept;
  ~TomlConfig();

  // Applies "a.b.c=value": the value is parsed as a TOML value (3e-4, true, "small", [1, 2]);
  // text that is not one is taken as a bare string, so "model.preset=small" works unquoted.
  // Missing tables along the path are created; the key must be dotted bare names. Throws Error
  // naming the assignment when it has no '=', a bad key, or a path through a non-table.
  void apply_override(std::string_view assignment);

  // Whether the document (after overrides) holds a value at `path`.
  bool has(std::string_view path);

  // Typed getters: the value at `path`, or `fallback` when absent. Each marks `path` as known,
  // whether or not it is present, and throws Error on a wrong type or an out-of-range value.
  int64_t get_int(std::string_view path, int64_t fallback, IntRange range = {});
  // Any 64-bit unsigned: a TOML integer >= 0, or a quoted decimal string for values above
  // INT64_MAX (TOML integers are signed 64-bit).
  uint64_t get_uint64(std::string_view path, uint64_t fallback);
  double get_double(std::string_view path, double fallback, DoubleRange range = {});
  bool get_bool(std::string_view path, bool fallback);
  std::string get_string(std::string_view path, std::string_view fallback, bool allow_empty = true);
  // A string that must be one of `allowed`.
  std::string get_choice(std::string_view path, std::string_view fallback,
                         const std::vector<std::string>& allowed);

  // Throws Error listing every present key that no getter has read, each with a did-you-mean
  // suggestion or, failing a close one, the keys allowed in its table. Call after reading all.
  void reject_unknown_keys() const;

  // Where the value at `path` came from: the "--set ..." assignment that last set it (or a table
  // above it), else the source name. For messages about keys the getters cannot check alone.
  std::string where(std::string_view path) const;
  // Throws Error "<where>: <path> = <value> is invalid (allowed: <allowed>)" for a present key;
  // for cross-field rules a caller has checked itself.
  [[noreturn]] void fail_invalid(std::string_view path, std::string_view allowed) const;

  const std::string& source_name() const;

 private:
  struct Impl;
  explicit TomlConfig(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// TOML text for a value, for writers that emit TOML by hand: a basic string with every escape
// needed ("a\"b"), and a float that reads back bit-identical and always parses as a float
// (1.0, not 1). Non-finite doubles are written as inf / -inf / nan.
std::string toml_quote(std::string_view text);
std::string toml_float(double value);

// Optimal-string-alignment edit distance (insertions, deletions, substitutions, transpositions of
// neighbours); what the did-you-mean suggestions are ranked by.
size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace agora
