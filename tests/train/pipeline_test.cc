// The in-process pipeline (pipeline/simulation.h): its gradients are the whole model's, the
// asynchronous schedule without delays is the synchronous one, stale stages run the stashed
// version of their weights, and the subspace constraint keeps every boundary exact.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/core/error.h"
#include "agora/data/sampler.h"
#include "agora/pipeline/partition.h"
#include "agora/pipeline/simulation.h"
#include "agora/train/batches.h"
#include "agora/train/loss.h"

namespace agora {
namespace {

const std::string kData = AGORA_DATA_DIR "/tokens/sp8k";

RunConfig config(int64_t stages, const std::string& schedule, const std::string& extra = "",
                 int64_t micro_batches = 2) {
  RunConfig run = RunConfig::parse(fmt::format(R"(
seed = 11
[model]
preset = "tiny"
vocab_size = 8192
num_layers = 4
tie_embeddings = false
[data]
dir = "{}"
seq_len = 32
[train]
steps = 4
batch_size = 4
micro_batch_size = 4
device = "cpu"
threads = 1
[schedule]
kind = "constant"
warmup_steps = 0
[optimizer]
lr = 1e-2
[pipeline]
stages = {}
schedule = "{}"
micro_batches = {}
{}
)",
                                               kData, stages, schedule, micro_batches, extra),
                                   "test");
  return run;
}

Sampler train_data(const RunConfig& run) {
  return Sampler::from_directory(run.data.dir, "train", static_cast<uint32_t>(run.data.seq_len),
                                 run.seed);
}

// The mean loss of step `step`'s sequences under `model`, in `pieces` equal micro-batches, with
// gradients accumulated exactly as the pipeline weights them.
double whole_model_loss(Llama& model, const RunConfig& run, int64_t step, int64_t pieces,
                        bool backward) {
  const Sampler data = train_data(run);
  const int64_t B = run.train.batch_size, count = B / pieces;
  double loss = 0;
  for (int64_t j = 0; j < pieces; ++j) {
    const torch::Tensor windows =
        read_sequences(data, static_cast<uint64_t>(step * B + j * count), count);
    const torch::Tensor l =
        window_loss(model, windows, 1) / (static_cast<double>(B) / static_cast<double>(count));
    if (backward) l.backward();
    loss += l.item<double>();
  }
  return loss;
}

std::map<std::string, torch::Tensor> by_name(const PipelineSimulation& sim) {
  std::map<std::string, torch::Tensor> out;
  for (const StageModel& stage : sim.stages()) {
    for (const NamedParameter& p : stage->hf_parameters()) out[p.name] = p.tensor;
  }
  return out;
}

TEST(Pipeline, GpipeGradientsAreTheWholeModels) {
  const RunConfig run = config(3, "gpipe");
  PipelineSimulation sim(run, torch::kCPU);
  const double pipeline_loss = sim.gradients(0);

  Llama whole = sim.assemble();
  const double whole_loss = whole_model_loss(whole, run, 0, run.pipeline.micro_batches, true);
  EXPECT_NEAR(pipeline_loss, whole_loss, 1e-5 * std::abs(whole_loss));

  const auto stages = by_name(sim);
  const auto params = whole->named_parameters();
  ASSERT_EQ(stages.size(), params.size()) << "the stages hold every parameter once";
  for (const auto& item : params) {
    const torch::Tensor& mine = stages.at(item.key()).grad();
    const torch::Tensor& reference = item.value().grad();
    ASSERT_TRUE(mine.defined()) << item.key();
    const double scale = reference.abs().max().item<double>() + 1e-12;
    EXPECT_LT((mine - reference).abs().max().item<double>() / scale, 1e-4) << item.key();
  }
}

TEST(Pipeline, StagesHoldTheirShareOfTheModel) {
  const RunConfig run = config(4, "gpipe");
  PipelineSimulation sim(run, torch::kCPU);
  int64_t total = 0;
  for (size_t i = 0; i < sim.stages().size(); ++i) {
    int64_t held = 0;
    for (const torch::Tensor& p : sim.stages()[i]->parameters()) held += p.numel();
    EXPECT_EQ(held, sim.spans()[i].parameters);
    total += held;
  }
  EXPECT_EQ(total, run.model.num_parameters());
}

TEST(Pipeline, AsyncWithoutDelaysIsGpipeWithOneMicroBatch) {
  const RunConfig sync = config(3, "gpipe", "", 1);
  const RunConfig async = config(3, "async");
  PipelineSimulation a(sync, torch::kCPU);
  PipelineSimulation b(async, torch::kCPU, PipelineSimulation::Options{.stale = false});
  for (int64_t step = 0; step < 3; ++step) {
    const PipelineStepReport ra = a.step(step), rb = b.step(step);
    EXPECT_EQ(ra.loss, rb.loss) << "step " << step;
  }
  const auto pa = by_name(a), pb = by_name(b);
  for (const auto& [name, tensor] : pa) EXPECT_TRUE(torch::equal(tensor, pb.at(name))) << name;
}

TEST(Pipeline, StaleStagesComputeWithTheStashedVersion) {
  // Two stages: stage 0 is one update stale. Step 1's loss must be that of stage 0's initial
  // weights (version 0) followed by stage 1's weights after one update (version 1).
  const RunConfig run = config(2, "async");
  PipelineSimulation stale(run, torch::kCPU);
  PipelineSimulation fresh(run, torch::kCPU, PipelineSimulation::Options{.stale = false});
  const PipelineSimulation initial(run, torch::kCPU);
  EXPECT_EQ(stale.step(0).loss, fresh.step(0).loss) << "step 0 has nothing stale yet";
  const double stale_loss = stale.step(1).loss;

  Llama mixed = fresh.assemble();         // stage 1 at version 1
  initial.stages()[0]->copy_into(mixed);  // stage 0 at version 0
  double expected = 0;
  {
    torch::NoGradGuard no_grad;
    expected = whole_model_loss(mixed, run, 1, 1, false);
  }
  EXPECT_NEAR(stale_loss, expected, 1e-5 * std::abs(expected));
  const double all_fresh = fresh.step(1).loss;
  EXPECT_GT(std::abs(stale_loss - all_fresh), 1e-6) << "the delay must change the numbers";
}

TEST(Pipeline, SubspaceKeepsEveryBoundaryInTheSubspace) {
  const RunConfig run = config(3, "async", "codec = \"subspace\"\nsubspace_rank = 16");
  PipelineSimulation sim(run, torch::kCPU);
  for (int64_t step = 0; step < 3; ++step) sim.step(step);
  const SubspaceBasis& basis = *sim.subspace();

  // The matrices that write into the residual stream lie in span(U) on every stage but the last.
  for (size_t i = 0; i + 1 < sim.stages().size(); ++i) {
    for (const NamedParameter& p : sim.stages()[i]->hf_parameters()) {
      torch::Tensor w = p.tensor.detach();
      torch::Tensor off;
      if (p.name.find("o_proj") != std::string::npos ||
          p.name.find("down_proj") != std::string::npos) {
        off = w - torch::matmul(basis.basis(), torch::matmul(basis.basis().t(), w));
      } else if (p.name == "model.embed_tokens.weight") {
        off = w - basis.project(w);
      } else {
        continue;
      }
      EXPECT_LT(off.norm().item<double>(), 1e-5 * w.norm().item<double>() + 1e-7) << p.name;
    }
  }
  // Each boundary's activations are E_fix[token] + U c, so the codec rebuilds them exactly.
  const Sampler data = train_data(run);
  const torch::Tensor windows = read_sequences(data, 0, 2);
  const torch::Tensor tokens = windows.narrow(1, 0, run.data.seq_len);
  torch::NoGradGuard no_grad;
  torch::Tensor x = sim.stages()[0]->forward(tokens);
  BoundaryCoder coder(run.pipeline, run.model.hidden_size, &basis);
  for (size_t i = 0; i + 1 < sim.stages().size(); ++i) {
    const torch::Tensor residual = x - basis.fixed_embedding().index({tokens});
    EXPECT_LT((residual - basis.project(residual)).norm().item<double>(),
              1e-5 * residual.norm().item<double>())
        << "stage " << i;
    const BoundaryPosition at{0, 0, static_cast<uint32_t>(i)};
    const torch::Tensor rebuilt =
        coder.decode_forward(coder.encode_forward(at, x, tokens), at, tokens, torch::kCPU);
    EXPECT_LT((rebuilt - x).abs().max().item<double>(), 1e-5 * x.abs().max().item<double>());
    x = sim.stages()[i + 1]->forward(x);
  }
}

TEST(Pipeline, SubspaceCheckpointComputesWhatTheStagesCompute) {
  const RunConfig run = config(3, "gpipe", "codec = \"subspace\"\nsubspace_rank = 8");
  PipelineSimulation sim(run, torch::kCPU);
  sim.step(0);
  sim.step(1);
  const double pipeline_loss = sim.gradients(2);
  Llama whole = sim.assemble();
  torch::NoGradGuard no_grad;
  const double whole_loss = whole_model_loss(whole, run, 2, run.pipeline.micro_batches, false);
  EXPECT_NEAR(pipeline_loss, whole_loss, 1e-5 * std::abs(whole_loss));
}

TEST(Pipeline, CompressedBoundariesCarryFewerBytes) {
  std::map<std::string, int64_t> forward;
  for (const char* codec : {"float32", "bfloat16", "int8"}) {
    PipelineSimulation sim(config(2, "gpipe", fmt::format("codec = \"{}\"", codec)), torch::kCPU);
    forward[codec] = sim.step(0).forward_bytes;
  }
  PipelineSimulation sub(config(2, "gpipe", "codec = \"subspace\"\nsubspace_rank = 8"),
                         torch::kCPU);
  const PipelineStepReport r = sub.step(0);
  const int64_t tokens = 4 * 32, d = 64;
  // Headers are fixed; the bodies are exact: 4, 2 and 1 + 4/64 bytes a value, 8 floats + an id.
  EXPECT_GE(forward["float32"], tokens * d * 4);
  EXPECT_LT(forward["float32"], tokens * d * 4 + 512);
  EXPECT_LT(forward["bfloat16"], tokens * d * 2 + 512);
  EXPECT_LT(forward["int8"], tokens * d + tokens * d / 64 * 4 + 512);
  EXPECT_LT(r.forward_bytes, tokens * (8 * 4 + 4) + 512);
  EXPECT_LT(r.backward_bytes, tokens * 8 * 4 + 512);
}

TEST(Pipeline, ColumnsSendTheLargestColumnsAndTheirExactGradient) {
  const RunConfig run = config(2, "gpipe", "codec = \"columns\"\ncolumns_kept = 0.25");
  const int64_t d = run.model.hidden_size, k = d / 4;
  BoundaryCoder coder(run.pipeline, d, nullptr);
  torch::manual_seed(3);
  // Columns 5, 9, ... made large: they are the ones kept, whatever the others hold.
  torch::Tensor x = torch::randn({2, 8, d});
  std::vector<int64_t> big;
  for (int64_t c = 5; static_cast<int64_t>(big.size()) < k; c += 3) big.push_back(c);
  for (const int64_t c : big) x.select(2, c).mul_(10);
  const torch::Tensor tokens = torch::zeros({2, 8}, torch::kInt64);
  const BoundaryPosition at{0, 0, 0};
  const std::string bytes = coder.encode_forward(at, x, tokens);
  EXPECT_EQ(bytes.size(), kBoundaryHeaderBytes + 4 * k + 2 * 8 * k * 4);
  const torch::Tensor in = coder.decode_forward(bytes, at, tokens, torch::kCPU);
  const torch::Tensor kept = torch::tensor(big);
  torch::Tensor mask = torch::zeros({d});
  mask.index_fill_(0, kept, 1);
  EXPECT_TRUE(torch::equal(in, x * mask)) << "the kept columns exactly, zeros elsewhere";
  // Backward: the gradient of the kept columns, which is the masked forward's exact gradient.
  const torch::Tensor g = torch::randn({2, 8, d});
  const BoundaryPosition back{0, 0, 1};
  const torch::Tensor received =
      coder.decode_backward(coder.encode_backward(back, g, in), back, 2, 8, torch::kCPU);
  EXPECT_TRUE(torch::equal(received, g * mask));
  // A forward with fewer nonzero columns than k sends only those (all-zero columns never).
  torch::Tensor sparse = torch::zeros({2, 8, d});
  sparse.select(2, 7).fill_(1);
  const BoundaryMessage m = decode_boundary(coder.encode_forward(at, sparse, tokens));
  EXPECT_EQ(m.columns, std::vector<uint32_t>{7});
  EXPECT_TRUE(torch::equal(
      coder.decode_forward(coder.encode_forward(at, sparse, tokens), at, tokens, torch::kCPU),
      sparse));
  // The stages' in-process training runs with it (the gradient flows through the mask).
  PipelineSimulation sim(run, torch::kCPU);
  const PipelineStepReport r = sim.step(0);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_LT(r.forward_bytes, 4 * 32 * (k * 4) + 2 * (36 + 4 * k) + 1);
}

TEST(Pipeline, ConfigRejectsWhatAPipelineCannotRun) {
  EXPECT_THROW(config(5, "gpipe"), Error) << "more stages than layers";
  EXPECT_THROW(config(2, "gpipe", "codec = \"subspace\""), Error) << "no rank";
  EXPECT_THROW(config(2, "gpipe", "subspace_rank = 4"), Error) << "rank without subspace";
  EXPECT_THROW(config(2, "gpipe", "codec = \"columns\""), Error) << "columns without a fraction";
  EXPECT_THROW(config(2, "gpipe", "columns_kept = 0.5"), Error) << "a fraction without columns";
  EXPECT_THROW(config(2, "gpipe", "", 3), Error) << "4 sequences in 3";
  EXPECT_THROW(RunConfig::parse("[model]\npreset = \"tiny\"\n[pipeline]\nstages = 2\n", "test"),
               Error)
      << "tied embeddings";
}

}  // namespace
}  // namespace agora
