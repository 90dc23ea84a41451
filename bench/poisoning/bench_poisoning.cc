// bench_poisoning: does one hostile member (or two) of eight move a DeMo run? Every run trains the
// same tiny model on the same tokens with 8 simulated peers; in all but the clean run, the last
// one or two peers replace their contribution before it is applied (TrainOptions::
// on_contributions), as a member of a real run could send anything well-formed:
//
//   sign_flip  its honest values negated
//   scale_1e6  its honest values times 1e6
//   noise      N(0, 1) values at its honest positions (about 1000x an honest value)
//   stale      its previous step's payload again, renumbered for this step (a replay that
//              passes the step check)
//   zero       every value 0: a lazy member that trained nothing
//
// For each: the final validation loss with the bound on a contribution's influence
// (demo.max_norm_ratio, its default) and, for one attacker of the --unbounded-attacks, without it
// (ratio 0), against the clean run; how many contribution tensors the bound scaled down. Writes
// --json.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/obs/progress.h"
#include "agora/optim/payload.h"
#include "agora/optim/strategy.h"
#include "agora/train/trainer.h"

namespace fs = std::filesystem;
using agora::Contribution;
using agora::Payload;

namespace {

const std::vector<std::string> kAttacks = {"sign_flip", "scale_1e6", "noise", "stale", "zero"};

// Rewrites the contributions of the last `attackers` peers, as attack `kind`.
class Adversary {
 public:
  Adversary(std::string kind, int64_t attackers) : kind_(std::move(kind)), attackers_(attackers) {}

  void operator()(int64_t step, std::vector<Contribution>& contributions) {
    const size_t n = contributions.size();
    for (size_t i = n - static_cast<size_t>(attackers_); i < n; ++i) {
      std::string& bytes = contributions[i].bytes;
      if (bytes.empty()) continue;
      const std::string honest = bytes;
      Payload p = agora::decode_payload(bytes);
      if (kind_ == "stale") {
        const auto last = previous_.find(i);
        if (last != previous_.end()) {
          p = agora::decode_payload(last->second);
          p.step = static_cast<uint64_t>(step);
        }
      } else {
        for (agora::TensorPayload& t : p.tensors) {
          for (float& v : t.values) v = attacked(v);
        }
      }
      previous_[i] = honest;
      bytes = agora::encode_payload(p);
    }
  }

 private:
  float attacked(float v) {
    if (kind_ == "sign_flip") return -v;
    if (kind_ == "scale_1e6") return v * 1e6f;
    if (kind_ == "noise") return noise_(rng_);
    return 0.0f;  // zero
  }

  std::string kind_;
  int64_t attackers_;
  std::map<size_t, std::string> previous_;  // each attacker's honest payload of the last step
  std::mt19937 rng_{1234};
  std::normal_distribution<float> noise_{0.0f, 1.0f};
};

struct Outcome {
  double val_loss = NAN;
  int64_t clipped = 0, refused = 0, skipped = 0;
  double seconds = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DeMo under poisoning: final validation loss with hostile simulated peers"};
  std::string data = "data/tokens/sp8k", preset = "tiny", out = "out/bench/poisoning", json;
  int64_t seq_len = 128, batch = 32, micro = 4, peers = 8, steps = 80, eval_windows = 64;
  int64_t warmup = 10, threads = 0;
  double lr = 1e-2, ratio = 2.0;
  std::string only, unbounded_only = "sign_flip,scale_1e6";
  app.add_option("--data", data, "Token folder (agora tokenize)");
  app.add_option("--preset", preset, "Model preset");
  app.add_option("--seq-len", seq_len);
  app.add_option("--batch", batch, "Global batch (sequences per step, all peers)");
  app.add_option("--micro-batch", micro);
  app.add_option("--peers", peers, "Simulated peers (the attackers are the last ones)");
  app.add_option("--steps", steps);
  app.add_option("--eval-windows", eval_windows);
  app.add_option("--warmup", warmup, "Warmup steps (cosine schedule after)");
  app.add_option("--lr", lr, "DeMo's learning rate (bench/convergence's best for tiny)");
  app.add_option("--max-norm-ratio", ratio, "demo.max_norm_ratio of the bounded runs");
  app.add_option("--threads", threads, "0 = every core");
  app.add_option("--attacks", only, "Comma-separated subset of sign_flip,scale_1e6,noise,stale,zero");
  app.add_option("--unbounded-attacks", unbounded_only,
                 "Attacks also run without the bound (one attacker), comma-separated; empty "
                 "for none");
  app.add_option("--out", out, "Folder for the runs' checkpoints");
  app.add_option("--json", json, "Write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  if (peers < 3) {
    std::fprintf(stderr, "bench_poisoning: --peers %lld is too few (allowed: 3 or more)\n",
                 static_cast<long long>(peers));
    return 2;
  }

  const auto listed = [](const std::string& list, const std::string& a) {
    return ("," + list + ",").find("," + a + ",") != std::string::npos;
  };
  std::vector<std::string> attacks;
  for (const std::string& a : kAttacks) {
    if (only.empty() || listed(only, a)) attacks.push_back(a);
  }
  const bool unbounded = !unbounded_only.empty();

  const auto run = [&](const std::string& name, const std::string& attack, int64_t attackers,
                       double max_norm_ratio) {
    const std::vector<std::string> overrides = {
        "model.preset=" + preset,
        "data.dir=" + data,
        fmt::format("data.seq_len={}", seq_len),
        fmt::format("train.steps={}", steps),
        fmt::format("train.batch_size={}", batch),
        fmt::format("train.micro_batch_size={}", micro),
        fmt::format("train.eval_interval={}", steps),
        fmt::format("train.eval_windows={}", eval_windows),
        fmt::format("train.threads={}", threads),
        "train.out_dir=" + (fs::path(out) / name).string(),
        "schedule.kind=cosine",
        fmt::format("schedule.warmup_steps={}", warmup),
        "optimizer.name=demo",
        fmt::format("optimizer.lr={}", lr),
        fmt::format("demo.max_norm_ratio={}", max_norm_ratio),
    };
    const agora::RunConfig config = agora::RunConfig::parse("", "bench_poisoning", overrides);
    std::fprintf(stderr, "\n== %s\n", name.c_str());
    Outcome o;
    agora::TrainOptions options;
    options.simulate_peers = peers;
    if (attackers > 0) options.on_contributions = Adversary(attack, attackers);
    options.on_step = [&](const agora::StepStats& s) {
      o.clipped += s.clipped;
      o.refused += s.refused;
      o.skipped += s.skipped ? 1 : 0;
    };
    const agora::TrainSummary summary = agora::train(config, options);
    o.val_loss = summary.val_loss;
    o.seconds = summary.seconds;
    return o;
  };

  try {
    fs::create_directories(out);
    const Outcome clean = run("clean", "", 0, ratio);
    const Outcome clean_unbounded = unbounded ? run("clean_unbounded", "", 0, 0.0) : Outcome{};
    struct Row {
      std::string attack;
      int64_t attackers;
      Outcome bounded, unbounded;
    };
    std::vector<Row> rows;
    for (const int64_t attackers : {int64_t{1}, int64_t{2}}) {
      for (const std::string& attack : attacks) {
        Row row{attack, attackers, {}, {}};
        row.bounded = run(fmt::format("{}_{}", attack, attackers), attack, attackers, ratio);
        if (attackers == 1 && listed(unbounded_only, attack)) {
          row.unbounded =
              run(fmt::format("{}_{}_unbounded", attack, attackers), attack, attackers, 0.0);
        }
        rows.push_back(std::move(row));
      }
    }

    const auto pct = [&](double v) { return 100.0 * (v - clean.val_loss) / clean.val_loss; };
    std::printf(
        "\npoisoning: %s, %lld simulated peers, %lld steps x %lld x %lld tokens, DeMo lr %g, "
        "max_norm_ratio %g\nclean run: final val loss %.4f (%.4f without the bound)\n\n",
        preset.c_str(), static_cast<long long>(peers), static_cast<long long>(steps),
        static_cast<long long>(batch), static_cast<long long>(seq_len), lr, ratio, clean.val_loss,
        clean_unbounded.val_loss);
    std::printf("%-10s %9s %12s %10s %14s %16s %10s\n", "attack", "attackers", "val loss",
                "vs clean", "tensors bound", "without bound", "vs clean");
    nlohmann::json rows_json = nlohmann::json::array();
    for (const Row& r : rows) {
      const bool has_unbounded = !std::isnan(r.unbounded.val_loss);
      std::printf("%-10s %6lld/%lld %12.4f %+9.2f%% %14lld %16s %10s\n", r.attack.c_str(),
                  static_cast<long long>(r.attackers), static_cast<long long>(peers),
                  r.bounded.val_loss, pct(r.bounded.val_loss),
                  static_cast<long long>(r.bounded.clipped),
                  has_unbounded ? fmt::format("{:.4f}", r.unbounded.val_loss).c_str() : "-",
                  has_unbounded ? fmt::format("{:+.2f}%", pct(r.unbounded.val_loss)).c_str()
                                : "-");
      nlohmann::json row = {{"attack", r.attack},
                            {"attackers", r.attackers},
                            {"val_loss", r.bounded.val_loss},
                            {"vs_clean_percent", pct(r.bounded.val_loss)},
                            {"tensors_bound", r.bounded.clipped},
                            {"refused", r.bounded.refused},
                            {"skipped_steps", r.bounded.skipped},
                            {"seconds", r.bounded.seconds}};
      if (has_unbounded) {
        row["unbounded_val_loss"] = r.unbounded.val_loss;
        row["unbounded_vs_clean_percent"] = pct(r.unbounded.val_loss);
        row["unbounded_skipped_steps"] = r.unbounded.skipped;
      }
      rows_json.push_back(row);
    }
    std::printf("\nhonest-only: %lld contribution tensors bound over %lld steps\n",
                static_cast<long long>(clean.clipped), static_cast<long long>(steps));
    if (!json.empty()) {
      const nlohmann::json j = {{"preset", preset},
                                {"peers", peers},
                                {"steps", steps},
                                {"batch", batch},
                                {"seq_len", seq_len},
                                {"lr", lr},
                                {"max_norm_ratio", ratio},
                                {"clean_val_loss", clean.val_loss},
                                {"clean_tensors_bound", clean.clipped},
                                {"clean_unbounded_val_loss",
                                 unbounded ? nlohmann::json(clean_unbounded.val_loss) : nullptr},
                                {"rows", rows_json}};
      const fs::path parent = fs::path(json).parent_path();
      if (!parent.empty()) fs::create_directories(parent);
      agora::write_file_atomic(json, j.dump(2));
    }
  } catch (const agora::Error& e) {
    std::fprintf(stderr, "bench_poisoning: %s\n", e.what());
    return 1;
  }
  return 0;
}
