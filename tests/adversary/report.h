// The adversary's record: one JSON object per line on stdout, one per thing it did, so that the
// integration tests (tests/integration/adversary_test.py) assert on data rather than sentences.
// Every line has "event", "attack" and "finalized" (the steps final when it happened, as far as
// the adversary heard); the rest are the event's figures.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace agora::adversary {

class Report {
 public:
  explicit Report(std::string attack) : attack_(std::move(attack)) {}
  void emit(const std::string& event, nlohmann::json fields = nlohmann::json::object()) const {
    fields["event"] = event;
    fields["attack"] = attack_;
    fields["finalized"] = finalized;
    std::fputs(
        (fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n").c_str(),
        stdout);
    std::fflush(stdout);
  }

 private:
  std::string attack_;

 public:
  uint64_t finalized = 0;  // set by the adversary as steps become final
};

}  // namespace agora::adversary
