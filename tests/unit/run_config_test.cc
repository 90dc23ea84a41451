// RunConfig: defaults, the example configs, --set overrides, every error path with its message,
// the to_toml round trip and the learning-rate schedules at their boundaries.
#include "agora/config/run_config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "agora/core/error.h"

namespace agora {
namespace {

const std::filesystem::path kConfigs = std::filesystem::path(AGORA_SOURCE_DIR) / "configs";

RunConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return RunConfig::parse(text, "configs/x.toml", overrides);
}

// The message of the Error that parsing throws; fails the test when none is thrown.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

void expect_round_trip(const RunConfig& config) {
  const std::string text = config.to_toml();
  const RunConfig again = RunConfig::parse(text, "to_toml", {});
  EXPECT_TRUE(again == config) << text << "\n---\n" << again.to_toml();
  EXPECT_EQ(again.to_toml(), text);
}

TEST(RunConfigTest, EmptyDocumentGivesEveryDefault) {
  const RunConfig config = parse("");
  EXPECT_TRUE(config == RunConfig{});
  EXPECT_EQ(config.seed, 1234u);
  EXPECT_EQ(config.model.preset, "small");
  EXPECT_EQ(config.model.vocab_size, 0);
  EXPECT_EQ(config.model.max_seq_len, 256);
  EXPECT_EQ(config.model.hidden_size, 288);
  EXPECT_EQ(config.model.num_layers, 6);
  EXPECT_TRUE(config.model_overrides.empty());
  EXPECT_EQ(config.data.dir, "data/tokens/sp8k");
  EXPECT_EQ(config.data.seq_len, 256);
  EXPECT_EQ(config.train.steps, 1000);
  EXPECT_EQ(config.train.batch_size, 32);
  EXPECT_EQ(config.train.micro_batch_size, 8);
  EXPECT_EQ(config.train.accumulation_steps(), 4);
  EXPECT_EQ(config.train.eval_interval, 100);
  EXPECT_EQ(config.train.eval_windows, 32);
  EXPECT_EQ(config.train.checkpoint_interval, 0);
  EXPECT_EQ(config.train.log_interval, 10);
  EXPECT_EQ(config.train.out_dir, "runs/default");
  EXPECT_EQ(config.train.device, "auto");
  EXPECT_EQ(config.train.dtype, "float32");
  EXPECT_EQ(config.train.threads, 0);
  EXPECT_EQ(config.optimizer.name, "demo");
  EXPECT_EQ(config.demo.beta, 0.999);
  EXPECT_EQ(config.demo.topk, 32);
  EXPECT_EQ(config.demo.chunk, 64);
  EXPECT_FALSE(config.demo.one_bit);
  EXPECT_FALSE(config.demo.lookahead);
  EXPECT_EQ(config.adamw.gradient_dtype, "float32");
  EXPECT_EQ(config.diloco.inner_steps, 50);
  EXPECT_EQ(config.diloco.outer_lr, 0.7);
  EXPECT_EQ(config.diloco.outer_momentum, 0.9);
  EXPECT_EQ(config.diloco.pseudo_gradient_dtype, "float32");
  EXPECT_EQ(config.optimizer.lr, 3e-3);
  EXPECT_EQ(config.optimizer.beta1, 0.9);
  EXPECT_EQ(config.optimizer.beta2, 0.95);
  EXPECT_EQ(config.optimizer.eps, 1e-8);
  EXPECT_EQ(config.optimizer.weight_decay, 0.1);
  EXPECT_EQ(config.optimizer.grad_clip, 1.0);
  EXPECT_EQ(config.schedule.kind, "cosine");
  EXPECT_EQ(config.schedule.warmup_steps, 100);
  EXPECT_EQ(config.schedule.min_lr_ratio, 0.1);
  EXPECT_EQ(config.schedule.decay_fraction, 0.2);
  EXPECT_EQ(config.tst.bag, 1);
  EXPECT_EQ(config.tst.fraction, 0.0);
  EXPECT_EQ(config.tst_switch_step(), 0);
}

TEST(RunConfigTest, DataHashIsSixtyFourHexDigitsOrNothing) {
  EXPECT_EQ(parse("").data.hash, "");
  EXPECT_EQ(parse("").to_toml().find("hash ="), std::string::npos);  // old runs keep their TOML
  const std::string hash(64, 'a');
  const RunConfig config = parse("[data]\nhash = \"" + hash + "\"\n");
  EXPECT_EQ(config.data.hash, hash);
  expect_round_trip(config);
  EXPECT_EQ(parse("", {"data.hash=" + hash}).data.hash, hash);
  for (const std::string& bad : {std::string(63, 'a'), std::string(64, 'A'), std::string(64, 'g'),
                                 "0x" + std::string(62, 'a')}) {
    const std::string message = error_of("", {"data.hash=" + bad});
    EXPECT_NE(message.find("data.hash"), std::string::npos) << message;
    EXPECT_NE(message.find("64 lowercase hex digits"), std::string::npos) << message;
  }
}

TEST(RunConfigTest, ExampleConfigsLoadAndRoundTrip) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    const RunConfig config = RunConfig::load(entry.path(), {});
    expect_round_trip(config);
    ++count;
  }
  EXPECT_GE(count, 3);
}

TEST(RunConfigTest, DemoConfig) {
  const RunConfig config = RunConfig::load(kConfigs / "local.toml", {});
  EXPECT_EQ(config.model.preset, "small");
  EXPECT_EQ(config.data.dir, "data/tokens/sp8k");
  EXPECT_EQ(config.data.seq_len, 256);
  EXPECT_EQ(config.model.max_seq_len, 256);
  // `make demo` reads runs/local/latest; the step counts are tuned for time and not pinned here.
  EXPECT_EQ(config.train.out_dir, "runs/local");
  EXPECT_EQ(config.train.checkpoint_interval, 0);
  EXPECT_LT(config.schedule.warmup_steps, config.train.steps);
  EXPECT_EQ(config.train.batch_size % config.train.micro_batch_size, 0);
}

TEST(RunConfigTest, TinyAndGpt2Configs) {
  RunConfig tiny = RunConfig::load(kConfigs / "tiny.toml", {});
  EXPECT_EQ(tiny.model.preset, "tiny");
  EXPECT_EQ(tiny.model.hidden_size, 64);
  EXPECT_EQ(tiny.data.seq_len, 64);
  EXPECT_EQ(tiny.train.steps, 50);
  EXPECT_EQ(tiny.train.batch_size, 8);
  EXPECT_EQ(tiny.train.micro_batch_size, 4);
  tiny.set_vocab_size(8192);
  EXPECT_EQ(tiny.model.vocab_size, 8192);
  expect_round_trip(tiny);

  const RunConfig gpt2 = RunConfig::load(kConfigs / "gpt2-124m.toml", {});
  EXPECT_EQ(gpt2.model.preset, "gpt2-124m");
  EXPECT_EQ(gpt2.data.dir, "data/tokens/gpt2");
  EXPECT_EQ(gpt2.model.max_seq_len, 1024);
  EXPECT_EQ(gpt2.train.dtype, "bfloat16");
  EXPECT_EQ(gpt2.train.batch_size, 64);
  EXPECT_EQ(gpt2.train.micro_batch_size, 16);
  EXPECT_EQ(gpt2.optimizer.lr, 6e-4);
  EXPECT_EQ(gpt2.schedule.kind, "wsd");
}

TEST(RunConfigTest, OverridesOfEveryType) {
  const RunConfig config = parse("[train]\nsteps = 10\n[schedule]\nwarmup_steps = 0\n",
                                 {
                                     "train.steps=500",            // integer
                                     "optimizer.lr=3e-4",          // float
                                     "optimizer.grad_clip=2",      // integer for a float key
                                     "model.tie_embeddings=true",  // bool
                                     "model.preset=\"tiny\"",      // quoted string
                                     "train.device=cpu",           // bare word
                                     "data.dir=data/tokens/x y",   // bare path with a space
                                     "seed=18446744073709551615",  // above INT64_MAX
                                     " train.batch_size = 64 ",    // spaces around
                                     "train.batch_size=16",        // the later one wins
                                     "schedule.kind=wsd",          // creates nothing new
                                 });
  EXPECT_EQ(config.train.steps, 500);
  EXPECT_EQ(config.optimizer.lr, 3e-4);
  EXPECT_EQ(config.optimizer.grad_clip, 2.0);
  EXPECT_TRUE(config.model.tie_embeddings);
  EXPECT_EQ(config.model.preset, "tiny");
  EXPECT_EQ(config.model.hidden_size, 64);
  EXPECT_EQ(config.train.device, "cpu");
  EXPECT_EQ(config.data.dir, "data/tokens/x y");
  EXPECT_EQ(config.seed, 18446744073709551615u);
  EXPECT_EQ(config.train.batch_size, 16);
  EXPECT_EQ(config.schedule.kind, "wsd");
  EXPECT_EQ(config.model_overrides, std::set<std::string>{"tie_embeddings"});
  expect_round_trip(config);
}

TEST(RunConfigTest, OverrideCreatesMissingTables) {
  const RunConfig config =
      parse("seed = 1\n", {"model.hidden_size=192", "schedule.warmup_steps=5"});
  EXPECT_EQ(config.model.hidden_size, 192);
  EXPECT_EQ(config.schedule.warmup_steps, 5);
}

TEST(RunConfigTest, ModelFieldOverrides) {
  const RunConfig config = parse(R"(
[model]
preset = "tiny"
vocab_size = 1000
hidden_size = 128
num_heads = 8
num_kv_heads = 4
rope_theta = 500000
yarn_factor = 4.0
yarn_original_max_seq_len = 64
logn_attention_scaling = true
[data]
seq_len = 256
)");
  EXPECT_EQ(config.model.preset, "tiny");
  EXPECT_EQ(config.model.vocab_size, 1000);
  EXPECT_EQ(config.model.hidden_size, 128);
  EXPECT_EQ(config.model.intermediate_size, 192);  // from the preset
  EXPECT_EQ(config.model.num_heads, 8);
  EXPECT_EQ(config.model.num_kv_heads, 4);
  EXPECT_EQ(config.model.rope_theta, 500000.0);
  EXPECT_EQ(config.model.yarn_factor, 4.0);
  EXPECT_EQ(config.model.yarn_original_max_seq_len, 64);
  EXPECT_TRUE(config.model.logn_attention_scaling);
  EXPECT_EQ(config.model.max_seq_len, 256);
  EXPECT_EQ(config.model_overrides,
            (std::set<std::string>{"hidden_size", "num_heads", "num_kv_heads", "rope_theta",
                                   "yarn_factor", "yarn_original_max_seq_len",
                                   "logn_attention_scaling"}));
  const std::string text = config.to_toml();
  EXPECT_NE(text.find("\nhidden_size = 128\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# intermediate_size = 192  (from the preset)"), std::string::npos) << text;
  expect_round_trip(config);
}

TEST(RunConfigTest, RoundTripOfUnusualValues) {
  const RunConfig config = parse(R"(
seed = 9223372036854775807
[data]
dir = "tab\there \"quoted\" back\\slash é 🙂"
[train]
out_dir = 'C:\runs\x'
[optimizer]
lr = 0.1
eps = 1e-300
weight_decay = -0.0
beta1 = 0
[schedule]
min_lr_ratio = 0.30000000000000004
[network]
split = "even"
)");
  EXPECT_EQ(config.network.split, "even");
  EXPECT_EQ(config.seed, 9223372036854775807u);
  EXPECT_EQ(config.data.dir, "tab\there \"quoted\" back\\slash é 🙂");
  EXPECT_EQ(config.train.out_dir, "C:\\runs\\x");
  expect_round_trip(config);
  RunConfig big = config;
  big.seed = 18446744073709551615u;
  expect_round_trip(big);
  EXPECT_EQ(config.to_toml(), config.to_toml());
}

TEST(RunConfigTest, SetVocabSize) {
  RunConfig config = parse("");
  config.set_vocab_size(8192);
  EXPECT_EQ(config.model.vocab_size, 8192);
  EXPECT_THROW(config.set_vocab_size(0), Error);
  try {
    config.set_vocab_size(-5);
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "model.vocab_size = -5 is invalid (allowed: an integer in [1, 2147483647])");
  }
}

// Each error names the source, the key, the value and what is allowed.
TEST(RunConfigTest, OutOfRangeMessages) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[optimizer]\nlr = -0.1",
       "configs/x.toml: optimizer.lr = -0.1 is invalid (allowed: a number > 0)"},
      {"[optimizer]\nlr = inf",
       "configs/x.toml: optimizer.lr = inf is invalid (allowed: a number > 0)"},
      {"[optimizer]\nlr = nan",
       "configs/x.toml: optimizer.lr = nan is invalid (allowed: a number > 0)"},
      {"[optimizer]\nbeta1 = 1.0",
       "configs/x.toml: optimizer.beta1 = 1.0 is invalid (allowed: a number in [0, 1))"},
      {"[optimizer]\nbeta2 = -0.5",
       "configs/x.toml: optimizer.beta2 = -0.5 is invalid (allowed: a number in [0, 1))"},
      {"[optimizer]\neps = 0",
       "configs/x.toml: optimizer.eps = 0 is invalid (allowed: a number > 0)"},
      {"[optimizer]\nweight_decay = -1",
       "configs/x.toml: optimizer.weight_decay = -1 is invalid (allowed: a number >= 0)"},
      {"[optimizer]\ngrad_clip = -0.5",
       "configs/x.toml: optimizer.grad_clip = -0.5 is invalid (allowed: a number >= 0)"},
      {"[network]\nsplit = \"random\"",
       "configs/x.toml: network.split = \"random\" is invalid (allowed: \"throughput\", "
       "\"even\")"},
      {"[optimizer]\nname = \"sgd\"",
       "configs/x.toml: optimizer.name = \"sgd\" is invalid (allowed: \"demo\", \"adamw\", "
       "\"diloco\")"},
      {"[demo]\ntopk = 0",
       "configs/x.toml: demo.topk = 0 is invalid (allowed: an integer in [1, 1048576])"},
      {"[verify]\nstate_fraction = 0",
       "configs/x.toml: verify.state_fraction = 0 is invalid (allowed: a number in (0, 1])"},
      {"[verify]\nstate_fraction = 1.5",
       "configs/x.toml: verify.state_fraction = 1.5 is invalid (allowed: a number in (0, 1])"},
      {"[demo]\nbeta = 1",
       "configs/x.toml: demo.beta = 1 is invalid (allowed: a number in [0, 1))"},
      {"[diloco]\npseudo_gradient_dtype = \"fp8\"",
       "configs/x.toml: diloco.pseudo_gradient_dtype = \"fp8\" is invalid (allowed: \"float32\", "
       "\"bfloat16\", \"int8\")"},
      {"[optimizer]\nname = \"diloco\"\n[diloco]\ninner_steps = 7",
       "configs/x.toml: train.steps = 1000 is not a multiple of diloco.inner_steps = 7 (allowed: "
       "steps = k * inner_steps, so the run ends on a sync and every peer holds the same "
       "parameters)"},
      {"[schedule]\nmin_lr_ratio = 1.5",
       "configs/x.toml: schedule.min_lr_ratio = 1.5 is invalid (allowed: a number in [0, 1])"},
      {"[schedule]\ndecay_fraction = 0.0",
       "configs/x.toml: schedule.decay_fraction = 0.0 is invalid (allowed: a number in (0, 1])"},
      {"[schedule]\nkind = \"linear\"",
       "configs/x.toml: schedule.kind = \"linear\" is invalid (allowed: \"constant\", \"cosine\", "
       "\"wsd\")"},
      {"[schedule]\nwarmup_steps = -1",
       "configs/x.toml: schedule.warmup_steps = -1 is invalid (allowed: an integer >= 0)"},
      {"[data]\nseq_len = 1",
       "configs/x.toml: data.seq_len = 1 is invalid (allowed: an integer in [2, 16777216])"},
      {"[data]\ndir = \"\"",
       "configs/x.toml: data.dir = \"\" is invalid (allowed: a non-empty string)"},
      {"[train]\nsteps = 0",
       "configs/x.toml: train.steps = 0 is invalid (allowed: an integer in [1, 1099511627776])"},
      {"[train]\neval_windows = 0",
       "configs/x.toml: train.eval_windows = 0 is invalid (allowed: an integer in [1, 16777216])"},
      {"[train]\nthreads = -1",
       "configs/x.toml: train.threads = -1 is invalid (allowed: an integer in [0, 4096])"},
      {"[train]\nlog_interval = 0",
       "configs/x.toml: train.log_interval = 0 is invalid (allowed: an integer >= 1)"},
      {"[train]\ndevice = \"gpu\"",
       "configs/x.toml: train.device = \"gpu\" is invalid (allowed: \"auto\", \"cpu\", \"cuda\")"},
      {"[train]\ndtype = \"float16\"",
       "configs/x.toml: train.dtype = \"float16\" is invalid (allowed: \"float32\", \"bfloat16\")"},
      {"[model]\npreset = \"huge\"",
       "configs/x.toml: model.preset = \"huge\" is invalid (allowed: \"tiny\", \"small\", "
       "\"gpt2-124m\", \"1b\")"},
      {"[model]\nvocab_size = -1",
       "configs/x.toml: model.vocab_size = -1 is invalid (allowed: an integer in [0, 2147483647])"},
      {"[model]\nhidden_size = 0",
       "configs/x.toml: model.hidden_size = 0 is invalid (allowed: an integer in [1, 1048576])"},
      {"[model]\nyarn_factor = 0.5",
       "configs/x.toml: model.yarn_factor = 0.5 is invalid (allowed: a number >= 1)"},
      {"seed = -1",
       "configs/x.toml: seed = -1 is invalid (allowed: an integer in [0, 18446744073709551615]; "
       "quote values above 9223372036854775807)"},
      {"seed = \"12x\"",
       "configs/x.toml: seed = \"12x\" is invalid (allowed: an integer in [0, "
       "18446744073709551615]; quote values above 9223372036854775807)"},
      {"seed = \"18446744073709551616\"",
       "configs/x.toml: seed = \"18446744073709551616\" is invalid (allowed: an integer in [0, "
       "18446744073709551615]; quote values above 9223372036854775807)"},
  };
  for (const auto& [text, message] : cases) EXPECT_EQ(error_of(text), message) << text;
}

TEST(RunConfigTest, WrongTypeMessages) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[train]\nsteps = 1.5",
       "configs/x.toml: train.steps = 1.5: expected an integer in [1, 1099511627776]"},
      {"[train]\nsteps = 1e3",
       "configs/x.toml: train.steps = 1000.0: expected an integer in [1, 1099511627776]"},
      {"[train]\nsteps = \"100\"",
       "configs/x.toml: train.steps = \"100\": expected an integer in [1, 1099511627776]"},
      {"[optimizer]\nlr = \"fast\"",
       "configs/x.toml: optimizer.lr = \"fast\": expected a number > 0"},
      {"[optimizer]\nlr = [1, 2]",
       "configs/x.toml: optimizer.lr = [ 1, 2 ]: expected a number > 0"},
      {"[model]\ntie_embeddings = 1",
       "configs/x.toml: model.tie_embeddings = 1: expected true or false"},
      {"[model]\npreset = 3",
       "configs/x.toml: model.preset = 3: expected one of \"tiny\", \"small\", \"gpt2-124m\", "
       "\"1b\""},
      {"[data]\ndir = 5", "configs/x.toml: data.dir = 5: expected a non-empty string"},
      {"train = 5", "configs/x.toml: train = 5: expected a table"},
      {"[train.steps]\nx = 1",
       "configs/x.toml: train.steps = a table: expected an integer in [1, 1099511627776]"},
      {"seed = 1.0",
       "configs/x.toml: seed = 1.0: expected an integer in [0, 18446744073709551615]; quote values "
       "above 9223372036854775807"},
  };
  for (const auto& [text, message] : cases) EXPECT_EQ(error_of(text), message) << text;
}

TEST(RunConfigTest, UnknownKeys) {
  EXPECT_EQ(error_of("[optimzer]\nlr = 0.1"),
            "configs/x.toml: unknown key 'optimzer.lr' (did you mean 'optimizer.lr'?)");
  EXPECT_EQ(error_of("optimizer.lr = 0.1\noptimizer.wieght_decay = 0"),
            "configs/x.toml: unknown key 'optimizer.wieght_decay' (did you mean "
            "'optimizer.weight_decay'?)");
  EXPECT_EQ(error_of("[train]\nstep = 10"),
            "configs/x.toml: unknown key 'train.step' (did you mean 'train.steps'?)");
  EXPECT_EQ(
      error_of("[model]\nmax_seq_len = 512"),
      "configs/x.toml: unknown key 'model.max_seq_len' (allowed in [model]: hidden_size, "
      "init_std, intermediate_size, logn_attention_scaling, num_heads, num_kv_heads, "
      "num_layers, preset, rms_norm_eps, rope_theta, tie_embeddings, vocab_size, yarn_beta_fast, "
      "yarn_beta_slow, yarn_factor, yarn_original_max_seq_len)");
  EXPECT_EQ(error_of("[whatever]\n"),
            "configs/x.toml: unknown key 'whatever' (allowed at the top level: adamw, data, demo, "
            "diloco, model, network, optimizer, pipeline, schedule, seed, train, tst, verify)");
  EXPECT_EQ(error_of("sed = 1\n[data]\nseqlen = 5\n"),
            "configs/x.toml: unknown key 'data.seqlen' (did you mean 'data.seq_len'?)\n"
            "configs/x.toml: unknown key 'sed' (did you mean 'seed'?)");
  // A quoted key with a dot is not the nested key it looks like.
  EXPECT_EQ(error_of("\"train.steps\" = 5"),
            "configs/x.toml: unknown key '\"train.steps\"' (did you mean 'train.steps'?)");
  EXPECT_EQ(error_of("", {"optimzer.lr=1"}),
            "--set optimzer.lr=1: unknown key 'optimzer.lr' (did you mean 'optimizer.lr'?)");
}

TEST(RunConfigTest, OverrideErrors) {
  EXPECT_EQ(error_of("", {"train.steps=abc"}),
            "--set train.steps=abc: expected an integer in [1, 1099511627776]");
  EXPECT_EQ(error_of("", {"optimizer.lr=-0.1"}),
            "--set optimizer.lr=-0.1 is invalid (allowed: a number > 0)");
  EXPECT_EQ(error_of("", {"train.steps"}),
            "--set train.steps: expected key=value (for example optimizer.lr=3e-4)");
  EXPECT_EQ(error_of("", {"=3"}),
            "--set =3: '' is not a valid key (allowed: dotted names of letters, digits, '_' and "
            "'-', like optimizer.lr)");
  EXPECT_EQ(error_of("", {"train..steps=3"}),
            "--set train..steps=3: 'train..steps' is not a valid key (allowed: dotted names of "
            "letters, digits, '_' and '-', like optimizer.lr)");
  EXPECT_EQ(error_of("[train]\nsteps = 10", {"train.steps.x=3"}),
            "--set train.steps.x=3: cannot set a key inside train.steps, which is 10 (expected a "
            "table)");
  EXPECT_EQ(error_of("", {std::string("data.dir=\xff\xfe")}),
            "--set data.dir=\xff\xfe: the value is not valid UTF-8");
  EXPECT_EQ(error_of("", {"model.hidden_size=192", "model.num_heads=4"}),
            "--set model.hidden_size=192, --set model.num_heads=4: model.num_kv_heads = 6 must "
            "divide model.num_heads = 4");
  // The file's value is fine; the override's is blamed.
  EXPECT_EQ(error_of("[train]\nbatch_size = 32\n", {"train.micro_batch_size=5"}),
            "--set train.micro_batch_size=5: train.batch_size = 32 is not a multiple of "
            "train.micro_batch_size = 5 (allowed: batch_size = k * micro_batch_size for a whole k "
            ">= 1)");
}

TEST(RunConfigTest, SyntaxErrorsNameLineAndColumn) {
  const std::string message = error_of("seed = 1\n\n[train\nsteps = 3\n");
  EXPECT_EQ(message.rfind("configs/x.toml:3:", 0), 0u) << message;
  EXPECT_NE(message.find("invalid TOML"), std::string::npos) << message;
  const std::string duplicate = error_of("[train]\nsteps = 1\nsteps = 2\n");
  EXPECT_EQ(duplicate.rfind("configs/x.toml:3:", 0), 0u) << duplicate;
  EXPECT_THROW(RunConfig::load(kConfigs / "no-such-file.toml", {}), Error);
}

TEST(RunConfigTest, CrossFieldRules) {
  EXPECT_EQ(error_of("[train]\nbatch_size = 30\nmicro_batch_size = 8"),
            "configs/x.toml: train.batch_size = 30 is not a multiple of train.micro_batch_size = "
            "8 (allowed: batch_size = k * micro_batch_size for a whole k >= 1)");
  EXPECT_EQ(error_of("[train]\nbatch_size = 4\nmicro_batch_size = 8"),
            "configs/x.toml: train.batch_size = 4 is not a multiple of train.micro_batch_size = "
            "8 (allowed: batch_size = k * micro_batch_size for a whole k >= 1)");
  EXPECT_EQ(error_of("[train]\nsteps = 50"),
            "configs/x.toml: schedule.warmup_steps = 100 is invalid (allowed: an integer in [0, "
            "train.steps = 50])");
  EXPECT_EQ(error_of("[train]\nsteps = 1000\n[schedule]\nkind = \"wsd\"\nwarmup_steps = 900"),
            "configs/x.toml: schedule.warmup_steps = 900 overlaps the wsd decay (allowed: at most "
            "train.steps - decay steps = 1000 - 200 = 800; decay steps = "
            "round(schedule.decay_fraction * train.steps))");
  EXPECT_EQ(error_of("[model]\nhidden_size = 100"),
            "configs/x.toml: model.hidden_size = 100 is not a multiple of model.num_heads = 6");
  EXPECT_EQ(error_of("[model]\nnum_kv_heads = 4"),
            "configs/x.toml: model.num_kv_heads = 4 must divide model.num_heads = 6");
  EXPECT_EQ(
      error_of("[data]\nseq_len = 256\n[model]\nyarn_factor = 2.0\nyarn_original_max_seq_len = 64"),
      "configs/x.toml: model.yarn_factor (2) x model.yarn_original_max_seq_len (64) must "
      "equal the context the model runs at, max_seq_len = 256 (data.seq_len)");
  EXPECT_EQ(error_of("", {"model.yarn_factor=2"}),
            "--set model.yarn_factor=2: model.yarn_original_max_seq_len must be set (> 0) when "
            "model.yarn_factor = 2");
  // Boundaries that are allowed.
  EXPECT_NO_THROW(parse("[train]\nsteps = 100\nbatch_size = 8\nmicro_batch_size = 8"));
  EXPECT_NO_THROW(parse("[train]\nsteps = 1\n[schedule]\nwarmup_steps = 1\nkind = \"constant\""));
  EXPECT_NO_THROW(parse("[train]\nsteps = 1000\n[schedule]\nkind = \"wsd\"\nwarmup_steps = 800"));
}

TEST(RunConfigTest, TokenSuperposition) {
  const RunConfig config = parse("[train]\nsteps = 1000\n[tst]\nbag = 6\nfraction = 0.3");
  EXPECT_EQ(config.tst.bag, 6);
  EXPECT_EQ(config.tst_switch_step(), 300);
  EXPECT_EQ(config.bag_at(0), 6);
  EXPECT_EQ(config.bag_at(299), 6);
  EXPECT_EQ(config.bag_at(300), 1);
  EXPECT_EQ(config.bag_at(999), 1);
  // 300 steps of 32 x 256 x 6 data tokens, then 32 x 256 each.
  EXPECT_EQ(config.data_tokens_through(0), 0u);
  EXPECT_EQ(config.data_tokens_through(300), 300u * 32 * 256 * 6);
  EXPECT_EQ(config.data_tokens_through(1000), 300u * 32 * 256 * 6 + 700u * 32 * 256);
  expect_round_trip(config);
  // round(fraction x steps): 0.3 x 5 = 1.5 rounds to 2.
  EXPECT_EQ(
      parse("[train]\nsteps = 5\n[schedule]\nwarmup_steps = 0\n[tst]\nbag = 2\nfraction = 0.3")
          .tst_switch_step(),
      2);

  EXPECT_EQ(error_of("[tst]\nbag = 0"),
            "configs/x.toml: tst.bag = 0 is invalid (allowed: an integer in [1, 1024])");
  EXPECT_EQ(error_of("[tst]\nfraction = 1.0"),
            "configs/x.toml: tst.fraction = 1.0 is invalid (allowed: a number in [0, 1))");
  EXPECT_EQ(error_of("[tst]\nbag = 4"),
            "configs/x.toml: tst.bag = 4 with tst.fraction = 0 trains no step in bags "
            "(round(fraction x train.steps = 1000) = 0; allowed: a fraction of at least 0.5 / "
            "train.steps, typically 0.2 to 0.4, or tst.bag = 1 to turn superposition off)");
  EXPECT_NE(error_of("[tst]\nbags = 4").find("did you mean"), std::string::npos);
}

// A config with lr 1, so learning_rate() is the schedule's multiplier.
RunConfig schedule_config(const std::string& kind, int64_t steps, int64_t warmup,
                          double decay_fraction = 0.2) {
  return parse(fmt::format(
      "[train]\nsteps = {}\n[optimizer]\nlr = 1.0\n[schedule]\nkind = \"{}\"\nwarmup_steps = "
      "{}\nmin_lr_ratio = 0.1\ndecay_fraction = {}\n",
      steps, kind, warmup, decay_fraction));
}

TEST(RunConfigTest, WarmupAndConstant) {
  const RunConfig config = schedule_config("constant", 10, 4);
  EXPECT_DOUBLE_EQ(config.learning_rate(0), 0.25);
  EXPECT_DOUBLE_EQ(config.learning_rate(1), 0.5);
  EXPECT_DOUBLE_EQ(config.learning_rate(3), 1.0);
  EXPECT_DOUBLE_EQ(config.learning_rate(4), 1.0);
  EXPECT_DOUBLE_EQ(config.learning_rate(9), 1.0);
  EXPECT_DOUBLE_EQ(config.learning_rate(50), 1.0);
  EXPECT_DOUBLE_EQ(schedule_config("constant", 10, 0).learning_rate(0), 1.0);
  EXPECT_THROW(config.learning_rate(-1), Error);
}

TEST(RunConfigTest, Cosine) {
  const RunConfig config = schedule_config("cosine", 10, 2);
  EXPECT_DOUBLE_EQ(config.learning_rate(0), 0.5);
  EXPECT_DOUBLE_EQ(config.learning_rate(1), 1.0);
  EXPECT_DOUBLE_EQ(config.learning_rate(2), 1.0);   // progress 0
  EXPECT_DOUBLE_EQ(config.learning_rate(6), 0.55);  // progress 1/2: halfway to the floor
  EXPECT_DOUBLE_EQ(config.learning_rate(9),
                   0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 7 / 8)));
  EXPECT_DOUBLE_EQ(config.learning_rate(10), 0.1);  // progress 1, one past the last step
  EXPECT_DOUBLE_EQ(config.learning_rate(1000), 0.1);
  for (int64_t step = 2; step < 10; ++step) {
    EXPECT_LT(config.learning_rate(step + 1), config.learning_rate(step)) << step;
  }
  // Warmup covering the whole run: every step is warmup.
  const RunConfig all_warmup = schedule_config("cosine", 4, 4);
  EXPECT_DOUBLE_EQ(all_warmup.learning_rate(3), 1.0);
  EXPECT_DOUBLE_EQ(all_warmup.learning_rate(4), 0.1);
}

TEST(RunConfigTest, WarmupStableDecay) {
  const RunConfig config = schedule_config("wsd", 10, 2);  // 2 decay steps: 8 and 9
  EXPECT_EQ(config.decay_steps(), 2);
  EXPECT_DOUBLE_EQ(config.learning_rate(0), 0.5);
  EXPECT_DOUBLE_EQ(config.learning_rate(2), 1.0);
  EXPECT_DOUBLE_EQ(config.learning_rate(7), 1.0);
  EXPECT_DOUBLE_EQ(config.learning_rate(8), 0.55);
  EXPECT_DOUBLE_EQ(config.learning_rate(9), 0.1);  // the last step reaches the floor
  EXPECT_DOUBLE_EQ(config.learning_rate(30), 0.1);
  // decay_fraction * steps is rounded to the nearest step, and at least one step decays.
  EXPECT_EQ(schedule_config("wsd", 10, 0, 0.25).decay_steps(), 3);
  EXPECT_EQ(schedule_config("wsd", 10, 0, 0.01).decay_steps(), 1);
  EXPECT_DOUBLE_EQ(schedule_config("wsd", 10, 0, 0.01).learning_rate(8), 1.0);
  EXPECT_DOUBLE_EQ(schedule_config("wsd", 10, 0, 0.01).learning_rate(9), 0.1);
  const RunConfig whole = schedule_config("wsd", 4, 0, 1.0);  // decays from the first step
  EXPECT_DOUBLE_EQ(whole.learning_rate(0), 1.0 - 0.9 * 0.25);
  EXPECT_DOUBLE_EQ(whole.learning_rate(3), 0.1);
  EXPECT_EQ(schedule_config("cosine", 10, 0).decay_steps(), 0);
}

}  // namespace
}  // namespace agora
