#include "agora/train/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include "agora/core/error.h"

namespace agora {

std::vector<TokenId> generate(Llama& model, TokenId eot_id, std::span<const TokenId> prompt,
                              const SampleOptions& options,
                              const std::function<void(TokenId)>& on_token) {
  if (options.temperature < 0)
    fail("--temperature {} is invalid (allowed: >= 0)", options.temperature);
  if (options.top_k < 0) fail("--top-k {} is invalid (allowed: >= 0; 0 = no cut)", options.top_k);
  if (options.max_new_tokens < 0)
    fail("--tokens {} is invalid (allowed: >= 0)", options.max_new_tokens);
  const ModelConfig& config = model->config();
  const torch::Device device = model->parameters().front().device();
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;

  // The context: end-of-text, then the prompt, cut from the left to the model's context length.
  std::vector<int64_t> context{eot_id};
  context.insert(context.end(), prompt.begin(), prompt.end());
  if (static_cast<int64_t>(context.size()) > config.max_seq_len) {
    context.erase(context.begin(), context.end() - config.max_seq_len);
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  KvCache cache;
  torch::Tensor input = torch::tensor(context, torch::kInt64).unsqueeze(0).to(device);
  std::vector<TokenId> out;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    torch::Tensor logits = model->forward(input, &cache).select(1, -1).squeeze(0);
    logits = logits.to(torch::kFloat32).to(torch::kCPU);
    logits.narrow(0, config.vocab_size, config.padded_vocab_size() - config.vocab_size)
        .fill_(-std::numeric_limits<float>::infinity());
    int64_t next;
    if (options.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / options.temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        const torch::Tensor kth = std::get<0>(logits.topk(options.top_k)).select(0, -1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, 0), 1, false, generator).item<int64_t>();
    }
    if (next == eot_id) break;
    out.push_back(static_cast<TokenId>(next));
    if (on_token) on_token(static_cast<TokenId>(next));
    input = torch::tensor({next}, torch::kInt64).view({1, 1}).to(device);
  }
  model->train(was_training);
  return out;
}

}  // namespace agora
