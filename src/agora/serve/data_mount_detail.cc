#include "agora/serve/data_mount_detail.h"

#include <fmt/format.h>

#include "agora/core/error.h"
#include "agora/serve/poll.h"

namespace agora::serve::data_mount_detail {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double now_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

wire::Envelope get_blob(const std::string& hash) {
  wire::Envelope e;
  e.mutable_get_blob()->set_hash(hash);
  return e;
}

// DataService puts the hash asked for first, then its reason; a peer's server names the hash
// alone.
std::pair<std::string, std::string> split_not_found(const std::string& what) {
  if (what.size() == 32) return {what, "not held"};
  if (what.size() > 32 && what[32] == ' ') return {what.substr(0, 32), what.substr(33)};
  return {"", what};
}

DataManifest fetch_manifest(net::Client& client, const DataMountOptions& o,
                            const std::string& root) {
  const Clock::time_point start = Clock::now();
  const double deadline = o.request_seconds * o.attempts;
  double last_sent = -1e9;
  std::string refused;
  while (seconds_since(start) < deadline) {
    if (seconds_since(start) - last_sent >= o.request_seconds) {
      client.send(get_blob(root));
      last_sent = seconds_since(start);
    }
    wait_readable(client.socket(), std::chrono::milliseconds(100));
    while (auto m = client.recv()) {
      if (m->has_blob() && m->blob().hash() == root) {
        DataManifest manifest;
        try {
          manifest = decode_manifest(m->blob().data());
        } catch (const Error& e) {
          fail("the data server at {} sent a manifest agora cannot read: {}", o.endpoint, e.what());
        }
        if (manifest.identity.hash != root) {
          fail(
              "the data server at {} sent a manifest of other data: its shards hash to {}, the "
              "run's data hash is {}; nothing was fetched",
              o.endpoint, manifest.identity.hex(), o.data_hash);
        }
        return manifest;
      }
      if (m->has_not_found()) {
        fail(
            "the server at {} does not serve the run's data {} (it answered: {}); give this "
            "member a copy of the run's token folder with --data DIR",
            o.endpoint, o.data_hash, split_not_found(m->not_found().what()).second);
      }
      if (m->has_refused()) {
        if (!m->refused().may_rejoin()) {
          fail("the data server at {} refused this member: {}", o.endpoint, m->refused().reason());
        }
        refused = m->refused().reason();
      }
    }
  }
  fail("no data manifest from {} within {:.0f} s{}; check that it serves the run's data",
       o.endpoint, deadline, refused.empty() ? "" : fmt::format(" (its last answer: {})", refused));
}

}  // namespace agora::serve::data_mount_detail
