// Which holder a joiner asks first for each tensor of the parameters it fetches.
//
// A joiner fetches the parameters tensor by tensor from every member that holds them. Spread by
// count, the holder handed both embeddings carried 43% of the small preset's bytes and set the
// fetch's length; spread by bytes, every holder's link carries about the same. The rule is
// longest processing time first: tensors in decreasing size (the caller sorts them), each to
// the holder with the fewest bytes asked of it so far (ties: the lower index). The fetch asks in
// batches of `per_holder` tensors per holder (a server keeps 64 replies waiting per connection
// and drops the rest), so within each batch of per_holder x holders tensors, in order, no holder
// is first for more than per_holder. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace agora::peer {

// For each of `bytes` (tensor sizes, in the order they are asked for), the index of the holder
// asked first, in [0, holders). Throws Error when holders or per_holder is 0.
std::vector<size_t> spread_over_holders(const std::vector<uint64_t>& bytes, size_t holders,
                                        size_t per_holder);

}  // namespace agora::peer
