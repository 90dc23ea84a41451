#include "agora/serve/members.h"

#include "agora/core/error.h"

namespace agora::serve {

wire::Envelope refusal(std::string reason, bool may_rejoin) {
  wire::Envelope e;
  e.mutable_refused()->set_reason(std::move(reason));
  e.mutable_refused()->set_may_rejoin(may_rejoin);
  return e;
}

bool proves_key(std::string_view claimed, std::string_view curve_key) {
  if (claimed.size() != net::kKeyBytes) return false;
  try {
    return net::curve_public_of(std::string(claimed)) == curve_key;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace agora::serve
