// RunConfig: everything `agora train --config FILE [--set key=value ...]` needs, validated.
//
// Loaded from TOML (configs/*.toml are the examples). What it promises:
//   - every value is checked for type and range, and the cross-field rules hold (batch_size is a
//     multiple of micro_batch_size, warmup fits in the run, ...); an Error names the key as a
//     dotted path, the value and what is allowed, and where it came from (the file or the --set);
//   - an unknown key is an error with a did-you-mean suggestion, never a silent default;
//   - to_toml() writes the fully resolved config, every key, deterministically, and
//     parse(to_toml()) == *this, so a run's out_dir can keep the exact config it ran with.
//
// The schema, with its defaults:
//
//   seed = 1234                 # any 64-bit unsigned (quote values above 2^63 - 1)
//   [model]
//   preset = "small"            # one of model_preset_names()
//   vocab_size = 0              # 0 = take it from the data folder's meta.json at run time
//   # optional overrides of the preset's fields: hidden_size, intermediate_size, num_layers,
//   # num_heads, num_kv_heads, rope_theta, rms_norm_eps, tie_embeddings, init_std, yarn_factor,
//   # yarn_original_max_seq_len, yarn_beta_fast, yarn_beta_slow, logn_attention_scaling
//   [data]
//   dir = "data/tokens/sp8k"    # a folder written by `agora tokenize`
//   seq_len = 256               # becomes model.max_seq_len
//   hash = ""                   # the folder's `agora data hash`; members refuse other data
//   [train]
//   steps = 1000, batch_size = 32, micro_batch_size = 8, eval_interval = 100, eval_windows = 32,
//   checkpoint_interval = 0, log_interval = 10, out_dir = "runs/default", device = "auto",
//   dtype = "float32", threads = 0
//   [optimizer]
//   name = "demo", lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1,
//   grad_clip = 1.0             # name: demo | adamw | diloco (docs/algorithms.md sections 1-3)
//   [demo]
//   beta = 0.999, topk = 32, chunk = 64, one_bit = false, lookahead = false
//   [adamw]
//   gradient_dtype = "float32"  # what peers exchange: float32 | bfloat16
//   [diloco]
//   inner_steps = 50, outer_lr = 0.7, outer_momentum = 0.9,
//   pseudo_gradient_dtype = "float32"   # float32 | bfloat16 | int8 (per-row scales)
//   [schedule]
//   kind = "cosine", warmup_steps = 100, min_lr_ratio = 0.1, decay_fraction = 0.2
//   [tst]                       # Token Superposition Training (docs/algorithms.md section 4)
//   bag = 1, fraction = 0.0     # the first round(fraction * steps) steps read bags of `bag`
//   [network]                   # decentralized runs only (agora coordinator / agora peer)
//   listen = "tcp://0.0.0.0:7400", allowlist = "", open = false,  # one of the two is required
//   min_peers = 2, warmup_seconds = 2.0, overlap = 1, deadline_factor = 3.0,
//   min_deadline_seconds = 10.0, witness_seconds = 10.0, heartbeat_timeout_seconds = 15.0,
//   max_strikes = 3, hash_interval = 10, quorum = 0.5, checkpointers = 1,
//   finish_grace_seconds = 60.0, max_members = 256,
//   state_db = "coordinator.db", split = "throughput"
//   [verify]
//   rate = 0.02, seconds = 60.0, max_failures = 2, window = 8
//   [pipeline]                  # model parallelism (docs/pipeline.md); stages = 1 is off
//   stages = 1, schedule = "gpipe", micro_batches = 4, optimizer = "adamw", nadam_beta1 = 0.99,
//   nadam_momentum_decay = 0.004, codec = "float32", int8_block = 64, subspace_rank = 0,
//   columns_kept = 0.0
//
// Torch-free: the CLI, tests and the coordinator read configs without libtorch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agora/config/model_config.h"

namespace agora {

struct DataConfig {
  std::string dir = "data/tokens/sp8k";  // a folder of train_*.bin / val_*.bin and meta.json
  int64_t seq_len = 256;                 // tokens per training window; model.max_seq_len
  // The tokens every member must train on (data/data_identity.h, `agora data hash DIR`): 64 hex
  // digits, or empty for a run that does not check its members' folders.
  std::string hash;

  bool operator==(const DataConfig&) const = default;
};

struct TrainConfig {
  int64_t steps = 1000;             // optimizer steps
  int64_t batch_size = 32;          // sequences per optimizer step
  int64_t micro_batch_size = 8;     // sequences per forward/backward; divides batch_size
  int64_t eval_interval = 100;      // steps between validation runs; 0 = only at the end
  int64_t eval_windows = 32;        // validation windows per evaluation
  int64_t checkpoint_interval = 0;  // steps between checkpoints; 0 = only at the end
  int64_t log_interval = 10;        // steps between progress lines
  std::string out_dir = "runs/default";
  std::string device = "auto";    // auto | cpu | cuda
  std::string dtype = "float32";  // float32 | bfloat16 (autocast where supported)
  int64_t threads = 0;            // intra-op threads; 0 = every core

  int64_t accumulation_steps() const { return batch_size / micro_batch_size; }
  bool operator==(const TrainConfig&) const = default;
};

struct OptimizerConfig {
  std::string name = "demo";  // demo | adamw | diloco
  double lr = 3e-3;           // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled; never applied to norms
  double grad_clip = 1.0;     // max norm of each peer's own gradient; 0 = off

  bool operator==(const OptimizerConfig&) const = default;
};

// DeMo (docs/algorithms.md section 1); optimizer.lr, weight_decay and grad_clip apply as well.
struct DemoConfig {
  double beta = 0.999;     // momentum decay
  int64_t topk = 32;       // coefficients sent per chunk
  int64_t chunk = 64;      // target chunk edge
  bool one_bit = false;    // send signs only
  bool lookahead = false;  // Psyche's variant: gradients at p - lr_prev * sign(delta)
  // Bounded influence: each contribution's values, per tensor, at most this many times the
  // step's lower-median norm (optim/influence.h); 0 = no bound. 1 (nobody counts more than the
  // median member) measured better than 2 on clean and attacked runs (docs/results.md).
  double max_norm_ratio = 1.0;

  bool operator==(const DemoConfig&) const = default;
};

// All-reduce AdamW: optimizer.beta1/beta2/eps/weight_decay are AdamW's.
struct AdamWConfig {
  std::string gradient_dtype = "float32";  // float32 | bfloat16

  bool operator==(const AdamWConfig&) const = default;
};

// DiLoCo (docs/algorithms.md section 2): the inner optimizer is AdamW with optimizer.*.
struct DiLoCoConfig {
  int64_t inner_steps = 50;  // H: inner steps between syncs; divides train.steps
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  std::string pseudo_gradient_dtype = "float32";  // float32 | bfloat16 | int8

  bool operator==(const DiLoCoConfig&) const = default;
};

struct ScheduleConfig {
  std::string kind = "cosine";  // constant | cosine | wsd, all with linear warmup
  int64_t warmup_steps = 100;
  double min_lr_ratio = 0.1;    // cosine floor and wsd end, as a fraction of lr
  double decay_fraction = 0.2;  // wsd only: the final fraction of steps that decays

  bool operator==(const ScheduleConfig&) const = default;
};

// Token Superposition Training (docs/algorithms.md section 4). Phase 1, steps
// [0, switch_step()): each sequence reads bag * seq_len data tokens, each bag of `bag`
// consecutive tokens enters the model as the mean of their embeddings, and position j predicts
// every token of bag j + 1. Phase 2, the rest: ordinary next-token training. One model,
// optimizer state and lr schedule throughout. bag = 1 (the default) is ordinary training at every
// step.
struct TstConfig {
  int64_t bag = 1;        // s: tokens per bag in phase 1
  double fraction = 0.0;  // r: the share of train.steps in phase 1, in [0, 1)

  bool operator==(const TstConfig&) const = default;
};

// A decentralized run (docs/protocol.md). The coordinator reads all of it; peers receive the
// coordinator's config when they join, so every member trains with the same settings.
struct NetworkConfig {
  std::string listen = "tcp://0.0.0.0:7400";  // the coordinator's control socket
  // Who may join, said explicitly (the coordinator refuses to start with neither or both): the
  // keys of the allowlist file (hex ed25519 public keys, one per line), or any key when open.
  std::string allowlist;
  bool open = false;
  int64_t min_peers = 2;         // rounds run while at least this many members are active
  double warmup_seconds = 2.0;   // once min_peers joined, wait this long for more before step 0
  int64_t overlap = 1;           // 0 = synchronous; 1 = fetch step s while computing step s + 1
  double deadline_factor = 3.0;  // round deadline: factor x the slowest expected compute time
  double min_deadline_seconds = 10.0;     // ... but never less than this
  double witness_seconds = 10.0;          // after a commit phase closes: time to fetch and witness
  double heartbeat_timeout_seconds = 15;  // silence after which a member is dropped
  int64_t max_strikes = 3;                // missed deadlines / undelivered payloads before a drop
  int64_t hash_interval = 10;             // K: peers report their parameter hash every K steps
  double quorum = 0.5;  // in [0, 1): a payload is final when more than quorum x members hold it
  // Members holding the checkpointer role (they write every train.checkpoint_interval steps and
  // at the end); the coordinator hands the role on when a holder leaves, so it stays filled.
  int64_t checkpointers = 1;
  // After the last step: how long members keep serving a member still catching up, and the
  // coordinator waits for the final checkpoint, before everyone is released.
  double finish_grace_seconds = 60.0;
  // Current (active or syncing) members at most; joiners beyond are refused. Bounds every
  // member list the coordinator sends (each must fit the 1 MiB control limit) and its memory.
  int64_t max_members = 256;
  std::string state_db = "coordinator.db";  // the coordinator's SQLite file
  // How a round's batch is split among its members: "throughput" (in proportion to each one's
  // measured sequences per second, so nobody waits for the slowest) or "even" (equal shares
  // whatever their speed: which member trains which sequences then depends on the round's members
  // alone, not on timing, so clean runs of the same config repeat; for tests and comparisons).
  std::string split = "throughput";

  bool operator==(const NetworkConfig&) const = default;
};

// Spot checks by recomputation (docs/verification.md): each round a random `rate` of the
// contributions is redone by another member and compared with what its author sent.
struct VerifyConfig {
  // In [0, 1]: the share of contributions checked; 0 = none. The default costs a run under 5% of
  // its tokens/s (docs/results.md, "Spot checks in runs"; 0.05 cost 7%).
  double rate = 0.02;
  // A verifier that has not answered this long after it was asked is replaced.
  double seconds = 60.0;
  // Confirmed failures (a wrong contribution, or a false accusation) before a member is dropped.
  int64_t max_failures = 2;
  // Rounds an author keeps its strategy states, and a member the parameters of, for verifiers.
  int64_t window = 8;
  // In (0, 1]: the share of the author's momentum (by bytes) a check fetches and compares, the
  // tensors drawn per check (peer/state_sample.h). A check moves the author's state before and
  // after the step, 8 bytes per parameter in all: on a slow link the whole of it delayed the
  // run's payloads (docs/results.md). Work skipped on any tensor still shows in every check
  // (the gradient, and so every tensor's momentum, is wrong); a member that corrupts only some
  // tensors is caught with about this probability per check.
  double state_fraction = 0.125;

  bool operator==(const VerifyConfig&) const = default;
};

// Model parallelism (docs/pipeline.md): the model cut into `stages` contiguous stages, each
// holding only its layers and their optimizer state, exchanging activations forward and their
// gradients backward through a (compressed) boundary. The optimizer's lr, betas (AdamW), eps,
// weight decay and grad_clip (per stage, local) come from [optimizer]; optimizer.name is not used.
struct PipelineConfig {
  int64_t stages = 1;  // 1 = the whole model in one place (no pipeline)
  // gpipe: synchronous (micro-batches, flush, one update per step: the gradients of the whole
  // model). async: PipeDream's 1F1B without flush, one update per step, stage i's gradient stale
  // by stages - 1 - i updates, with weight stashing.
  std::string schedule = "gpipe";
  int64_t micro_batches = 4;        // gpipe: a step's batch in this many equal micro-batches
  std::string optimizer = "adamw";  // per stage: adamw | nadam (decoupled weight decay)
  double nadam_beta1 = 0.99;        // the asynchronous method's momentum (torch's default 0.9)
  double nadam_momentum_decay = 0.004;
  // What crosses a boundary: float32 | bfloat16 | int8 (blockwise absmax) | subspace (k
  // coefficients per token, the residual stream constrained to a fixed rank-k basis) | columns
  // (the largest columns of each micro-batch's activations, the same columns' gradients back).
  std::string codec = "float32";
  int64_t int8_block = 64;    // values per int8 scale
  int64_t subspace_rank = 0;  // k for codec = "subspace", in [1, hidden_size]
  double columns_kept = 0;    // for codec = "columns": the fraction of hidden_size sent, (0, 1]

  bool enabled() const { return stages > 1; }
  bool operator==(const PipelineConfig&) const = default;
};

struct RunConfig {
  uint64_t seed = 1234;
  // The preset's shape with the [model] overrides applied; max_seq_len = data.seq_len and
  // model.preset names the preset.
  ModelConfig model = model_preset("small", 0, 256);
  // The ModelConfig fields [model] set explicitly (not vocab_size, which is always written), so
  // to_toml() writes them back as overrides rather than as the preset's values.
  std::set<std::string> model_overrides;
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  DemoConfig demo;
  AdamWConfig adamw;
  DiLoCoConfig diloco;
  ScheduleConfig schedule;
  TstConfig tst;
  NetworkConfig network;
  VerifyConfig verify;
  PipelineConfig pipeline;

  // Reads `path`, applies each "key=value" override in order, validates. Throws Error.
  static RunConfig load(const std::filesystem::path& path,
                        const std::vector<std::string>& overrides = {});
  // The same from text; `source_name` prefixes every message (a file name, or "<string>").
  static RunConfig parse(std::string_view toml_text, std::string_view source_name,
                         const std::vector<std::string>& overrides = {});

  // Every key, in schema order, with the preset's model fields as comments.
  std::string to_toml() const;

  // Sets model.vocab_size (from the data folder's meta.json) and validates the model in full.
  // Throws Error when vocab_size <= 0 or the model is invalid with it.
  void set_vocab_size(int64_t vocab_size);

  // The learning rate for optimizer step `step` (0-based), W = warmup_steps, S = train.steps,
  // lr = optimizer.lr, floor = lr * min_lr_ratio:
  //   step < W (warmup, every kind):   lr * (step + 1) / W
  //   constant:                        lr
  //   cosine:  p = (step - W) / (S - W), clamped to [0, 1]
  //                                    floor + (lr - floor) * 0.5 * (1 + cos(pi * p))
  //            so step W gets lr and the decay would reach floor at step S, one past the last.
  //   wsd:     D = round(decay_fraction * S) clamped to [1, S]; the last D steps decay:
  //            step < S - D:           lr
  //            otherwise p = (step - (S - D) + 1) / D, clamped to [0, 1]
  //                                    lr - (lr - floor) * p
  //            so the first decay step is already below lr and step S - 1 gets exactly floor.
  // Steps past the end keep the last value of the formula (floor for cosine and wsd).
  // Throws Error for step < 0.
  double learning_rate(int64_t step) const;
  // D above; 0 for kinds other than wsd.
  int64_t decay_steps() const;

  // TST: the first step of phase 2, round(tst.fraction * train.steps). Steps before it train
  // on bags even when tst.bag = 1, which is ordinary training by another road (the tests
  // compare the two bit for bit).
  int64_t tst_switch_step() const;
  // The bag size step `step` trains with: tst.bag before the switch, 1 from it on.
  int64_t bag_at(int64_t step) const;
  // Data tokens that steps [0, steps) read: sum over steps of batch_size * seq_len * bag_at(step).
  uint64_t data_tokens_through(int64_t steps) const;

  bool operator==(const RunConfig& other) const;
};

// Throws Error when `config` cannot train as a decentralized run today: the network applies
// DeMo payloads only (optimizer.name = "demo"), without the look-ahead variant.
void check_decentralized(const RunConfig& config);

}  // namespace agora
