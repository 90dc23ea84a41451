#include "agora/rl/sampling.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

#include "agora/core/error.h"
#include "agora/rl/seeded_draw.h"

namespace agora {
namespace {

// Log-softmax over the real vocabulary at this temperature (padded rows get -inf).
torch::Tensor tempered_logprobs(torch::Tensor logits, int64_t vocab_size, double temperature) {
  logits = logits.to(torch::kFloat32);
  const int64_t padded = logits.size(-1);
  if (padded > vocab_size) {
    logits = torch::cat({logits.narrow(-1, 0, vocab_size),
                         torch::full_like(logits.narrow(-1, vocab_size, padded - vocab_size),
                                          -std::numeric_limits<float>::infinity())},
                        -1);
  }
  if (temperature > 0) logits = logits / temperature;
  return torch::log_softmax(logits, -1);
}

// Inverse transform sampling of each row by its slot's uniform draw (seeded_draw.h): the least
// token whose cumulative probability exceeds u. Cumulated in float64, as the learner's check is.
torch::Tensor seeded_tokens(const torch::Tensor& logp, const std::vector<uint64_t>& seeds,
                            int64_t position) {
  const torch::Tensor cdf = logp.exp().to(torch::kFloat64).cumsum(-1).contiguous();
  const auto c = cdf.accessor<double, 2>();
  const int64_t vocab = cdf.size(1);
  torch::Tensor out = torch::empty({cdf.size(0)}, torch::kInt64);
  auto o = out.accessor<int64_t, 1>();
  for (int64_t i = 0; i < cdf.size(0); ++i) {
    const double u = slot_uniform(seeds[static_cast<size_t>(i)], static_cast<uint32_t>(position));
    int64_t lo = 0, hi = vocab - 1;  // the least j with c[j] > u (the last when rounding ends
    while (lo < hi) {                // the sum below u)
      const int64_t mid = (lo + hi) / 2;
      if (c[i][mid] > u) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    // Never a token of probability 0 (a padded one, or one the softmax underflowed).
    while (lo > 0 && c[i][lo] == c[i][lo - 1]) --lo;
    o[i] = lo;
  }
  return out;
}

}  // namespace

std::vector<TokenId> rl_context(TokenId eot_id, std::span<const TokenId> prompt) {
  std::vector<TokenId> context{eot_id};
  context.insert(context.end(), prompt.begin(), prompt.end());
  return context;
}

std::vector<Completion> sample_completions(Llama& model, TokenId eot_id,
                                           std::span<const TokenId> prompt,
                                           const CompletionSampling& options) {
  if (options.count < 1) fail("rl group size {} is invalid (allowed: >= 1)", options.count);
  if (options.max_new_tokens < 1) {
    fail("rl max new tokens {} is invalid (allowed: >= 1)", options.max_new_tokens);
  }
  if (options.temperature < 0) {
    fail("rl temperature {} is invalid (allowed: >= 0; 0 = greedy)", options.temperature);
  }
  const ModelConfig& config = model->config();
  const std::vector<TokenId> context = rl_context(eot_id, prompt);
  const auto length = static_cast<int64_t>(context.size());
  if (length + options.max_new_tokens > config.max_seq_len) {
    fail("an rl prompt of {} tokens plus {} new ones exceeds the model's context of {}", length,
         options.max_new_tokens, config.max_seq_len);
  }
  if (!options.row_seeds.empty() &&
      static_cast<int64_t>(options.row_seeds.size()) != options.count) {
    fail("{} row seeds for {} completions (expected one per completion)", options.row_seeds.size(),
         options.count);
  }
  const torch::Device device = model->parameters().front().device();
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;

  const int64_t n = options.count;
  std::vector<int64_t> ids(context.begin(), context.end());
  torch::Tensor input =
      torch::tensor(ids, torch::kInt64).unsqueeze(0).expand({n, length}).contiguous().to(device);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  KvCache cache;
  std::vector<Completion> out(static_cast<size_t>(n));
  int64_t open = n;
  for (int64_t step = 0; step < options.max_new_tokens && open > 0; ++step) {
    const torch::Tensor logits = model->forward(input, &cache).select(1, -1).to(torch::kCPU);
    const torch::Tensor logp = tempered_logprobs(logits, config.vocab_size, options.temperature);
    const torch::Tensor next = options.temperature == 0 ? logp.argmax(-1)
                               : !options.row_seeds.empty()
                                   ? seeded_tokens(logp, options.row_seeds, step)
                                   : torch::multinomial(logp.exp(), 1, false, generator).view(-1);
    const torch::Tensor chosen = logp.gather(1, next.view({n, 1})).view(-1);
    const auto next_a = next.accessor<int64_t, 1>();
    const auto chosen_a = chosen.accessor<float, 1>();
    for (int64_t i = 0; i < n; ++i) {
      Completion& c = out[static_cast<size_t>(i)];
      if (c.ended) continue;  // finished rows keep a place in the batch; their tokens are dropped
      c.tokens.push_back(static_cast<TokenId>(next_a[i]));
      c.logprobs.push_back(chosen_a[i]);
      if (next_a[i] == eot_id) {
        c.ended = true;
        --open;
      }
    }
    input = next.view({n, 1}).to(device);
  }
  model->train(was_training);
  return out;
}

torch::Tensor completion_layout(const std::vector<std::vector<TokenId>>& prompts,
                                const std::vector<std::vector<float>>& values, int64_t width) {
  torch::Tensor out = torch::zeros({static_cast<int64_t>(values.size()), width}, torch::kFloat32);
  auto a = out.accessor<float, 2>();
  for (size_t i = 0; i < values.size(); ++i) {
    // Token t + 1 of the row (context = eot + prompt) is predicted at t; the completion's first
    // token sits at context index 1 + prompt length, so its prediction is at prompt length.
    const size_t start = prompts[i].size();
    for (size_t j = 0; j < values[i].size(); ++j)
      a[i][static_cast<int64_t>(start + j)] = values[i][j];
  }
  return out;
}

ScoredBatch completion_logprobs(Llama& model, TokenId eot_id,
                                const std::vector<std::vector<TokenId>>& prompts,
                                const std::vector<std::vector<TokenId>>& completions,
                                double temperature, torch::Tensor* distribution) {
  if (prompts.size() != completions.size() || prompts.empty()) {
    fail("completion_logprobs: {} prompts for {} completions (expected the same, at least one)",
         prompts.size(), completions.size());
  }
  const ModelConfig& config = model->config();
  const auto n = static_cast<int64_t>(prompts.size());
  int64_t length = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    length = std::max<int64_t>(length, 1 + prompts[i].size() + completions[i].size());
  }
  if (length > config.max_seq_len) {
    fail("an rl row of {} tokens exceeds the model's context of {}", length, config.max_seq_len);
  }
  torch::Tensor tokens = torch::full({n, length}, static_cast<int64_t>(eot_id), torch::kInt64);
  std::vector<std::vector<float>> ones(prompts.size());
  auto t = tokens.accessor<int64_t, 2>();
  for (size_t i = 0; i < prompts.size(); ++i) {
    int64_t k = 1;
    for (TokenId id : prompts[i]) t[static_cast<int64_t>(i)][k++] = id;
    for (TokenId id : completions[i]) t[static_cast<int64_t>(i)][k++] = id;
    ones[i].assign(completions[i].size(), 1.0f);
  }
  const torch::Device device = model->parameters().front().device();
  tokens = tokens.to(device);
  const torch::Tensor logits = model->forward(tokens.narrow(1, 0, length - 1));
  const torch::Tensor all = tempered_logprobs(logits, config.vocab_size, temperature);
  if (distribution) *distribution = all;
  const torch::Tensor logp = all.gather(2, tokens.narrow(1, 1, length - 1).unsqueeze(2)).squeeze(2);
  ScoredBatch out;
  out.logp = logp;
  out.mask = completion_layout(prompts, ones, length - 1).to(device);
  return out;
}

std::vector<float> teacher_forced_logprobs(Llama& model, TokenId eot_id,
                                           const std::vector<TokenId>& prompt,
                                           const std::vector<TokenId>& completion,
                                           double temperature) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const ScoredBatch scored =
      completion_logprobs(model, eot_id, {prompt}, {completion}, temperature);
  model->train(was_training);
  const torch::Tensor row =
      scored.logp[0]
          .narrow(0, static_cast<int64_t>(prompt.size()), static_cast<int64_t>(completion.size()))
          .to(torch::kCPU)
          .contiguous();
  return {row.data_ptr<float>(), row.data_ptr<float>() + row.numel()};
}

}  // namespace agora
