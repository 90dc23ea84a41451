#include "agora/coord/admit_batch.h"

#include <map>

namespace agora::coord {

void coalesce_admits(std::vector<Outgoing>& send) {
  std::map<PublicKey, size_t> first;
  std::vector<Outgoing> out;
  out.reserve(send.size());
  for (Outgoing& o : send) {
    if (o.message.has_admit()) {
      auto [it, fresh] = first.emplace(o.to, out.size());
      if (!fresh) {
        auto* joining = out[it->second].message.mutable_admit()->mutable_joining();
        for (const wire::Member& m : o.message.admit().joining()) *joining->Add() = m;
        continue;
      }
    }
    out.push_back(std::move(o));
  }
  send = std::move(out);
}

}  // namespace agora::coord
