// A contiguous run of sequence ids: ids first .. first + count - 1 of a run's shuffled order
// (data/sampler.h turns an id into tokens). The coordinator hands them out, peers train them.
#pragma once

#include <cstdint>

namespace agora {

struct SequenceRange {
  uint64_t first = 0;
  uint64_t count = 0;
  bool operator==(const SequenceRange&) const = default;
};

}  // namespace agora
