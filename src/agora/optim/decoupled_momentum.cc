#include "agora/optim/decoupled_momentum.h"

#include <fmt/format.h>

#include <map>
#include <string_view>

#include "agora/core/error.h"
#include "agora/optim/dct.h"
#include "agora/optim/demo_aggregate.h"
#include "agora/optim/influence.h"

namespace agora {
namespace {

std::vector<int64_t> shape_of(const torch::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

}  // namespace

DecoupledMomentum::DecoupledMomentum(std::vector<NamedParameter> params, const DemoOptions& options)
    : options_(options) {
  if (options.beta < 0 || options.beta >= 1) {
    fail("DeMo: beta = {} is invalid (allowed: a number in [0, 1))", options.beta);
  }
  layout_.kind = PayloadKind::kDemo;
  for (NamedParameter& param : params) {
    const std::vector<int64_t> shape = shape_of(param.tensor);
    const ValueType values =
        param.tensor.scalar_type() == torch::kBFloat16 ? ValueType::kBF16 : ValueType::kF32;
    layout_.tensors.push_back(
        demo_tensor_layout(shape, options.chunk, options.topk, options.one_bit, values));
    Slot slot;
    slot.geometry = chunk_geometry(shape, options.chunk, options.topk);
    slot.delta = torch::zeros(param.tensor.sizes(),
                              param.tensor.options().dtype(torch::kFloat32).requires_grad(false));
    slot.param = std::move(param);
    slots_.push_back(std::move(slot));
  }
  decoded_ = std::make_shared<DecodedPayloads>(layout_, kDecodedPayloadBytes);
}

void DecoupledMomentum::share_decoded_payloads(std::shared_ptr<DecodedPayloads> store) {
  if (store == nullptr || store->layout().kind != layout_.kind ||
      store->layout().tensors != layout_.tensors) {
    fail("DeMo: the decoded-payload store given is for another payload layout");
  }
  decoded_ = std::move(store);
}

std::vector<std::string> DecoupledMomentum::warnings() const {
  std::vector<std::string> out;
  for (const Slot& s : slots_) {
    if (auto warning = compression_warning(s.param.name, shape_of(s.param.tensor), options_.chunk,
                                           options_.topk)) {
      out.push_back(*warning);
    }
  }
  return out;
}

void DecoupledMomentum::before_forward(const StepContext&) {
  if (!options_.lookahead || last_lr_ == 0.0) return;
  torch::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    torch::Tensor& p = s.param.tensor;
    s.moved = p.clone();  // restored bit for bit, rather than trusting (p + m) - m == p
    p.sub_(s.delta.sign().to(p.scalar_type()), last_lr_);
  }
}

void DecoupledMomentum::undo_lookahead() {
  torch::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    if (!s.moved.defined()) continue;
    s.param.tensor.copy_(s.moved);
    s.moved = torch::Tensor();
  }
}

Contribution DecoupledMomentum::contribute(const StepContext& context) {
  torch::NoGradGuard no_grad;
  undo_lookahead();
  Payload payload;
  payload.kind = PayloadKind::kDemo;
  payload.step = static_cast<uint64_t>(context.step);
  payload.tensors.reserve(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    const TensorLayout& layout = layout_.tensors[i];
    if (s.pending.defined()) {
      s.delta.sub_(s.pending);
      s.pending = torch::Tensor();
    }
    s.delta.mul_(options_.beta);
    const torch::Tensor& grad = s.param.tensor.grad();
    if (grad.defined()) s.delta.add_(grad.to(torch::kFloat32), context.lr);

    const torch::Tensor coefficients = chunked_dct(s.delta, s.geometry);
    const torch::Tensor selected =
        std::get<1>(coefficients.abs().topk(layout.topk, 1, /*largest=*/true, /*sorted=*/false));
    const torch::Tensor positions = std::get<0>(selected.sort(1));
    const torch::Tensor values = coefficients.gather(1, positions);
    const torch::Tensor own =
        sparse_is_cheaper(layout.topk, s.geometry)
            ? sparse_chunked_idct(positions, values, s.delta.sizes(), s.geometry)
            : chunked_idct(torch::zeros_like(coefficients).scatter_(1, positions, values),
                           s.delta.sizes(), s.geometry);
    if (options_.lookahead) {
      s.pending = own;
    } else {
      s.delta.sub_(own);
    }

    TensorPayload entry;
    entry.layout = layout;
    const torch::Tensor cpu_positions = positions.to(torch::kCPU).contiguous();
    const int64_t* p = cpu_positions.data_ptr<int64_t>();
    entry.positions.assign(p, p + cpu_positions.numel());
    const torch::Tensor cpu_values = values.to(torch::kCPU).contiguous();
    const float* v = cpu_values.data_ptr<float>();
    entry.values.assign(v, v + cpu_values.numel());
    payload.tensors.push_back(std::move(entry));
  }
  last_lr_ = context.lr;
  return {"", encode_payload(payload)};
}

std::vector<Payload> DecoupledMomentum::admit(const StepContext& context,
                                              std::span<const Contribution> contributions,
                                              ApplyReport& report) const {
  std::vector<Payload> payloads;
  // bytes -> the peer that sent them first; views into `contributions`, which outlive the map
  std::map<std::string_view, std::string_view> first_sender;
  for (const Contribution* c : canonical_order(contributions)) {
    const auto [copy, fresh] = first_sender.try_emplace(c->bytes, c->peer);
    if (!fresh) {
      // A copy of another member's contribution counts once: whoever sent it first in the
      // canonical order keeps it (nobody can tell from the bytes who computed it).
      report.refused.push_back({c->peer, fmt::format("it is a copy of the contribution of peer "
                                                     "'{}' (each payload counts once)",
                                                     copy->second)});
      continue;
    }
    try {
      // Kept by decoded_payloads() only for these very bytes: the same as decoding them here.
      std::optional<Payload> kept =
          c->hash.empty() ? std::nullopt : decoded_->take(c->hash, c->bytes);
      if (kept) ++report.predecoded;
      Payload payload = kept ? std::move(*kept) : decode_payload(c->bytes, layout_);
      if (payload.step != static_cast<uint64_t>(context.step)) {
        report.refused.push_back(
            {c->peer, fmt::format("it is for step {} (allowed: step {}, the step applied)",
                                  payload.step, context.step)});
        continue;
      }
      payloads.push_back(std::move(payload));
    } catch (const Error& error) {
      report.refused.push_back({c->peer, error.what()});
    }
  }
  return payloads;
}

ApplyReport DecoupledMomentum::apply(const StepContext& context,
                                     std::span<const Contribution> contributions) {
  torch::NoGradGuard no_grad;
  undo_lookahead();
  ApplyReport report;
  std::vector<Payload> payloads = admit(context, contributions, report);
  decoded_->forget_through(static_cast<uint64_t>(context.step));
  if (payloads.empty()) return report;  // nobody's update was accepted: the step changes nothing
  report.clipped = bound_influence(payloads, options_.max_norm_ratio);

  // Every direction first: a step that is not finite everywhere changes nothing anywhere.
  std::vector<torch::Tensor> directions;
  directions.reserve(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    directions.push_back(aggregate_direction(i, payloads));
    if (!torch::isfinite(directions.back()).all().item<bool>()) {
      report.skipped = true;
      return report;
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    torch::Tensor& p = s.param.tensor;
    torch::Tensor& direction = directions[i];
    direction.sign_();
    if (s.param.decay && options_.weight_decay != 0) {
      p.mul_(1.0 - context.lr * options_.weight_decay);
    }
    p.sub_(direction.to(p.scalar_type()), context.lr);
  }
  return report;
}

torch::Tensor DecoupledMomentum::aggregate_direction(size_t i,
                                                     const std::vector<Payload>& payloads) const {
  const Slot& s = slots_[i];
  const torch::Tensor& p = s.param.tensor;
  const TensorLayout& layout = layout_.tensors[i];
  // Aggregated on the CPU, where the decoded payloads are, then moved to the parameter's device
  // once: float32 adds and divisions round the same everywhere.
  const auto selections = static_cast<int64_t>(payloads.size()) * layout.topk;
  if (sparse_is_cheaper(selections, s.geometry)) {
    const WeightedSelections w = weighted_selections(payloads, i, layout);
    return sparse_chunked_idct(w.positions.to(p.device()), w.weights.to(p.device()), p.sizes(),
                               s.geometry);
  }
  return chunked_idct(mean_coefficients(payloads, i, layout).to(p.device()), p.sizes(), s.geometry);
}

std::map<std::string, torch::Tensor> DecoupledMomentum::state() const {
  std::map<std::string, torch::Tensor> out;
  for (const Slot& s : slots_) {
    out["delta." + s.param.name] = s.delta;
    if (s.pending.defined()) out["pending." + s.param.name] = s.pending;
  }
  if (options_.lookahead) out["lookahead_lr"] = torch::tensor(last_lr_, torch::kFloat64);
  return out;
}

void DecoupledMomentum::load_state(const std::map<std::string, torch::Tensor>& state) {
  torch::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    const auto delta = state.find("delta." + s.param.name);
    if (delta == state.end()) fail("DeMo state has no momentum for {}", s.param.name);
    if (!delta->second.sizes().equals(s.delta.sizes())) {
      fail("DeMo state for {} has shape {} but the parameter has {}", s.param.name,
           c10::str(delta->second.sizes()), c10::str(s.delta.sizes()));
    }
    s.delta.copy_(delta->second);
    const auto pending = state.find("pending." + s.param.name);
    s.pending = pending == state.end() ? torch::Tensor() : pending->second.to(s.delta.options());
  }
  const auto lr = state.find("lookahead_lr");
  last_lr_ = lr == state.end() ? 0.0 : lr->second.item<double>();
}

}  // namespace agora
