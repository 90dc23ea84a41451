// recompute(): a verifier's recomputation of a committed step is the author's contribution, bit for
// bit on the same machine and thread count, and a lazy claim does not pass for it.
#include "agora/train/recompute.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "agora/config/run_config.h"
#include "agora/core/error.h"
#include "agora/optim/payload.h"
#include "agora/optim/payload_agreement.h"

namespace agora {
namespace {

const std::string kData = AGORA_DATA_DIR "/tokens/sp8k";
using State = std::map<std::string, torch::Tensor>;

RunConfig config() {
  return RunConfig::parse(fmt::format(R"(
seed = 5
[model]
preset = "tiny"
vocab_size = 8192
[data]
dir = "{}"
seq_len = 32
[train]
steps = 20
batch_size = 8
micro_batch_size = 2
device = "cpu"
threads = 1
[schedule]
kind = "constant"
warmup_steps = 1
[optimizer]
name = "demo"
lr = 1e-2
[demo]
topk = 8
one_bit = true
)",
                                      kData),
                          "test");
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& v) {
  std::vector<torch::Tensor> out;
  for (const auto& t : v) out.push_back(t.detach().clone());
  return out;
}

State copies(const State& s) {
  State out;
  for (const auto& [k, v] : s) out[k] = v.clone();
  return out;
}

class RecomputeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kData + "/meta.json"))
        << kData << " is missing: run 'make data' (make test does it)";
    torch::set_num_threads(1);
    // A few steps first, so the momentum carries history, as it does mid-run.
    for (int64_t s = 0; s < 5; ++s) {
      const StepContext context{s, config_.learning_rate(s), 4};
      const std::vector<SequenceRange> ranges = {{static_cast<uint64_t>(s * 8), 2}};
      const StepResult r = step_.run(author_, context, ranges);
      author_.strategy->apply(context, std::vector<Contribution>{{"a", r.contribution.bytes}});
    }
  }

  RunConfig config_ = config();
  torch::Device cpu_{torch::kCPU};
  Learner author_ = Learner::create(config_, cpu_);
  Learner scratch_ = Learner::create(config_, cpu_);
  TrainStep step_{config_, cpu_};
  const StepContext context_{5, config_.learning_rate(5), 4};
  const std::vector<SequenceRange> ranges_ = {{40, 2}};
};

TEST_F(RecomputeTest, IsTheAuthorsContributionBitForBit) {
  const std::vector<torch::Tensor> params = copies(author_.params);
  const State before = copies(author_.strategy->state());
  const StepResult sent = step_.run(author_, context_, ranges_);
  const State after = copies(author_.strategy->state());

  const Recomputed again = recompute(step_, scratch_, {params, &before, context_, ranges_});
  EXPECT_EQ(again.result.contribution.bytes, sent.contribution.bytes);
  EXPECT_EQ(relative_state_error(after, again.state_after), 0.0);
  const PayloadAgreement a = compare_payloads(decode_payload(sent.contribution.bytes),
                                              decode_payload(again.result.contribution.bytes));
  EXPECT_TRUE(a.identical);
  EXPECT_TRUE(agrees(a, {}));
}

TEST_F(RecomputeTest, ALazyClaimIsFarInMomentumOrSelections) {
  const std::vector<torch::Tensor> params = copies(author_.params);
  const State before = copies(author_.strategy->state());
  const Recomputed honest = recompute(step_, scratch_, {params, &before, context_, ranges_});

  // Other sequences than the assigned ones: other selections, another momentum.
  const std::vector<SequenceRange> other = {{4000, 2}};
  const Recomputed lazy = recompute(step_, scratch_, {params, &before, context_, other});
  const PayloadAgreement a = compare_payloads(decode_payload(lazy.result.contribution.bytes),
                                              decode_payload(honest.result.contribution.bytes));
  EXPECT_FALSE(a.identical);
  EXPECT_FALSE(agrees(a, {.min_overlap = 0.99, .min_sign_agreement = 0.99})) << describe(a);
  EXPECT_GT(relative_state_error(lazy.state_after, honest.state_after), 1e-3);
}

TEST_F(RecomputeTest, RefusesInputsThatDoNotFitTheModel) {
  std::vector<torch::Tensor> params = copies(author_.params);
  const State before = copies(author_.strategy->state());
  EXPECT_THROW(recompute(step_, scratch_, {params, nullptr, context_, ranges_}), Error);
  std::vector<torch::Tensor> fewer(params.begin(), params.end() - 1);
  EXPECT_THROW(recompute(step_, scratch_, {fewer, &before, context_, ranges_}), Error);
  params[0] = torch::zeros({3});
  EXPECT_THROW(recompute(step_, scratch_, {params, &before, context_, ranges_}), Error);
  State partial = before;
  partial.erase(partial.begin());
  EXPECT_THROW(recompute(step_, scratch_, {copies(author_.params), &partial, context_, ranges_}),
               Error);
  EXPECT_THROW(relative_state_error(before, partial), Error);
}

}  // namespace
}  // namespace agora
