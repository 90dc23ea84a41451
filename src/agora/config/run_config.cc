#include "agora/config/run_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "agora/core/error.h"
#include "agora/core/toml_config.h"

namespace agora {
namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// One overridable ModelConfig field; exactly one of the member pointers is set. The caps on the
// integers are far beyond any real model and keep products such as vocab * hidden inside int64.
struct ModelField {
  const char* name;
  int64_t ModelConfig::*integer = nullptr;
  double ModelConfig::*real = nullptr;
  bool ModelConfig::*flag = nullptr;
  IntRange int_range = {};
  DoubleRange double_range = {};
};

const std::vector<ModelField>& model_fields() {
  static const std::vector<ModelField> fields = {
      {.name = "hidden_size", .integer = &ModelConfig::hidden_size, .int_range = {1, 1 << 20}},
      {.name = "intermediate_size",
       .integer = &ModelConfig::intermediate_size,
       .int_range = {1, 1 << 22}},
      {.name = "num_layers", .integer = &ModelConfig::num_layers, .int_range = {1, 4096}},
      {.name = "num_heads", .integer = &ModelConfig::num_heads, .int_range = {1, 1 << 16}},
      {.name = "num_kv_heads", .integer = &ModelConfig::num_kv_heads, .int_range = {1, 1 << 16}},
      {.name = "rope_theta",
       .real = &ModelConfig::rope_theta,
       .double_range = DoubleRange::greater_than(0)},
      {.name = "rms_norm_eps",
       .real = &ModelConfig::rms_norm_eps,
       .double_range = DoubleRange::greater_than(0)},
      {.name = "tie_embeddings", .flag = &ModelConfig::tie_embeddings},
      {.name = "init_std",
       .real = &ModelConfig::init_std,
       .double_range = DoubleRange::greater_than(0)},
      {.name = "yarn_factor",
       .real = &ModelConfig::yarn_factor,
       .double_range = DoubleRange::at_least(1)},
      {.name = "yarn_original_max_seq_len",
       .integer = &ModelConfig::yarn_original_max_seq_len,
       .int_range = {0, 1 << 24}},
      {.name = "yarn_beta_fast",
       .real = &ModelConfig::yarn_beta_fast,
       .double_range = DoubleRange::greater_than(0)},
      {.name = "yarn_beta_slow",
       .real = &ModelConfig::yarn_beta_slow,
       .double_range = DoubleRange::greater_than(0)},
      {.name = "logn_attention_scaling", .flag = &ModelConfig::logn_attention_scaling},
  };
  return fields;
}

const std::vector<std::string> kDevices = {"auto", "cpu", "cuda"};
const std::vector<std::string> kDtypes = {"float32", "bfloat16"};
const std::vector<std::string> kOptimizers = {"demo", "adamw", "diloco"};
const std::vector<std::string> kGradientDtypes = {"float32", "bfloat16"};
const std::vector<std::string> kPseudoGradientDtypes = {"float32", "bfloat16", "int8"};
const std::vector<std::string> kScheduleKinds = {"constant", "cosine", "wsd"};
const std::vector<std::string> kPipelineSchedules = {"gpipe", "async"};
const std::vector<std::string> kSplits = {"throughput", "even"};
const std::vector<std::string> kPipelineOptimizers = {"adamw", "nadam"};
const std::vector<std::string> kPipelineCodecs = {"float32", "bfloat16", "int8", "subspace",
                                                  "columns"};

constexpr IntRange kVocabRange = {0, std::numeric_limits<int32_t>::max()};
constexpr IntRange kSeqLenRange = {2, 1 << 24};
constexpr IntRange kBatchRange = {1, 1 << 24};
// A trillion steps is far past any run and keeps step arithmetic in doubles exact.
constexpr IntRange kStepsRange = {1, int64_t{1} << 40};

// The origin to blame for a rule over several keys: the --set assignments that wrote any of them,
// else the source, so a bad override is named even when the rule's other key came from the file.
std::string origin(const TomlConfig& toml, const std::vector<std::string>& paths) {
  std::vector<std::string> overrides;
  for (const std::string& path : paths) {
    std::string where = toml.where(path);
    if (where == toml.source_name()) continue;
    if (std::find(overrides.begin(), overrides.end(), where) == overrides.end()) {
      overrides.push_back(std::move(where));
    }
  }
  if (overrides.empty()) return toml.source_name();
  return fmt::format("{}", fmt::join(overrides, ", "));
}

bool models_equal(const ModelConfig& a, const ModelConfig& b) {
  if (a.preset != b.preset || a.vocab_size != b.vocab_size || a.max_seq_len != b.max_seq_len) {
    return false;
  }
  for (const ModelField& field : model_fields()) {
    if (field.integer && a.*field.integer != b.*field.integer) return false;
    if (field.real && a.*field.real != b.*field.real) return false;
    if (field.flag && a.*field.flag != b.*field.flag) return false;
  }
  return true;
}

std::string model_field_text(const ModelConfig& model, const ModelField& field) {
  if (field.integer) return fmt::format("{}", model.*field.integer);
  if (field.real) return toml_float(model.*field.real);
  return model.*field.flag ? "true" : "false";
}

void read_model(TomlConfig& toml, RunConfig& config) {
  const std::string preset = toml.get_choice("model.preset", "small", model_preset_names());
  const int64_t vocab_size = toml.get_int("model.vocab_size", 0, kVocabRange);
  config.model = model_preset(preset, vocab_size, config.data.seq_len);
  for (const ModelField& field : model_fields()) {
    const std::string path = fmt::format("model.{}", field.name);
    const bool present = toml.has(path);
    if (field.integer) {
      config.model.*field.integer =
          toml.get_int(path, config.model.*field.integer, field.int_range);
    } else if (field.real) {
      config.model.*field.real =
          toml.get_double(path, config.model.*field.real, field.double_range);
    } else {
      config.model.*field.flag = toml.get_bool(path, config.model.*field.flag);
    }
    if (present) config.model_overrides.insert(field.name);
  }
}

void read_sections(TomlConfig& toml, RunConfig& config) {
  config.seed = toml.get_uint64("seed", config.seed);

  DataConfig& data = config.data;
  data.dir = toml.get_string("data.dir", data.dir, /*allow_empty=*/false);
  data.seq_len = toml.get_int("data.seq_len", data.seq_len, kSeqLenRange);
  data.hash = toml.get_string("data.hash", data.hash);
  const bool hex64 = data.hash.size() == 64 &&
                     data.hash.find_first_not_of("0123456789abcdef") == std::string::npos;
  if (!data.hash.empty() && !hex64) {
    fail(
        "data.hash \"{}\" is not a data hash (allowed: 64 lowercase hex digits, as `agora data "
        "hash DIR` prints them, or empty)",
        data.hash);
  }

  read_model(toml, config);

  TrainConfig& train = config.train;
  train.steps = toml.get_int("train.steps", train.steps, kStepsRange);
  train.batch_size = toml.get_int("train.batch_size", train.batch_size, kBatchRange);
  train.micro_batch_size =
      toml.get_int("train.micro_batch_size", train.micro_batch_size, kBatchRange);
  train.eval_interval = toml.get_int("train.eval_interval", train.eval_interval, {0, kMaxInt});
  train.eval_windows = toml.get_int("train.eval_windows", train.eval_windows, kBatchRange);
  train.checkpoint_interval =
      toml.get_int("train.checkpoint_interval", train.checkpoint_interval, {0, kMaxInt});
  train.log_interval = toml.get_int("train.log_interval", train.log_interval, {1, kMaxInt});
  train.out_dir = toml.get_string("train.out_dir", train.out_dir, /*allow_empty=*/false);
  train.device = toml.get_choice("train.device", train.device, kDevices);
  train.dtype = toml.get_choice("train.dtype", train.dtype, kDtypes);
  train.threads = toml.get_int("train.threads", train.threads, {0, 4096});

  OptimizerConfig& opt = config.optimizer;
  opt.name = toml.get_choice("optimizer.name", opt.name, kOptimizers);
  opt.lr = toml.get_double("optimizer.lr", opt.lr, DoubleRange::greater_than(0));
  opt.beta1 =
      toml.get_double("optimizer.beta1", opt.beta1, DoubleRange::between(0, 1, false, true));
  opt.beta2 =
      toml.get_double("optimizer.beta2", opt.beta2, DoubleRange::between(0, 1, false, true));
  opt.eps = toml.get_double("optimizer.eps", opt.eps, DoubleRange::greater_than(0));
  opt.weight_decay =
      toml.get_double("optimizer.weight_decay", opt.weight_decay, DoubleRange::at_least(0));
  opt.grad_clip = toml.get_double("optimizer.grad_clip", opt.grad_clip, DoubleRange::at_least(0));

  DemoConfig& demo = config.demo;
  demo.beta = toml.get_double("demo.beta", demo.beta, DoubleRange::between(0, 1, false, true));
  demo.topk = toml.get_int("demo.topk", demo.topk, {1, 1 << 20});
  demo.chunk = toml.get_int("demo.chunk", demo.chunk, {1, 1 << 16});
  demo.one_bit = toml.get_bool("demo.one_bit", demo.one_bit);
  demo.lookahead = toml.get_bool("demo.lookahead", demo.lookahead);
  demo.max_norm_ratio =
      toml.get_double("demo.max_norm_ratio", demo.max_norm_ratio, DoubleRange::at_least(0));

  config.adamw.gradient_dtype =
      toml.get_choice("adamw.gradient_dtype", config.adamw.gradient_dtype, kGradientDtypes);

  DiLoCoConfig& diloco = config.diloco;
  diloco.inner_steps = toml.get_int("diloco.inner_steps", diloco.inner_steps, {1, kMaxInt});
  diloco.outer_lr =
      toml.get_double("diloco.outer_lr", diloco.outer_lr, DoubleRange::greater_than(0));
  diloco.outer_momentum = toml.get_double("diloco.outer_momentum", diloco.outer_momentum,
                                          DoubleRange::between(0, 1, false, true));
  diloco.pseudo_gradient_dtype = toml.get_choice(
      "diloco.pseudo_gradient_dtype", diloco.pseudo_gradient_dtype, kPseudoGradientDtypes);

  ScheduleConfig& schedule = config.schedule;
  schedule.kind = toml.get_choice("schedule.kind", schedule.kind, kScheduleKinds);
  schedule.warmup_steps =
      toml.get_int("schedule.warmup_steps", schedule.warmup_steps, {0, kMaxInt});
  schedule.min_lr_ratio =
      toml.get_double("schedule.min_lr_ratio", schedule.min_lr_ratio, DoubleRange::between(0, 1));
  schedule.decay_fraction = toml.get_double("schedule.decay_fraction", schedule.decay_fraction,
                                            DoubleRange::between(0, 1, true, false));

  TstConfig& tst = config.tst;
  tst.bag = toml.get_int("tst.bag", tst.bag, {1, 1024});
  tst.fraction =
      toml.get_double("tst.fraction", tst.fraction, DoubleRange::between(0, 1, false, true));

  NetworkConfig& net = config.network;
  net.listen = toml.get_string("network.listen", net.listen, /*allow_empty=*/false);
  net.allowlist = toml.get_string("network.allowlist", net.allowlist);
  net.open = toml.get_bool("network.open", net.open);
  net.min_peers = toml.get_int("network.min_peers", net.min_peers, {1, 1 << 20});
  net.warmup_seconds =
      toml.get_double("network.warmup_seconds", net.warmup_seconds, DoubleRange::at_least(0));
  net.overlap = toml.get_int("network.overlap", net.overlap, {0, 1});
  net.deadline_factor =
      toml.get_double("network.deadline_factor", net.deadline_factor, DoubleRange::at_least(1));
  net.min_deadline_seconds = toml.get_double(
      "network.min_deadline_seconds", net.min_deadline_seconds, DoubleRange::greater_than(0));
  net.witness_seconds =
      toml.get_double("network.witness_seconds", net.witness_seconds, DoubleRange::greater_than(0));
  net.heartbeat_timeout_seconds =
      toml.get_double("network.heartbeat_timeout_seconds", net.heartbeat_timeout_seconds,
                      DoubleRange::greater_than(1));
  net.max_strikes = toml.get_int("network.max_strikes", net.max_strikes, {1, 1000});
  net.hash_interval = toml.get_int("network.hash_interval", net.hash_interval, {1, kMaxInt});
  net.quorum =
      toml.get_double("network.quorum", net.quorum, DoubleRange::between(0, 1, false, true));
  net.checkpointers = toml.get_int("network.checkpointers", net.checkpointers, {0, 1 << 20});
  net.finish_grace_seconds = toml.get_double("network.finish_grace_seconds",
                                             net.finish_grace_seconds, DoubleRange::at_least(0));
  // 2048 members of ~300 bytes each (key, endpoint of at most 255 characters, framing) keep a
  // RoundStart's member list well inside the 1 MiB control limit.
  net.max_members = toml.get_int("network.max_members", net.max_members, {1, 2048});
  net.state_db = toml.get_string("network.state_db", net.state_db, /*allow_empty=*/false);
  net.split = toml.get_choice("network.split", net.split, kSplits);

  VerifyConfig& verify = config.verify;
  verify.rate = toml.get_double("verify.rate", verify.rate, DoubleRange::between(0, 1));
  verify.seconds = toml.get_double("verify.seconds", verify.seconds, DoubleRange::greater_than(0));
  verify.max_failures = toml.get_int("verify.max_failures", verify.max_failures, {1, 1000});
  verify.window = toml.get_int("verify.window", verify.window, {2, 1024});
  verify.state_fraction = toml.get_double("verify.state_fraction", verify.state_fraction,
                                          DoubleRange::between(0, 1, /*min_open=*/true));

  PipelineConfig& pipe = config.pipeline;
  pipe.stages = toml.get_int("pipeline.stages", pipe.stages, {1, 1024});
  pipe.schedule = toml.get_choice("pipeline.schedule", pipe.schedule, kPipelineSchedules);
  pipe.micro_batches = toml.get_int("pipeline.micro_batches", pipe.micro_batches, {1, 1 << 16});
  pipe.optimizer = toml.get_choice("pipeline.optimizer", pipe.optimizer, kPipelineOptimizers);
  pipe.nadam_beta1 = toml.get_double("pipeline.nadam_beta1", pipe.nadam_beta1,
                                     DoubleRange::between(0, 1, false, true));
  pipe.nadam_momentum_decay = toml.get_double("pipeline.nadam_momentum_decay",
                                              pipe.nadam_momentum_decay, DoubleRange::at_least(0));
  pipe.codec = toml.get_choice("pipeline.codec", pipe.codec, kPipelineCodecs);
  pipe.int8_block = toml.get_int("pipeline.int8_block", pipe.int8_block, {1, 1 << 16});
  pipe.subspace_rank = toml.get_int("pipeline.subspace_rank", pipe.subspace_rank, {0, 1 << 20});
  pipe.columns_kept =
      toml.get_double("pipeline.columns_kept", pipe.columns_kept, DoubleRange::between(0, 1));
}

// The [pipeline] rules that span keys (docs/pipeline.md).
void check_pipeline(const TomlConfig& toml, const RunConfig& config) {
  const PipelineConfig& pipe = config.pipeline;
  const bool subspace = pipe.codec == "subspace";
  if (subspace && (pipe.subspace_rank < 1 || pipe.subspace_rank > config.model.hidden_size)) {
    fail(
        "{}: pipeline.subspace_rank = {} is invalid for codec \"subspace\" (allowed: an integer "
        "in [1, model.hidden_size = {}])",
        origin(toml, {"pipeline.subspace_rank", "pipeline.codec", "model.hidden_size"}),
        pipe.subspace_rank, config.model.hidden_size);
  }
  if (!subspace && pipe.subspace_rank != 0) {
    fail(
        "{}: pipeline.subspace_rank = {} is set but pipeline.codec = \"{}\" (allowed: 0, or "
        "codec = \"subspace\")",
        origin(toml, {"pipeline.subspace_rank", "pipeline.codec"}), pipe.subspace_rank, pipe.codec);
  }
  const bool columns = pipe.codec == "columns";
  if (columns && pipe.columns_kept <= 0) {
    fail(
        "{}: pipeline.columns_kept = {} is invalid for codec \"columns\" (allowed: the fraction "
        "of the hidden size sent, in (0, 1])",
        origin(toml, {"pipeline.columns_kept", "pipeline.codec"}), pipe.columns_kept);
  }
  if (!columns && pipe.columns_kept != 0) {
    fail(
        "{}: pipeline.columns_kept = {} is set but pipeline.codec = \"{}\" (allowed: 0, or "
        "codec = \"columns\")",
        origin(toml, {"pipeline.columns_kept", "pipeline.codec"}), pipe.columns_kept, pipe.codec);
  }
  if (!pipe.enabled()) return;
  if (pipe.stages > config.model.num_layers) {
    fail(
        "{}: pipeline.stages = {} is more than model.num_layers = {} (allowed: every stage holds "
        "at least one layer, so stages <= num_layers)",
        origin(toml, {"pipeline.stages", "model.num_layers", "model.preset"}), pipe.stages,
        config.model.num_layers);
  }
  if (config.model.tie_embeddings) {
    fail(
        "{}: pipeline.stages = {} with model.tie_embeddings = true (allowed: false; the embedding "
        "lives on the first stage and the output head on the last)",
        origin(toml, {"pipeline.stages", "model.tie_embeddings", "model.preset"}), pipe.stages);
  }
  if (config.tst.bag > 1) {
    fail(
        "{}: pipeline.stages = {} with tst.bag = {} (allowed: tst.bag = 1; superposition is not "
        "implemented for pipelines)",
        origin(toml, {"pipeline.stages", "tst.bag"}), pipe.stages, config.tst.bag);
  }
  if (pipe.schedule == "gpipe" && config.train.batch_size % pipe.micro_batches != 0) {
    fail(
        "{}: train.batch_size = {} is not a multiple of pipeline.micro_batches = {} (allowed: "
        "batch_size = k * micro_batches, so every micro-batch weighs the same)",
        origin(toml, {"train.batch_size", "pipeline.micro_batches"}), config.train.batch_size,
        pipe.micro_batches);
  }
}

// The rules that span keys; each single key was range-checked as it was read.
void check_cross_field(const TomlConfig& toml, const RunConfig& config) {
  if (config.network.min_peers > config.network.max_members) {
    fail(
        "{}: network.min_peers = {} is more than network.max_members = {}: the run could never "
        "start (allowed: min_peers <= max_members)",
        origin(toml, {"network.min_peers", "network.max_members"}), config.network.min_peers,
        config.network.max_members);
  }
  const TrainConfig& train = config.train;
  if (train.batch_size % train.micro_batch_size != 0) {
    fail(
        "{}: train.batch_size = {} is not a multiple of train.micro_batch_size = {} (allowed: "
        "batch_size = k * micro_batch_size for a whole k >= 1)",
        origin(toml, {"train.batch_size", "train.micro_batch_size"}), train.batch_size,
        train.micro_batch_size);
  }
  if (config.optimizer.name == "diloco" && train.steps % config.diloco.inner_steps != 0) {
    fail(
        "{}: train.steps = {} is not a multiple of diloco.inner_steps = {} (allowed: steps = k * "
        "inner_steps, so the run ends on a sync and every peer holds the same parameters)",
        origin(toml, {"train.steps", "diloco.inner_steps", "optimizer.name"}), train.steps,
        config.diloco.inner_steps);
  }
  const ScheduleConfig& schedule = config.schedule;
  if (schedule.warmup_steps > train.steps) {
    fail("{}: schedule.warmup_steps = {} is invalid (allowed: an integer in [0, train.steps = {}])",
         origin(toml, {"schedule.warmup_steps", "train.steps"}), schedule.warmup_steps,
         train.steps);
  }
  if (schedule.kind == "wsd" && schedule.warmup_steps > train.steps - config.decay_steps()) {
    fail(
        "{}: schedule.warmup_steps = {} overlaps the wsd decay (allowed: at most train.steps - "
        "decay steps = {} - {} = {}; decay steps = round(schedule.decay_fraction * train.steps))",
        origin(toml, {"schedule.warmup_steps", "schedule.decay_fraction", "train.steps"}),
        schedule.warmup_steps, train.steps, config.decay_steps(),
        train.steps - config.decay_steps());
  }
  if (config.tst.bag > 1 && config.tst_switch_step() == 0) {
    fail(
        "{}: tst.bag = {} with tst.fraction = {} trains no step in bags (round(fraction x "
        "train.steps = {}) = 0; allowed: a fraction of at least 0.5 / train.steps, typically 0.2 "
        "to 0.4, or tst.bag = 1 to turn superposition off)",
        origin(toml, {"tst.bag", "tst.fraction", "train.steps"}), config.tst.bag,
        config.tst.fraction, train.steps);
  }
  check_pipeline(toml, config);
  // The model's shape is checked now even before the data's vocabulary is known, with a stand-in
  // vocabulary, so a bad hidden_size / num_heads fails at load rather than minutes later.
  ModelConfig model = config.model;
  if (model.vocab_size == 0) model.vocab_size = 1;
  try {
    model.validate();
  } catch (const Error& error) {
    std::vector<std::string> paths = {"model.preset", "model.vocab_size", "data.seq_len"};
    for (const ModelField& field : model_fields())
      paths.push_back(fmt::format("model.{}", field.name));
    const std::string where = origin(toml, paths);
    fail("{}: {}", where, error.what());
  }
}

RunConfig build(TomlConfig toml, const std::vector<std::string>& overrides) {
  for (const std::string& assignment : overrides) toml.apply_override(assignment);
  RunConfig config;
  read_sections(toml, config);
  toml.reject_unknown_keys();
  check_cross_field(toml, config);
  return config;
}

}  // namespace

RunConfig RunConfig::load(const std::filesystem::path& path,
                          const std::vector<std::string>& overrides) {
  return build(TomlConfig::load(path), overrides);
}

RunConfig RunConfig::parse(std::string_view toml_text, std::string_view source_name,
                           const std::vector<std::string>& overrides) {
  return build(TomlConfig::parse(toml_text, source_name), overrides);
}

std::string RunConfig::to_toml() const {
  std::string out = "# agora run config, fully resolved: every key, defaults included.\n";
  // TOML integers are signed 64-bit; larger seeds travel as decimal strings.
  if (seed > static_cast<uint64_t>(kMaxInt)) {
    out += fmt::format("seed = \"{}\"\n", seed);
  } else {
    out += fmt::format("seed = {}\n", seed);
  }

  out += "\n[model]\n";
  out += fmt::format("preset = {}\n", toml_quote(model.preset));
  out += fmt::format("vocab_size = {}  # 0 = from the data folder's meta.json\n", model.vocab_size);
  for (const ModelField& field : model_fields()) {
    if (model_overrides.count(field.name) != 0) {
      out += fmt::format("{} = {}\n", field.name, model_field_text(model, field));
    }
  }
  for (const ModelField& field : model_fields()) {
    if (model_overrides.count(field.name) == 0) {
      out +=
          fmt::format("# {} = {}  (from the preset)\n", field.name, model_field_text(model, field));
    }
  }
  out += fmt::format("# max_seq_len = {}  (data.seq_len)\n", model.max_seq_len);

  out += "\n[data]\n";
  out += fmt::format("dir = {}\n", toml_quote(data.dir));
  out += fmt::format("seq_len = {}\n", data.seq_len);
  // Only when set, so that runs begun before the key existed keep their stored config.
  if (!data.hash.empty()) out += fmt::format("hash = {}\n", toml_quote(data.hash));

  out += "\n[train]\n";
  out += fmt::format("steps = {}\n", train.steps);
  out += fmt::format("batch_size = {}\n", train.batch_size);
  out += fmt::format("micro_batch_size = {}\n", train.micro_batch_size);
  out += fmt::format("eval_interval = {}\n", train.eval_interval);
  out += fmt::format("eval_windows = {}\n", train.eval_windows);
  out += fmt::format("checkpoint_interval = {}\n", train.checkpoint_interval);
  out += fmt::format("log_interval = {}\n", train.log_interval);
  out += fmt::format("out_dir = {}\n", toml_quote(train.out_dir));
  out += fmt::format("device = {}\n", toml_quote(train.device));
  out += fmt::format("dtype = {}\n", toml_quote(train.dtype));
  out += fmt::format("threads = {}\n", train.threads);

  out += "\n[optimizer]\n";
  out += fmt::format("name = {}\n", toml_quote(optimizer.name));
  out += fmt::format("lr = {}\n", toml_float(optimizer.lr));
  out += fmt::format("beta1 = {}\n", toml_float(optimizer.beta1));
  out += fmt::format("beta2 = {}\n", toml_float(optimizer.beta2));
  out += fmt::format("eps = {}\n", toml_float(optimizer.eps));
  out += fmt::format("weight_decay = {}\n", toml_float(optimizer.weight_decay));
  out += fmt::format("grad_clip = {}\n", toml_float(optimizer.grad_clip));

  out += "\n[demo]\n";
  out += fmt::format("beta = {}\n", toml_float(demo.beta));
  out += fmt::format("topk = {}\n", demo.topk);
  out += fmt::format("chunk = {}\n", demo.chunk);
  out += fmt::format("one_bit = {}\n", demo.one_bit);
  out += fmt::format("lookahead = {}\n", demo.lookahead);
  out += fmt::format("max_norm_ratio = {}\n", toml_float(demo.max_norm_ratio));

  out += "\n[adamw]\n";
  out += fmt::format("gradient_dtype = {}\n", toml_quote(adamw.gradient_dtype));

  out += "\n[diloco]\n";
  out += fmt::format("inner_steps = {}\n", diloco.inner_steps);
  out += fmt::format("outer_lr = {}\n", toml_float(diloco.outer_lr));
  out += fmt::format("outer_momentum = {}\n", toml_float(diloco.outer_momentum));
  out += fmt::format("pseudo_gradient_dtype = {}\n", toml_quote(diloco.pseudo_gradient_dtype));

  out += "\n[schedule]\n";
  out += fmt::format("kind = {}\n", toml_quote(schedule.kind));
  out += fmt::format("warmup_steps = {}\n", schedule.warmup_steps);
  out += fmt::format("min_lr_ratio = {}\n", toml_float(schedule.min_lr_ratio));
  out += fmt::format("decay_fraction = {}\n", toml_float(schedule.decay_fraction));

  out += "\n[tst]\n";
  out += fmt::format("bag = {}\n", tst.bag);
  out += fmt::format("fraction = {}\n", toml_float(tst.fraction));

  const NetworkConfig& net = network;
  out += "\n[network]\n";
  out += fmt::format("listen = {}\n", toml_quote(net.listen));
  out += fmt::format("allowlist = {}\n", toml_quote(net.allowlist));
  out += fmt::format("open = {}\n", net.open);
  out += fmt::format("min_peers = {}\n", net.min_peers);
  out += fmt::format("warmup_seconds = {}\n", toml_float(net.warmup_seconds));
  out += fmt::format("overlap = {}\n", net.overlap);
  out += fmt::format("deadline_factor = {}\n", toml_float(net.deadline_factor));
  out += fmt::format("min_deadline_seconds = {}\n", toml_float(net.min_deadline_seconds));
  out += fmt::format("witness_seconds = {}\n", toml_float(net.witness_seconds));
  out += fmt::format("heartbeat_timeout_seconds = {}\n", toml_float(net.heartbeat_timeout_seconds));
  out += fmt::format("max_strikes = {}\n", net.max_strikes);
  out += fmt::format("hash_interval = {}\n", net.hash_interval);
  out += fmt::format("quorum = {}\n", toml_float(net.quorum));
  out += fmt::format("checkpointers = {}\n", net.checkpointers);
  out += fmt::format("finish_grace_seconds = {}\n", toml_float(net.finish_grace_seconds));
  out += fmt::format("max_members = {}\n", net.max_members);
  out += fmt::format("state_db = {}\n", toml_quote(net.state_db));
  out += fmt::format("split = {}\n", toml_quote(net.split));

  out += "\n[verify]\n";
  out += fmt::format("rate = {}\n", toml_float(verify.rate));
  out += fmt::format("seconds = {}\n", toml_float(verify.seconds));
  out += fmt::format("max_failures = {}\n", verify.max_failures);
  out += fmt::format("window = {}\n", verify.window);
  out += fmt::format("state_fraction = {}\n", toml_float(verify.state_fraction));

  out += "\n[pipeline]\n";
  out += fmt::format("stages = {}\n", pipeline.stages);
  out += fmt::format("schedule = {}\n", toml_quote(pipeline.schedule));
  out += fmt::format("micro_batches = {}\n", pipeline.micro_batches);
  out += fmt::format("optimizer = {}\n", toml_quote(pipeline.optimizer));
  out += fmt::format("nadam_beta1 = {}\n", toml_float(pipeline.nadam_beta1));
  out += fmt::format("nadam_momentum_decay = {}\n", toml_float(pipeline.nadam_momentum_decay));
  out += fmt::format("codec = {}\n", toml_quote(pipeline.codec));
  out += fmt::format("int8_block = {}\n", pipeline.int8_block);
  out += fmt::format("subspace_rank = {}\n", pipeline.subspace_rank);
  out += fmt::format("columns_kept = {}\n", toml_float(pipeline.columns_kept));
  return out;
}

void RunConfig::set_vocab_size(int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > kVocabRange.max) {
    fail("model.vocab_size = {} is invalid (allowed: an integer in [1, {}])", vocab_size,
         kVocabRange.max);
  }
  model.vocab_size = vocab_size;
  model.validate();
}

bool RunConfig::operator==(const RunConfig& other) const {
  return seed == other.seed && models_equal(model, other.model) &&
         model_overrides == other.model_overrides && data == other.data && train == other.train &&
         optimizer == other.optimizer && demo == other.demo && adamw == other.adamw &&
         diloco == other.diloco && schedule == other.schedule && tst == other.tst &&
         verify == other.verify && pipeline == other.pipeline && network == other.network;
}

void check_decentralized(const RunConfig& config) {
  if (config.optimizer.name != "demo") {
    fail(
        "optimizer.name = \"{}\" cannot run decentralized yet (allowed: \"demo\"; all-reduce "
        "AdamW and DiLoCo run with agora train --simulate-peers)",
        config.optimizer.name);
  }
  if (config.demo.lookahead) {
    fail("demo.lookahead = true cannot run decentralized yet (allowed: false)");
  }
}

}  // namespace agora
