#include "agora/core/toml_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "agora/core/error.h"
#include "agora/core/file.h"

namespace agora {
namespace {

bool is_bare_key(std::string_view key) {
  if (key.empty()) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

// A document key as it appears in a dotted path; a key that needs quotes keeps them, so a quoted
// "train.steps" at the top level can never pass for the nested train.steps.
std::string path_segment(std::string_view key) {
  return is_bare_key(key) ? std::string(key) : toml_quote(key);
}

std::string join_path(std::string_view parent, std::string_view segment) {
  return parent.empty() ? std::string(segment) : fmt::format("{}.{}", parent, segment);
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

std::string_view trim(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

// The value as TOML text, for messages.
std::string node_text(const toml::node& node) {
  if (auto v = node.as_integer()) return fmt::format("{}", v->get());
  if (auto v = node.as_floating_point()) return toml_float(v->get());
  if (auto v = node.as_string()) return toml_quote(v->get());
  if (auto v = node.as_boolean()) return v->get() ? "true" : "false";
  if (node.is_table()) return "a table";
  std::ostringstream out;
  node.visit([&](const auto& concrete) { out << concrete; });
  return out.str();
}

// Parses "v = <text>" and returns the value node, or nullopt when `text` is not one TOML value.
std::optional<toml::table> parse_single_value(std::string_view text) {
  try {
    toml::table table = toml::parse(fmt::format("v = {}", text));
    if (table.size() == 1 && table.contains("v")) return table;
  } catch (const toml::parse_error&) {
  }
  return std::nullopt;
}

}  // namespace

std::string IntRange::describe() const {
  constexpr int64_t lowest = std::numeric_limits<int64_t>::min();
  constexpr int64_t highest = std::numeric_limits<int64_t>::max();
  if (min == lowest && max == highest) return "an integer";
  if (max == highest) return fmt::format("an integer >= {}", min);
  if (min == lowest) return fmt::format("an integer <= {}", max);
  return fmt::format("an integer in [{}, {}]", min, max);
}

bool DoubleRange::contains(double value) const {
  if (!std::isfinite(value)) return false;
  if (min_open ? !(value > min) : !(value >= min)) return false;
  if (max_open ? !(value < max) : !(value <= max)) return false;
  return true;
}

std::string DoubleRange::describe() const {
  const bool has_min = std::isfinite(min), has_max = std::isfinite(max);
  if (!has_min && !has_max) return "a finite number";
  if (!has_max) return fmt::format("a number {} {}", min_open ? ">" : ">=", min);
  if (!has_min) return fmt::format("a number {} {}", max_open ? "<" : "<=", max);
  return fmt::format("a number in {}{}, {}{}", min_open ? "(" : "[", min, max,
                     max_open ? ")" : "]");
}

struct TomlConfig::Impl {
  toml::table root;
  std::string source;
  // Every path a getter asked for: the schema, as far as this document is concerned.
  std::set<std::string, std::less<>> known;
  // Path set by an override -> the override's text ("--set a.b=1"); a table's entry covers
  // everything below it.
  std::map<std::string, std::string, std::less<>> overridden;

  // The node at `path`, or nullptr. A non-table on the way is a type error on that prefix.
  const toml::node* find(std::string_view path) const {
    const toml::node* node = &root;
    std::string prefix;
    for (std::string_view part : split_path(path)) {
      if (!node->is_table()) fail_type(prefix, *node, "a table");
      node = node->as_table()->get(part);
      if (node == nullptr) return nullptr;
      prefix = join_path(prefix, part);
    }
    return node;
  }

  std::string where(std::string_view path) const {
    // The longest overridden prefix of `path` (itself or a table above it).
    for (std::string_view probe = path;;) {
      if (auto it = overridden.find(probe); it != overridden.end()) return it->second;
      const size_t dot = probe.rfind('.');
      if (dot == std::string_view::npos) return source;
      probe = probe.substr(0, dot);
    }
  }

  // "<source>: <path> = <value>" or, for an overridden key, just the override's text: it already
  // shows both.
  std::string subject(std::string_view path, const toml::node& node) const {
    std::string origin = where(path);
    if (origin != source) return origin;
    return fmt::format("{}: {} = {}", source, path, node_text(node));
  }

  [[noreturn]] void fail_type(std::string_view path, const toml::node& node,
                              std::string_view expected) const {
    fail("{}: expected {}", subject(path, node), expected);
  }

  [[noreturn]] void fail_range(std::string_view path, const toml::node& node,
                               std::string_view allowed) const {
    fail("{} is invalid (allowed: {})", subject(path, node), allowed);
  }

  const toml::node* read(std::string_view path) {
    known.emplace(path);
    return find(path);
  }

  void collect_unknown(const toml::table& table, const std::string& prefix,
                       std::vector<std::string>& unknown) const {
    for (const auto& [key, node] : table) {
      const std::string path = join_path(prefix, path_segment(key.str()));
      if (known.count(path) != 0) continue;
      const toml::table* child = node.as_table();
      // Recurse into tables, known or not, so a misspelt table reports the leaf the user typed
      // ("optimzer.lr"); an empty one is reported itself.
      if (child != nullptr && !child->empty()) {
        collect_unknown(*child, path, unknown);
      } else {
        unknown.push_back(path);
      }
    }
  }

  // "(did you mean 'x'?)" or "(allowed in [t]: a, b, c)".
  std::string hint(std::string_view unknown_path) const {
    std::string best;
    size_t best_distance = std::string::npos;
    std::set<std::string> candidates(known.begin(), known.end());
    for (const std::string& path : known) {
      for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1)) {
        candidates.insert(path.substr(0, dot));
      }
    }
    for (const std::string& candidate : candidates) {
      const size_t distance = edit_distance(unknown_path, candidate);
      if (distance < best_distance) best = candidate, best_distance = distance;
    }
    if (!best.empty() && (best_distance <= 2 || best_distance * 3 <= best.size()) &&
        best_distance < best.size()) {
      return fmt::format("did you mean '{}'?", best);
    }
    // No close match: list what the innermost known table around the key allows.
    std::string table(unknown_path);
    for (;;) {
      const size_t dot = table.rfind('.');
      table = dot == std::string::npos ? "" : table.substr(0, dot);
      if (table.empty() || candidates.count(table) != 0) break;
    }
    std::set<std::string> allowed;
    for (const std::string& path : known) {
      if (!table.empty() && path.compare(0, table.size() + 1, table + ".") != 0) continue;
      std::string_view rest = std::string_view(path).substr(table.empty() ? 0 : table.size() + 1);
      allowed.emplace(rest.substr(0, rest.find('.')));
    }
    if (allowed.empty()) return "no keys are allowed here";
    if (table.empty()) return fmt::format("allowed at the top level: {}", fmt::join(allowed, ", "));
    return fmt::format("allowed in [{}]: {}", table, fmt::join(allowed, ", "));
  }
};

TomlConfig::TomlConfig(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TomlConfig::TomlConfig(TomlConfig&&) noexcept = default;
TomlConfig& TomlConfig::operator=(TomlConfig&&) noexcept = default;
TomlConfig::~TomlConfig() = default;

TomlConfig TomlConfig::parse(std::string_view text, std::string_view source_name) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::string(source_name);
  try {
    impl->root = toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    fail("{}:{}:{}: invalid TOML: {}", source_name, error.source().begin.line,
         error.source().begin.column, error.description());
  }
  return TomlConfig(std::move(impl));
}

TomlConfig TomlConfig::load(const std::filesystem::path& path) {
  return parse(read_file(path), path.string());
}

void TomlConfig::apply_override(std::string_view assignment) {
  const std::string origin = fmt::format("--set {}", assignment);
  const size_t equals = assignment.find('=');
  if (equals == std::string_view::npos) {
    fail("{}: expected key=value (for example optimizer.lr=3e-4)", origin);
  }
  const std::string_view key = trim(assignment.substr(0, equals));
  const std::string_view text = trim(assignment.substr(equals + 1));
  const std::vector<std::string_view> parts = split_path(key);
  for (std::string_view part : parts) {
    if (!is_bare_key(part)) {
      fail(
          "{}: '{}' is not a valid key (allowed: dotted names of letters, digits, '_' and '-', "
          "like optimizer.lr)",
          origin, key);
    }
  }

  // A TOML value if it is one, else the text as a bare string. Going through a quoted TOML string
  // also rejects text that is not UTF-8, which could not be written back out.
  std::optional<toml::table> holder = parse_single_value(text);
  if (!holder) holder = parse_single_value(toml_quote(text));
  if (!holder) fail("{}: the value is not valid UTF-8", origin);

  toml::table* table = &impl_->root;
  std::string prefix;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix = join_path(prefix, parts[i]);
    toml::node* node = table->get(parts[i]);
    if (node == nullptr) node = &table->insert_or_assign(parts[i], toml::table{}).first->second;
    if (!node->is_table()) {
      fail("{}: cannot set a key inside {}, which is {} (expected a table)", origin, prefix,
           node_text(*node));
    }
    table = node->as_table();
  }
  holder->get("v")->visit(
      [&](auto& value) { table->insert_or_assign(parts.back(), std::move(value)); });

  // This override now owns the key and everything below it.
  const std::string path(key);
  std::erase_if(impl_->overridden, [&](const auto& entry) {
    return entry.first == path || entry.first.compare(0, path.size() + 1, path + ".") == 0;
  });
  impl_->overridden.emplace(path, origin);
}

bool TomlConfig::has(std::string_view path) {
  return impl_->find(path) != nullptr;
}

int64_t TomlConfig::get_int(std::string_view path, int64_t fallback, IntRange range) {
  const toml::node* node = impl_->read(path);
  if (node == nullptr) return fallback;
  const auto* value = node->as_integer();
  if (value == nullptr) impl_->fail_type(path, *node, range.describe());
  if (!range.contains(value->get())) impl_->fail_range(path, *node, range.describe());
  return value->get();
}

uint64_t TomlConfig::get_uint64(std::string_view path, uint64_t fallback) {
  constexpr std::string_view allowed =
      "an integer in [0, 18446744073709551615]; quote values above 9223372036854775807";
  const toml::node* node = impl_->read(path);
  if (node == nullptr) return fallback;
  if (const auto* value = node->as_integer()) {
    if (value->get() < 0) impl_->fail_range(path, *node, allowed);
    return static_cast<uint64_t>(value->get());
  }
  if (const auto* value = node->as_string()) {
    const std::string& digits = value->get();
    uint64_t result = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), result);
    const bool all_digits =
        !digits.empty() &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!all_digits || error != std::errc() || end != digits.data() + digits.size()) {
      impl_->fail_range(path, *node, allowed);
    }
    return result;
  }
  impl_->fail_type(path, *node, allowed);
}

double TomlConfig::get_double(std::string_view path, double fallback, DoubleRange range) {
  const toml::node* node = impl_->read(path);
  if (node == nullptr) return fallback;
  double value = 0;
  if (const auto* integer = node->as_integer()) {
    value = static_cast<double>(integer->get());
  } else if (const auto* floating = node->as_floating_point()) {
    value = floating->get();
  } else {
    impl_->fail_type(path, *node, range.describe());
  }
  if (!range.contains(value)) impl_->fail_range(path, *node, range.describe());
  return value;
}

bool TomlConfig::get_bool(std::string_view path, bool fallback) {
  const toml::node* node = impl_->read(path);
  if (node == nullptr) return fallback;
  const auto* value = node->as_boolean();
  if (value == nullptr) impl_->fail_type(path, *node, "true or false");
  return value->get();
}

std::string TomlConfig::get_string(std::string_view path, std::string_view fallback,
                                   bool allow_empty) {
  const char* allowed = allow_empty ? "a string" : "a non-empty string";
  const toml::node* node = impl_->read(path);
  if (node == nullptr) return std::string(fallback);
  const auto* value = node->as_string();
  if (value == nullptr) impl_->fail_type(path, *node, allowed);
  if (!allow_empty && value->get().empty()) impl_->fail_range(path, *node, allowed);
  return value->get();
}

std::string TomlConfig::get_choice(std::string_view path, std::string_view fallback,
                                   const std::vector<std::string>& allowed) {
  std::vector<std::string> quoted;
  for (const std::string& choice : allowed) quoted.push_back(toml_quote(choice));
  const std::string description = fmt::format("{}", fmt::join(quoted, ", "));
  const toml::node* node = impl_->read(path);
  if (node == nullptr) return std::string(fallback);
  const auto* value = node->as_string();
  if (value == nullptr) impl_->fail_type(path, *node, fmt::format("one of {}", description));
  if (std::find(allowed.begin(), allowed.end(), value->get()) == allowed.end()) {
    impl_->fail_range(path, *node, description);
  }
  return value->get();
}

void TomlConfig::reject_unknown_keys() const {
  std::vector<std::string> unknown;
  impl_->collect_unknown(impl_->root, "", unknown);
  if (unknown.empty()) return;
  std::vector<std::string> lines;
  for (const std::string& path : unknown) {
    lines.push_back(
        fmt::format("{}: unknown key '{}' ({})", impl_->where(path), path, impl_->hint(path)));
  }
  fail("{}", fmt::join(lines, "\n"));
}

std::string TomlConfig::where(std::string_view path) const {
  return impl_->where(path);
}

void TomlConfig::fail_invalid(std::string_view path, std::string_view allowed) const {
  const toml::node* node = impl_->find(path);
  if (node == nullptr) fail("{}: {} is invalid (allowed: {})", impl_->where(path), path, allowed);
  impl_->fail_range(path, *node, allowed);
}

const std::string& TomlConfig::source_name() const {
  return impl_->source;
}

std::string toml_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        // Other control characters may not appear raw in a basic string.
        if (byte < 0x20 || byte == 0x7f) {
          out += fmt::format("\\u{:04X}", byte);
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string toml_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // fmt's shortest form reads back to the same double; it may lack a '.' or exponent ("1").
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rows of the dynamic programme: two back is needed for transpositions.
  std::vector<size_t> two_back(b.size() + 1), previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], two_back[j - 2] + 1);
      }
    }
    std::swap(two_back, previous);
    std::swap(previous, current);
  }
  return previous[b.size()];
}

}  // namespace agora
