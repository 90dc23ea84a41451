// TomlConfig, the generic layer under RunConfig: typed getters, ranges, override parsing and
// origin tracking, unknown-key detection and the TOML writers' helpers.
#include "agora/core/toml_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "agora/core/error.h"

namespace agora {
namespace {

// The message of the Error `body` throws; fails the test when none is thrown.
template <typename Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(TomlConfigTest, GettersReturnValuesOrFallbacks) {
  TomlConfig config = TomlConfig::parse(
      "a = 3\nb = 2.5\nc = true\nd = \"text\"\n[t]\nn = -4\nf = 7\n[t.u]\nv = \"deep\"\n", "doc");
  EXPECT_EQ(config.get_int("a", 0), 3);
  EXPECT_EQ(config.get_double("b", 0), 2.5);
  EXPECT_TRUE(config.get_bool("c", false));
  EXPECT_EQ(config.get_string("d", ""), "text");
  EXPECT_EQ(config.get_int("t.n", 0), -4);
  EXPECT_EQ(config.get_double("t.f", 0), 7.0);  // an integer is a fine float
  EXPECT_EQ(config.get_string("t.u.v", ""), "deep");
  EXPECT_EQ(config.get_int("missing", 42), 42);
  EXPECT_EQ(config.get_string("t.missing", "x"), "x");
  EXPECT_EQ(config.get_uint64("t.absent.deeper", 5), 5u);
  EXPECT_TRUE(config.has("t.u.v"));
  EXPECT_FALSE(config.has("t.u.w"));
  EXPECT_NO_THROW(config.reject_unknown_keys());
  EXPECT_EQ(config.source_name(), "doc");
  EXPECT_EQ(config.where("t.n"), "doc");
}

TEST(TomlConfigTest, Uint64AcceptsIntegersAndQuotedDecimals) {
  TomlConfig config = TomlConfig::parse(
      "a = 0\nb = 9223372036854775807\nc = \"18446744073709551615\"\n"
      "d = \"\"\ne = \"+1\"\nf = \" 1\"\n",
      "doc");
  EXPECT_EQ(config.get_uint64("a", 1), 0u);
  EXPECT_EQ(config.get_uint64("b", 1), 9223372036854775807u);
  EXPECT_EQ(config.get_uint64("c", 1), 18446744073709551615u);
  EXPECT_THROW(config.get_uint64("d", 1), Error);
  EXPECT_THROW(config.get_uint64("e", 1), Error);
  EXPECT_THROW(config.get_uint64("f", 1), Error);
}

TEST(TomlConfigTest, RangesDescribeThemselves) {
  EXPECT_EQ(IntRange{}.describe(), "an integer");
  EXPECT_EQ((IntRange{1, std::numeric_limits<int64_t>::max()}.describe()), "an integer >= 1");
  EXPECT_EQ((IntRange{std::numeric_limits<int64_t>::min(), 9}.describe()), "an integer <= 9");
  EXPECT_EQ((IntRange{0, 10}.describe()), "an integer in [0, 10]");
  EXPECT_EQ(DoubleRange{}.describe(), "a finite number");
  EXPECT_EQ(DoubleRange::greater_than(0).describe(), "a number > 0");
  EXPECT_EQ(DoubleRange::at_least(0.5).describe(), "a number >= 0.5");
  EXPECT_EQ(DoubleRange::between(0, 1, false, true).describe(), "a number in [0, 1)");
  EXPECT_EQ(DoubleRange::between(0, 1, true, false).describe(), "a number in (0, 1]");
  EXPECT_FALSE(DoubleRange{}.contains(std::nan("")));
  EXPECT_FALSE(DoubleRange{}.contains(std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(DoubleRange::between(0, 1).contains(1.0));
  EXPECT_FALSE(DoubleRange::between(0, 1, false, true).contains(1.0));
  EXPECT_FALSE(DoubleRange::greater_than(0).contains(0.0));
}

TEST(TomlConfigTest, OverridesParseTomlValuesAndFallBackToStrings) {
  TomlConfig config = TomlConfig::parse("[a]\nx = 1\n", "doc");
  config.apply_override("a.x=2");
  config.apply_override("a.f=3e-4");
  config.apply_override("a.s=\"quoted\"");
  config.apply_override("a.bare=small");
  config.apply_override("a.path=data/tokens/x");
  config.apply_override("a.empty=");
  config.apply_override("a.list=[1, 2]");
  config.apply_override("new.table.key=true");
  config.apply_override("a.two=1 2");  // not one TOML value: a string
  config.apply_override("a.eq=x=y");   // only the first '=' splits
  EXPECT_EQ(config.get_int("a.x", 0), 2);
  EXPECT_EQ(config.get_double("a.f", 0), 3e-4);
  EXPECT_EQ(config.get_string("a.s", ""), "quoted");
  EXPECT_EQ(config.get_string("a.bare", ""), "small");
  EXPECT_EQ(config.get_string("a.path", ""), "data/tokens/x");
  EXPECT_EQ(config.get_string("a.empty", "fallback"), "");
  EXPECT_TRUE(config.get_bool("new.table.key", false));
  EXPECT_EQ(config.get_string("a.two", ""), "1 2");
  EXPECT_EQ(config.get_string("a.eq", ""), "x=y");
  EXPECT_EQ(error_of([&] { config.get_int("a.list", 0); }),
            "--set a.list=[1, 2]: expected an integer");
  EXPECT_EQ(config.where("a.x"), "--set a.x=2");
  EXPECT_EQ(config.where("new.table.key"), "--set new.table.key=true");
  EXPECT_EQ(config.where("new.table"), "doc");
}

TEST(TomlConfigTest, OverrideOfATableOwnsEverythingBelow) {
  TomlConfig config = TomlConfig::parse("", "doc");
  config.apply_override("t.a=1");
  config.apply_override("t={a = 2, b = 3}");
  EXPECT_EQ(config.where("t.a"), "--set t={a = 2, b = 3}");
  EXPECT_EQ(config.get_int("t.a", 0), 2);
  config.apply_override("t.b=4");
  EXPECT_EQ(config.where("t.b"), "--set t.b=4");
  EXPECT_EQ(config.where("t.a"), "--set t={a = 2, b = 3}");
  config.apply_override("t.b-c=5");
  config.apply_override("t=0");
  EXPECT_EQ(config.where("t.b-c"), "--set t=0");
}

TEST(TomlConfigTest, FailInvalidNamesTheOrigin) {
  TomlConfig config = TomlConfig::parse("[a]\nx = 1\n", "doc");
  EXPECT_EQ(error_of([&] { config.fail_invalid("a.x", "an odd integer > 1"); }),
            "doc: a.x = 1 is invalid (allowed: an odd integer > 1)");
  EXPECT_EQ(error_of([&] { config.fail_invalid("a.y", "set"); }),
            "doc: a.y is invalid (allowed: set)");
  config.apply_override("a.x=8");
  EXPECT_EQ(error_of([&] { config.fail_invalid("a.x", "an odd integer > 1"); }),
            "--set a.x=8 is invalid (allowed: an odd integer > 1)");
}

TEST(TomlConfigTest, UnknownKeys) {
  TomlConfig config =
      TomlConfig::parse("[alpha]\nbeta = 1\ngamma = 2\n[empty]\n[delta]\nx = 1\n", "doc");
  config.get_int("alpha.beta", 0);
  config.get_int("alpha.epsilon", 0);
  config.get_int("zeta.x", 0);
  EXPECT_EQ(error_of([&] { config.reject_unknown_keys(); }),
            "doc: unknown key 'alpha.gamma' (allowed in [alpha]: beta, epsilon)\n"
            "doc: unknown key 'delta.x' (did you mean 'zeta.x'?)\n"
            "doc: unknown key 'empty' (allowed at the top level: alpha, zeta)");
}

TEST(TomlConfigTest, SyntaxErrors) {
  EXPECT_EQ(
      error_of([] { TomlConfig::parse("a = 1\nb = \n", "doc.toml"); }).rfind("doc.toml:2:", 0), 0u);
  const std::string message = error_of([] { TomlConfig::parse("a = 1\na = 2\n", "doc.toml"); });
  EXPECT_EQ(message.rfind("doc.toml:2:", 0), 0u) << message;
  EXPECT_NE(message.find(": invalid TOML: "), std::string::npos) << message;
  EXPECT_THROW(TomlConfig::load("/nonexistent/agora.toml"), Error);
}

TEST(TomlConfigTest, TomlWriters) {
  EXPECT_EQ(toml_quote("plain"), "\"plain\"");
  EXPECT_EQ(toml_quote("a\"b\\c\nd\te\x01\x7f"), "\"a\\\"b\\\\c\\nd\\te\\u0001\\u007F\"");
  EXPECT_EQ(toml_quote("é"), "\"é\"");
  EXPECT_EQ(toml_float(1.0), "1.0");
  EXPECT_EQ(toml_float(-0.0), "-0.0");
  EXPECT_EQ(toml_float(0.003), "0.003");
  EXPECT_EQ(toml_float(1e-8), "1e-08");
  EXPECT_EQ(toml_float(1e20), "1e+20");
  EXPECT_EQ(toml_float(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(toml_float(std::nan("")), "nan");
  for (double value : {0.1, 1.0 / 3.0, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.0}) {
    TomlConfig config = TomlConfig::parse("v = " + toml_float(value), "doc");
    EXPECT_EQ(config.get_double("v", 0), value) << toml_float(value);
  }
}

TEST(TomlConfigTest, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("optimzer", "optimizer"), 1u);
  EXPECT_EQ(edit_distance("lr", "rl"), 1u);  // a transposition is one edit
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
}

}  // namespace
}  // namespace agora
