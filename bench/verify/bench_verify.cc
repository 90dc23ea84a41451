// bench_verify: can a verifier tell an honest peer's DeMo contribution from a lazy one by
// recomputing it (train/recompute.h), when the two machines do not sum floats alike?
//
// One peer's share of a run (--batch / --peers sequences per step) trains --warmup steps, then for
// each of --checks steps the "author" computes its contribution from the step's parameters and
// its momentum, with 1 or 2 threads (alternating), and a verifier recomputes it from the same
// committed inputs with 1 and with 2 threads. Each claimed contribution below is compared with
// both recomputations (optim/payload_agreement.h: overlap of the selected DCT positions, sign
// agreement on the shared ones) and, for the momentum the author would commit to for its next
// step, by the relative error against the recomputed one:
//
//   honest          the author's own contribution (same or other thread count than the verifier)
//   momentum_only   no forward or backward at all: the payload of the momentum alone (g = 0)
//   half_batch      trained on the first half of its assigned sequences only
//   other_data      trained on sequences it was not assigned
//   stale_params    trained from the parameters of 5 steps before
//   perturbed_model trained from parameters with 1% relative noise (a cheaper, wrong model)
//   replay          its previous step's payload, renumbered (its momentum left as it was)
//   noise           random positions and signs (its momentum left as it was)
//
// A verifier on another machine runs other BLAS kernels. The honest claims are also recomputed in
// child processes with OPENBLAS_CORETYPE forcing other kernels (--blas-coretypes; OpenBLAS picks
// Haswell's, AVX2, on the AMD EPYC this was measured on, so the defaults are AVX-512 and AVX):
// each check step's committed inputs and the honest claim go to --work as safetensors, and the
// child (bench_verify --recompute-dir) reports its agreement as JSON lines.
//
// The table gives, per claim, the lowest and highest overlap and sign agreement and the momentum
// error over every check and verifier thread count; the margin between the lowest honest figure
// and the highest lazy one is what a tolerance can be set in. Writes --json.
#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "agora/optim/payload.h"
#include "agora/optim/payload_agreement.h"
#include "agora/train/recompute.h"
#include "agora/train/step.h"
#include "agora/train/torch_safetensors.h"

namespace fs = std::filesystem;
using agora::Payload;
using State = std::map<std::string, torch::Tensor>;

namespace {

const std::vector<std::string> kClaims = {
    "honest_same_threads", "honest_other_threads", "momentum_only", "half_batch", "other_data",
    "stale_params",        "perturbed_model",      "replay",        "noise"};

struct Figures {
  std::vector<double> overlap, signs, state_error;
  // Comparisons the default tolerance (AgreementTolerance{}) lets through: the payload check, the
  // momentum check, and both (a claim is accepted only when both pass).
  int64_t payload_passed = 0, momentum_passed = 0, both_passed = 0;

  void add(double o, double g, double e, bool payload_ok) {
    const bool momentum_ok = agora::momentum_agrees(e, {});
    overlap.push_back(o);
    signs.push_back(g);
    state_error.push_back(e);
    payload_passed += payload_ok;
    momentum_passed += momentum_ok;
    both_passed += payload_ok && momentum_ok;
  }
};

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& v) {
  std::vector<torch::Tensor> out;
  for (const auto& t : v) out.push_back(t.detach().clone());
  return out;
}

State clone_state(const State& s) {
  State out;
  for (const auto& [k, v] : s) out[k] = v.clone();
  return out;
}

// The payload of `learner`'s momentum alone: what a peer that skipped forward and backward sends.
agora::Recomputed momentum_only(agora::Learner& scratch, const std::vector<torch::Tensor>& params,
                                const State& state, const agora::StepContext& context) {
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      scratch.params[i].copy_(params[i]);
      scratch.params[i].mutable_grad() = torch::zeros_like(scratch.params[i]);
    }
  }
  scratch.strategy->load_state(state);
  agora::Recomputed out;
  out.result.contribution = scratch.strategy->contribute(context);
  for (const auto& [k, v] : scratch.strategy->state()) out.state_after[k] = v.clone();
  return out;
}

// Random positions and signs in `layout`: what a peer that computed nothing at all sends.
std::string noise_payload(const Payload& shape, uint64_t step, std::mt19937& rng) {
  Payload p = shape;
  p.step = step;
  for (agora::TensorPayload& t : p.tensors) {
    const int64_t n = t.layout.chunk_size(), k = t.layout.topk;
    std::vector<uint32_t> all(static_cast<size_t>(n));
    for (int64_t c = 0; c < t.layout.num_chunks(); ++c) {
      for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
      std::shuffle(all.begin(), all.end(), rng);
      std::sort(all.begin(), all.begin() + k);
      for (int64_t i = 0; i < k; ++i) {
        t.positions[static_cast<size_t>(c * k + i)] = all[static_cast<size_t>(i)];
        t.values[static_cast<size_t>(c * k + i)] = (rng() & 1) ? 1.0f : -1.0f;
      }
    }
  }
  return agora::encode_payload(p);
}

// The committed inputs of check step `s` and the author's honest claim, for a child verifier.
void save_check(const fs::path& dir, int64_t s, const agora::StepContext& context,
                const agora::SequenceRange& range, const std::vector<torch::Tensor>& params,
                const State& state, const agora::Recomputed& honest) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (size_t i = 0; i < params.size(); ++i)
    tensors.emplace_back(fmt::format("param.{}", i), params[i]);
  for (const auto& [k, v] : state) tensors.emplace_back("state." + k, v);
  for (const auto& [k, v] : honest.state_after) tensors.emplace_back("after." + k, v);
  agora::save_tensors(dir / fmt::format("step_{}.safetensors", s), tensors, {});
  agora::write_file_atomic(dir / fmt::format("step_{}.agp", s), honest.result.contribution.bytes);
  const nlohmann::json j = {{"step", s},
                            {"lr", context.lr},
                            {"peers", context.num_peers},
                            {"first", range.first},
                            {"count", range.count}};
  agora::write_file_atomic(dir / fmt::format("step_{}.json", s), j.dump());
}

// The child: recomputes every saved check step and prints its agreement with the honest claim.
void recompute_saved(const agora::RunConfig& config, const fs::path& dir, int threads,
                     int64_t first, int64_t last) {
  torch::set_num_threads(threads);
  const torch::Device cpu(torch::kCPU);
  agora::Learner scratch = agora::Learner::create(config, cpu);
  const agora::TrainStep train_step(config, cpu);
  for (int64_t s = first; s < last; ++s) {
    const fs::path meta = dir / fmt::format("step_{}.json", s);
    const nlohmann::json j = nlohmann::json::parse(agora::read_file(meta));
    const auto tensors = agora::load_tensors(dir / fmt::format("step_{}.safetensors", s));
    std::vector<torch::Tensor> params(scratch.params.size());
    State state, after;
    for (const auto& [name, t] : tensors) {
      if (name.rfind("param.", 0) == 0) params[std::stoul(name.substr(6))] = t;
      if (name.rfind("state.", 0) == 0) state[name.substr(6)] = t;
      if (name.rfind("after.", 0) == 0) after[name.substr(6)] = t;
    }
    const agora::StepContext context{s, j["lr"].get<double>(), j["peers"].get<int64_t>()};
    const std::vector<agora::SequenceRange> ranges = {
        {j["first"].get<uint64_t>(), j["count"].get<uint64_t>()}};
    const agora::Recomputed check =
        agora::recompute(train_step, scratch, {params, &state, context, ranges});
    const agora::PayloadAgreement a = agora::compare_payloads(
        agora::decode_payload(agora::read_file(dir / fmt::format("step_{}.agp", s))),
        agora::decode_payload(check.result.contribution.bytes));
    const nlohmann::json out = {
        {"step", s},
        {"identical", a.identical},
        {"agrees", agora::agrees(a, {})},
        {"overlap", a.overlap()},
        {"signs", a.sign_agreement()},
        {"state_error", agora::relative_state_error(after, check.state_after)}};
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::lround(q * static_cast<double>(v.size() - 1)))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_verify: honest and lazy DeMo contributions against a recomputation"};
  std::string data = "data/tokens/sp8k", preset = "tiny", json;
  int64_t vocab = 8192, seq_len = 64, batch = 24, peers = 8, micro = 8, warmup = 60, checks = 30,
          topk = 8;
  double lr = 1e-2;
  bool one_bit = true;
  app.add_option("--data", data, "Token folder (agora tokenize)");
  app.add_option("--preset", preset, "Model preset");
  app.add_option("--vocab", vocab, "model.vocab_size (the token folder's)");
  app.add_option("--seq-len", seq_len);
  app.add_option("--batch", batch, "Global batch; the author trains batch / peers of it");
  app.add_option("--peers", peers);
  app.add_option("--micro-batch", micro);
  app.add_option("--warmup", warmup, "Steps trained before the first check");
  app.add_option("--checks", checks, "Steps checked");
  app.add_option("--topk", topk, "demo.topk");
  app.add_option("--lr", lr, "DeMo's learning rate (constant)");
  app.add_option("--one-bit", one_bit, "demo.one_bit");
  app.add_option("--json", json, "Write the results as JSON");
  std::string coretypes = "SkylakeX,Sandybridge", work = "/tmp/agora-bench-verify", recompute_dir;
  int child_threads = 1;
  app.add_option("--blas-coretypes", coretypes,
                 "OPENBLAS_CORETYPE values the honest claims are also recomputed under, each in a "
                 "child process (comma-separated; empty for none)");
  app.add_option("--work", work, "Folder for the committed inputs the children read");
  app.add_option("--recompute-dir", recompute_dir, "Child mode: recompute the steps saved here");
  app.add_option("--child-threads", child_threads, "Child mode: threads");
  CLI11_PARSE(app, argc, argv);

  try {
    const std::vector<std::string> overrides = {
        "model.preset=" + preset,
        "data.dir=" + data,
        fmt::format("model.vocab_size={}", vocab),
        fmt::format("data.seq_len={}", seq_len),
        fmt::format("train.steps={}", warmup + checks),
        fmt::format("train.batch_size={}", batch),
        fmt::format("train.micro_batch_size={}", micro),
        "schedule.kind=constant",
        "schedule.warmup_steps=3",
        "optimizer.name=demo",
        fmt::format("optimizer.lr={}", lr),
        fmt::format("demo.topk={}", topk),
        fmt::format("demo.one_bit={}", one_bit ? "true" : "false"),
    };
    const agora::RunConfig config = agora::RunConfig::parse("", "bench_verify", overrides);
    if (!recompute_dir.empty()) {
      recompute_saved(config, recompute_dir, child_threads, warmup, warmup + checks);
      return 0;
    }
    const bool children = !coretypes.empty();
    if (children) {
      fs::remove_all(work);
      fs::create_directories(work);
    }
    const torch::Device cpu(torch::kCPU);
    agora::Learner author = agora::Learner::create(config, cpu);
    agora::Learner scratch = agora::Learner::create(config, cpu);
    const agora::TrainStep train_step(config, cpu);
    const uint64_t share = static_cast<uint64_t>(std::max<int64_t>(1, batch / peers));

    std::map<std::string, Figures> figures;
    std::deque<std::vector<torch::Tensor>> history;  // the parameters of the last steps
    std::string previous_payload;
    std::mt19937 rng(7);
    double step_seconds = 0, verify_seconds = 0;
    int64_t state_bytes = 0;
    for (int64_t s = 0; s < warmup + checks; ++s) {
      const agora::StepContext context{s, config.learning_rate(s), peers};
      const std::vector<agora::SequenceRange> ranges = {{static_cast<uint64_t>(s * batch), share}};
      const std::vector<torch::Tensor> params = clone_all(author.params);
      const State state = clone_state(author.strategy->state());
      history.push_back(params);
      if (history.size() > 6) history.pop_front();
      const int author_threads = s % 2 == 0 ? 1 : 2;
      torch::set_num_threads(author_threads);
      const auto t0 = std::chrono::steady_clock::now();
      const agora::Recomputed honest =
          agora::recompute(train_step, scratch, {params, &state, context, ranges});
      step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

      if (s >= warmup) {
        std::fprintf(stderr, "\rcheck %lld/%lld", static_cast<long long>(s - warmup + 1),
                     static_cast<long long>(checks));
        // What each lazy author claims: its payload and the momentum it goes on with.
        std::map<std::string, agora::Recomputed> claims;
        torch::set_num_threads(author_threads);
        claims["momentum_only"] = momentum_only(scratch, params, state, context);
        const std::vector<agora::SequenceRange> half = {{ranges[0].first, share / 2}};
        if (share >= 2) {
          claims["half_batch"] =
              agora::recompute(train_step, scratch, {params, &state, context, half});
        }
        const std::vector<agora::SequenceRange> other = {
            {static_cast<uint64_t>(s * batch) + 1000003, share}};
        claims["other_data"] =
            agora::recompute(train_step, scratch, {params, &state, context, other});
        claims["stale_params"] =
            agora::recompute(train_step, scratch, {history.front(), &state, context, ranges});
        std::vector<torch::Tensor> perturbed;
        for (const auto& p : params) {
          const double rms = p.pow(2).mean().sqrt().item<double>();
          perturbed.push_back(p + torch::randn_like(p) * (0.01 * rms));
        }
        claims["perturbed_model"] =
            agora::recompute(train_step, scratch, {perturbed, &state, context, ranges});
        if (!previous_payload.empty()) {
          Payload replay = agora::decode_payload(previous_payload);
          replay.step = static_cast<uint64_t>(s);
          claims["replay"].result.contribution.bytes = agora::encode_payload(replay);
          claims["replay"].state_after = state;
        }
        claims["noise"].result.contribution.bytes = noise_payload(
            agora::decode_payload(honest.result.contribution.bytes), static_cast<uint64_t>(s), rng);
        claims["noise"].state_after = state;

        for (const int verifier_threads : {1, 2}) {
          torch::set_num_threads(verifier_threads);
          const auto v0 = std::chrono::steady_clock::now();
          const agora::Recomputed check =
              agora::recompute(train_step, scratch, {params, &state, context, ranges});
          verify_seconds +=
              std::chrono::duration<double>(std::chrono::steady_clock::now() - v0).count();
          const Payload expected = agora::decode_payload(check.result.contribution.bytes);
          const auto record = [&](const std::string& name, const agora::Recomputed& claim) {
            const agora::PayloadAgreement a = agora::compare_payloads(
                agora::decode_payload(claim.result.contribution.bytes), expected);
            figures[name].add(a.overlap(), a.sign_agreement(),
                              agora::relative_state_error(claim.state_after, check.state_after),
                              agora::agrees(a, {}));
          };
          record(
              verifier_threads == author_threads ? "honest_same_threads" : "honest_other_threads",
              honest);
          for (const auto& [name, claim] : claims) record(name, claim);
        }
        if (children) save_check(work, s, context, ranges[0], params, state, honest);
        state_bytes = 0;
        for (const auto& [k, v] : state) state_bytes += v.numel() * v.element_size();
      }
      previous_payload = honest.result.contribution.bytes;
      // The run moves on with the honest contribution.
      author.strategy->load_state(honest.state_after);
      author.strategy->apply(
          context, std::vector<agora::Contribution>{{"author", honest.result.contribution.bytes}});
    }
    std::fprintf(stderr, "\n");
    std::vector<std::string> claim_names = kClaims;
    std::string rest = coretypes;
    size_t insert_at = 2;  // after the in-process honest rows
    while (children && !rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string coretype = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      for (const int threads : {1, 2}) {
        const std::string name = fmt::format("honest_blas_{}_{}t", coretype, threads);
        const std::string command = fmt::format(
            "OPENBLAS_CORETYPE={} OPENBLAS_VERBOSE=0 '{}' --recompute-dir '{}' --child-threads {} "
            "--preset {} --data '{}' --vocab {} --seq-len {} --batch {} --micro-batch {} --topk {} "
            "--one-bit {} --lr {} --warmup {} --checks {}",
            coretype, argv[0], work, threads, preset, data, vocab, seq_len, batch, micro, topk,
            one_bit ? "true" : "false", lr, warmup, checks);
        std::fprintf(stderr, "recomputing under OPENBLAS_CORETYPE=%s, %d thread(s)\n",
                     coretype.c_str(), threads);
        FILE* pipe = popen(command.c_str(), "r");
        if (!pipe) throw agora::Error("could not start " + command);
        char line[4096];
        while (std::fgets(line, sizeof line, pipe)) {
          const nlohmann::json j = nlohmann::json::parse(line);
          figures[name].add(j["overlap"].get<double>(), j["signs"].get<double>(),
                            j["state_error"].get<double>(), j["agrees"].get<bool>());
        }
        if (pclose(pipe) != 0) throw agora::Error("the child verifier failed: " + command);
        claim_names.insert(claim_names.begin() + static_cast<std::ptrdiff_t>(insert_at++), name);
      }
    }

    std::printf(
        "\nverify: %s, %lld of %lld sequences per step, top-k %lld%s, %lld checks after "
        "%lld steps;\nverifier threads 1 and 2, author threads alternating 1 and 2\n\n",
        preset.c_str(), static_cast<long long>(share), static_cast<long long>(batch),
        static_cast<long long>(topk), one_bit ? " one-bit" : "", static_cast<long long>(checks),
        static_cast<long long>(warmup));
    std::printf("%-28s %21s %21s %25s %26s\n", "claim", "overlap min / max", "signs min / max",
                "momentum error min / max", "passed payload/moment/both");
    nlohmann::json rows = nlohmann::json::array();
    for (const std::string& name : claim_names) {
      const auto it = figures.find(name);
      if (it == figures.end()) continue;
      const Figures& f = it->second;
      const auto mm = [](const std::vector<double>& v) {
        return std::pair{*std::min_element(v.begin(), v.end()),
                         *std::max_element(v.begin(), v.end())};
      };
      const auto [o0, o1] = mm(f.overlap);
      const auto [g0, g1] = mm(f.signs);
      const auto [e0, e1] = mm(f.state_error);
      std::printf(
          "%-28s %10.4f / %-8.4f %10.4f / %-8.4f %12.3g / %-10.3g %12lld/%lld/%lld of %zu\n",
          name.c_str(), o0, o1, g0, g1, e0, e1, static_cast<long long>(f.payload_passed),
          static_cast<long long>(f.momentum_passed), static_cast<long long>(f.both_passed),
          f.overlap.size());
      rows.push_back({{"claim", name},
                      {"comparisons", f.overlap.size()},
                      {"overlap_min", o0},
                      {"overlap_median", quantile(f.overlap, 0.5)},
                      {"overlap_max", o1},
                      {"signs_min", g0},
                      {"signs_median", quantile(f.signs, 0.5)},
                      {"signs_max", g1},
                      {"state_error_min", e0},
                      {"state_error_median", quantile(f.state_error, 0.5)},
                      {"state_error_max", e1},
                      {"payload_check_passed", f.payload_passed},
                      {"momentum_check_passed", f.momentum_passed},
                      {"both_passed", f.both_passed}});
    }
    const double per_step = step_seconds / static_cast<double>(warmup + checks);
    const double per_check = verify_seconds / static_cast<double>(2 * checks);
    std::printf(
        "\none step %.1f ms, one recomputation %.1f ms (%.2fx); the momentum a verifier "
        "fetches: %.2f MB\n",
        1e3 * per_step, 1e3 * per_check, per_check / per_step, state_bytes / 1e6);
    if (!json.empty()) {
      const nlohmann::json j = {{"preset", preset},
                                {"sequences_per_step", share},
                                {"batch", batch},
                                {"topk", topk},
                                {"one_bit", one_bit},
                                {"warmup", warmup},
                                {"checks", checks},
                                {"step_seconds", per_step},
                                {"recompute_seconds", per_check},
                                {"state_bytes", state_bytes},
                                {"rows", rows}};
      const fs::path parent = fs::path(json).parent_path();
      if (!parent.empty()) fs::create_directories(parent);
      agora::write_file_atomic(json, j.dump(2));
    }
  } catch (const std::exception& e) {  // agora::Error, and a child's stray line or bad file
    std::fprintf(stderr, "bench_verify: %s\n", e.what());
    return 1;
  }
  return 0;
}
