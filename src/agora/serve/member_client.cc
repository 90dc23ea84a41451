#include "agora/serve/member_client.h"

#include <chrono>

#include "agora/core/error.h"
#include "agora/serve/poll.h"

namespace agora::serve {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

MemberClient::MemberClient(net::Client& client, wire::Envelope hello,
                           std::function<void(const wire::Envelope&)> on_other,
                           std::function<void(const std::string&)> on_rejoin,
                           const std::atomic<bool>* stop)
    : client_(client),
      hello_(std::move(hello)),
      on_other_(std::move(on_other)),
      on_rejoin_(std::move(on_rejoin)),
      stop_(stop) {}

void MemberClient::on_refused(const wire::Refused& refused) {
  const std::string reason = refused.reason().substr(0, 300);
  if (!refused.may_rejoin()) fail("the server refused this member: {}", reason);
  if (seconds_now() - last_hello_ < 1) return;
  if (on_rejoin_) on_rejoin_(reason);
  client_.send(hello_);
  last_hello_ = seconds_now();
}

std::optional<wire::Envelope> MemberClient::wait_for(const Match& want, double seconds) {
  const double until = seconds_now() + seconds;
  while (seconds_now() < until && !(stop_ && stop_->load())) {
    wait_readable(client_.socket(), std::chrono::milliseconds(50));
    while (std::optional<wire::Envelope> m = client_.recv()) {
      if (m->has_refused()) {
        on_refused(m->refused());
      } else if (want(*m)) {
        return m;
      } else if (on_other_) {
        on_other_(*m);
      }
    }
  }
  return std::nullopt;
}

std::optional<wire::Envelope> MemberClient::join(const Match& is_answer, double seconds) {
  const double until = seconds_now() + seconds;
  std::optional<wire::Envelope> answer;
  while (!answer && seconds_now() < until && !(stop_ && stop_->load())) {
    client_.send(hello_);
    last_hello_ = seconds_now();
    answer = wait_for(is_answer, 2.0);
  }
  return answer;
}

}  // namespace agora::serve
