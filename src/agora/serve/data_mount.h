// DataMount: a member's copy of the run's token folder, fetched from the run as it is needed.
//
// open() asks the server (the coordinator, or an `agora data serve`) for the manifest of the run's
// data hash, keeps it only when its shards hash to that hash (data/data_manifest.h), and lays out
// the cache folder: every shard at its full size, meta.json, and the first chunk of each shard
// (the header a reader checks). Then it mounts itself on the folder (data/chunk_source.h), so
// every reader of the folder, of every role, waits for the chunks it reads: fetched on the first
// read, checked against their hashes, written into the folder. Meanwhile a background thread
// fetches the chunks nobody asked for yet (the prefetch), demanded chunks first, so that after a
// while the member holds the whole folder and training never waits.
//
// Other members serve what they hold (a copy on disk, or what they fetched) through their own
// servers (peer/peer_server.h): told who they are (set_peers), the mount asks a member first and
// the server only when that member does not hold the chunk, is busy, silent or refuses. A member
// that answers with other bytes is never asked again; so members take load off the server's
// uplink but cannot feed anyone other tokens, nor stall a read for longer than one short wait.
//
// What a member can rely on:
// - Nothing but the run's bytes reaches a reader: a chunk is written only when its BLAKE2b-256 is
//   the manifest's. A server that answers with other bytes is asked again, and a chunk that does
//   not arrive right after `attempts` asks ends the read with an Error naming the server, the
//   shard, the chunk and what went wrong (never a hang, never a hole read as tokens).
// - The cache survives restarts: a folder from an earlier run is rehashed at open(), what matches
//   is kept, and the rest fetched again. A folder holding shards the run does not have is refused
//   (a reader would train on them).
// - Bounded: at most `in_flight` requests wait at once; the folder never exceeds the data's size.
//
// One worker thread owns the connection (ZeroMQ's rule); ensure() is thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agora/net/curve_socket.h"

namespace agora::serve {

struct DataMountOptions {
  std::string endpoint;       // the server, tcp://HOST:PORT
  net::PublicKey server_key;  // its ed25519 key
  std::string data_hash;      // the run's data hash, hex (the run config's [data] hash)
  std::filesystem::path cache_dir;
  double request_seconds = 20;  // an ask unanswered by then is sent again
  int attempts = 5;             // asks of one chunk (unanswered or wrong) before a read fails
  int in_flight = 4;            // chunks asked for at once
  bool prefetch = true;         // fetch the chunks nobody asked for yet, in the background
  double peer_request_seconds = 3;  // a member's answer awaited this long before the server's
  size_t max_peers = 8;             // members asked (connections kept)
  // Progress lines (a fraction of the folder held, the rate); none = quiet.
  std::function<void(const std::string&)> progress;
};

// A member that may serve chunks: where its server listens, and its ed25519 key.
struct DataPeer {
  std::string endpoint;
  net::PublicKey key;
  bool operator==(const DataPeer&) const = default;
};

struct DataMountStats {
  uint64_t chunks = 0, chunks_held = 0;  // in the data; held now
  uint64_t chunks_cached = 0;            // held since open() (an earlier run's cache)
  uint64_t bytes = 0, bytes_fetched = 0;
  uint64_t bytes_from_peers = 0;  // of bytes_fetched: served by other members
  uint64_t refused = 0;           // answers whose bytes were not the run's (members' included)
  uint64_t busy = 0;          // answers asking to wait (the server's rate or queue)
  double waited_seconds = 0;  // readers' time spent waiting for chunks
};

class DataMount {
 public:
  // Throws Error (naming the server, the folder and what to do) when the manifest cannot be had
  // or is not the run's, or the folder cannot be laid out.
  static std::unique_ptr<DataMount> open(const net::Identity& identity, DataMountOptions options);
  ~DataMount();  // unmounts the folder and stops fetching
  DataMount(const DataMount&) = delete;
  DataMount& operator=(const DataMount&) = delete;

  const std::filesystem::path& folder() const;
  DataMountStats stats() const;
  // Waits until the whole folder is held, at most `seconds`; whether it is.
  bool wait_complete(double seconds) const;
  // The members to ask before the server (the newest list replaces the last). Thread-safe.
  void set_peers(std::vector<DataPeer> peers);
  // The bytes of chunk `hash` when this mount holds it: what this member serves the others.
  // Thread-safe.
  std::optional<std::string> held_chunk(const std::string& hash) const;

  class Core;

 private:
  explicit DataMount(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
};

}  // namespace agora::serve
