// Data from the run over real CURVE sockets: a member with an empty cache folder reads the same
// tokens as one with the folder on disk (serve/data_service.h answering serve/data_mount.h), and
// a server that lies, about a chunk or about the manifest, is caught by the hashes: the read
// fails with the reason and nothing it sent is ever read as tokens.
#include "agora/serve/data_mount.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <future>
#include <thread>

#include "agora/core/file.h"
#include "agora/core/hex.h"
#include "agora/data/sampler.h"
#include "agora/data/shard.h"
#include "agora/net/allowlist.h"
#include "agora/serve/data_server.h"
#include "agora/serve/data_service.h"
#include "agora/serve/poll.h"
#include "test_support.h"

namespace agora::serve {
namespace {
namespace fs = std::filesystem;

net::Identity identity(uint8_t seed) {
  return net::Identity::from_seed(std::string(32, static_cast<char>(seed)));
}

// A data server on loopback, on a thread of its own. `lie` may rewrite a reply before it goes.
class TestDataServer {
 public:
  using Lie = std::function<void(wire::Envelope&)>;
  TestDataServer(const fs::path& dir, DataLimits limits = {}, Lie lie = {})
      : service_(dir, limits),
        server_(context_, id_, "tcp://127.0.0.1:*", net::DecodeLimits{}),
        lie_(std::move(lie)),
        thread_([this] { serve(); }) {}
  ~TestDataServer() { stop(); }
  // Stops serving; the service's counters may be read from then on.
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const DataService::Counters& counters() const { return service_.counters(); }
  std::string endpoint() const { return server_.bound_endpoint(); }
  const net::PublicKey& key() const { return id_.public_key(); }
  std::string hex() const { return service_.hex(); }

 private:
  void serve() {
    while (!done_) {
      wait_readable(server_.socket(), std::chrono::milliseconds(5));
      drain(server_, {}, [&](const net::Incoming& in) {
        if (!in.message.has_get_blob()) return;
        const double now =
            std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
                .count();
        if (lie_ && service_.holds(in.message.get_blob())) {
          // The honest answer, rewritten: what a lying server would send.
          wire::Envelope reply;
          reply.mutable_get_blob()->CopyFrom(in.message.get_blob());
          lie_(reply);
          server_.send(in.route, reply);
          return;
        }
        if (!service_.answer(server_, in.curve_key, in.route, in.message.get_blob(), now)) {
          wire::Envelope reply;
          reply.mutable_not_found()->set_what("not held here");
          server_.send(in.route, reply);
        }
      });
    }
  }

  DataService service_;
  net::Context context_;
  net::Identity id_ = identity(1);
  net::Server server_;
  Lie lie_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

class DataMountTest : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    source_ = dir_ / "source";
    fs::create_directories(source_);
    // 1.5 M tokens: three chunks, the last one short; and a val shard of one chunk.
    std::vector<TokenId> tokens(1'500'000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>((i * 7919) % 50000);
    write_shard(source_ / "train_000000.bin", tokens, 1);
    tokens.resize(5000);
    write_shard(source_ / "val_000000.bin", tokens, 1);
    write_file_atomic(source_ / "meta.json", R"({"vocab_size": 50000})");
  }

  DataMountOptions options(const TestDataServer& server, const std::string& hash) {
    DataMountOptions o;
    o.endpoint = server.endpoint();
    o.server_key = server.key();
    o.data_hash = hash;
    o.cache_dir = dir_ / "cache";
    o.request_seconds = 2;
    o.attempts = 2;
    return o;
  }

  fs::path source_;
  net::Identity member_ = identity(2);
};

TEST_F(DataMountTest, AnEmptyCacheReadsWhatTheFolderHolds) {
  TestDataServer server(source_);
  DataMountOptions o = options(server, server.hex());
  o.prefetch = false;  // every chunk fetched by a read
  auto mount = DataMount::open(member_, o);
  EXPECT_EQ(read_file(o.cache_dir / "meta.json"), read_file(source_ / "meta.json"));
  const Sampler local = Sampler::from_directory(source_, "train", 64, 7);
  const Sampler fetched = Sampler::from_directory(o.cache_dir, "train", 64, 7);
  ASSERT_EQ(fetched.windows_per_epoch(), local.windows_per_epoch());
  std::vector<TokenId> a(local.window_tokens()), b(local.window_tokens());
  for (uint64_t q = 0; q < 2000; q += 13) {
    local.read(q, a.data());
    fetched.read(q, b.data());
    ASSERT_EQ(a, b) << "sequence " << q;
  }
  const DataMountStats s = mount->stats();
  EXPECT_EQ(s.chunks, 4u);
  EXPECT_GT(s.bytes_fetched, 0u);
  EXPECT_EQ(s.refused, 0u);

  // Another mount over the same folder keeps what was fetched: nothing comes twice.
  mount.reset();
  auto again = DataMount::open(member_, o);
  EXPECT_EQ(again->stats().chunks_cached, s.chunks_held);
}

TEST_F(DataMountTest, PrefetchFillsTheWholeFolderWithinTheServersRate) {
  // 4 MiB/s with a 2 MiB burst: the server answers some asks "busy", the member waits and asks
  // again, and still ends with every chunk.
  DataLimits limits;
  limits.bytes_per_second = 4.0 * (1 << 20);
  limits.burst_bytes = 2.0 * (1 << 20);
  TestDataServer server(source_, limits);
  auto mount = DataMount::open(member_, options(server, server.hex()));
  ASSERT_TRUE(mount->wait_complete(30));
  EXPECT_GT(mount->stats().busy, 0u);
  EXPECT_EQ(data_identity(dir_ / "cache").hex(), server.hex());
}

TEST_F(DataMountTest, AChunkWithOtherBytesIsRefusedAndNeverRead) {
  const std::string run_hash = data_identity(source_).hex();
  const DataManifest manifest{data_identity(source_), {}};
  const std::string bad_chunk = manifest.identity.shards[0].chunk_hashes[1];
  std::atomic<int> lies{0};
  TestDataServer server(source_, {}, [&](wire::Envelope& reply) {
    const std::string hash = reply.get_blob().hash();
    DataManifest honest = manifest;
    reply.mutable_blob()->set_hash(hash);
    if (hash == manifest.identity.hash) {
      reply.mutable_blob()->set_data(encode_manifest(honest));
      return;
    }
    // Chunk 1 of the train shard: one token changed. Every other chunk: the honest bytes.
    const std::string file = read_file(source_ / "train_000000.bin");
    for (uint64_t c = 0; c < 3; ++c) {
      if (manifest.identity.shards[0].chunk_hashes[c] != hash) continue;
      std::string bytes = file.substr(c << 20, 1 << 20);
      if (hash == bad_chunk) {
        bytes[100] ^= 1;
        ++lies;
      }
      reply.mutable_blob()->set_data(bytes);
    }
    const std::string val = read_file(source_ / "val_000000.bin");
    if (manifest.identity.shards[1].chunk_hashes[0] == hash) reply.mutable_blob()->set_data(val);
  });
  DataMountOptions o = options(server, run_hash);
  o.prefetch = false;
  auto mount = DataMount::open(member_, o);
  const ShardReader shard = ShardReader::open(o.cache_dir / "train_000000.bin");
  std::vector<TokenId> tokens(16);
  EXPECT_NO_THROW(shard.copy(0, 16, tokens.data()));  // chunk 0: honest
  // Tokens 524288.. lie in chunk 1 (1 MiB in, past the 1024-byte header).
  EXPECT_ERROR_WITH(shard.copy(600'000, 16, tokens.data()), "chunk 1 of train_000000.bin",
                    "not the run's", "2 asks");
  EXPECT_EQ(lies.load(), 2);
  EXPECT_EQ(mount->stats().refused, 2u);
  // Nothing of the lie reached the folder: chunk 1 is still a hole.
  const std::string cached = read_file(o.cache_dir / "train_000000.bin");
  EXPECT_TRUE(cached.substr(1 << 20, 1 << 20) == std::string(1 << 20, '\0'))
      << "chunk 1 of the cache holds bytes the server sent";
}

TEST_F(DataMountTest, AManifestOfOtherDataIsRefused) {
  const fs::path other = dir_ / "other";
  fs::create_directories(other);
  write_shard(other / "train_000000.bin", std::vector<TokenId>(5000, 3), 1);
  const std::string run_hash = data_identity(source_).hex();
  const DataManifest lie{data_identity(other), {}};
  // Asked for the run's manifest, it sends another folder's under the run's hash.
  TestDataServer server(source_, {}, [&](wire::Envelope& reply) {
    const std::string hash = reply.get_blob().hash();
    reply.mutable_blob()->set_hash(hash);
    reply.mutable_blob()->set_data(encode_manifest(lie));
  });
  EXPECT_ERROR_WITH(DataMount::open(member_, options(server, run_hash)), "manifest of other data",
                    lie.identity.hex(), run_hash);
  EXPECT_FALSE(fs::exists(dir_ / "cache" / "train_000000.bin"));

  // A server that does not hold the run's data says so, and the member is told what to do.
  TestDataServer elsewhere(other);
  EXPECT_ERROR_WITH(DataMount::open(member_, options(elsewhere, run_hash)),
                    "does not serve the run's data", "--data");
}

TEST_F(DataMountTest, MembersServeFirstAndOneThatLiesIsAskedNoMore) {
  TestDataServer server(source_);
  // One member lies about every chunk; one holds other data only (it answers NotFound); one
  // holds the run's data.
  TestDataServer liar(source_, {}, [&](wire::Envelope& reply) {
    const std::string hash = reply.get_blob().hash();
    reply.mutable_blob()->set_hash(hash);
    reply.mutable_blob()->set_data(std::string(1 << 20, 'x'));
  });
  const fs::path other = dir_ / "other";
  fs::create_directories(other);
  write_shard(other / "train_000000.bin", std::vector<TokenId>(5000, 3), 1);
  TestDataServer stranger(other);
  TestDataServer holder(source_);
  DataMountOptions o = options(server, server.hex());
  o.prefetch = false;
  auto mount = DataMount::open(member_, o);
  mount->set_peers({{liar.endpoint(), liar.key()},
                    {stranger.endpoint(), stranger.key()},
                    {holder.endpoint(), holder.key()}});
  const Sampler local = Sampler::from_directory(source_, "train", 64, 7);
  const Sampler fetched = Sampler::from_directory(o.cache_dir, "train", 64, 7);
  std::vector<TokenId> a(local.window_tokens()), b(local.window_tokens());
  for (uint64_t q = 0; q < 20000; q += 101) {
    local.read(q, a.data());
    fetched.read(q, b.data());
    ASSERT_EQ(a, b) << "sequence " << q;
  }
  const DataMountStats s = mount->stats();
  EXPECT_EQ(s.refused, 1u);  // the liar, once: never asked again
  EXPECT_GT(s.bytes_from_peers, 0u);
  EXPECT_EQ(s.chunks_held, s.chunks - 1);  // every train chunk; the val shard was never read
  // What the mount holds, it serves: the bytes of the chunks it checked.
  const DataIdentity identity = data_identity(source_);
  EXPECT_TRUE(mount->held_chunk(identity.shards[0].chunk_hashes[1]) ==
              read_file(source_ / "train_000000.bin").substr(1 << 20, 1 << 20));
  EXPECT_EQ(mount->held_chunk(identity.shards[1].chunk_hashes[0]), std::nullopt);
}

// A member that asks for chunk after chunk and reads none of them: what waits for it is bounded
// (DataLimits::queued_bytes), and the rest is answered "busy" (small, so the socket still takes
// it) instead of being queued.
TEST_F(DataMountTest, AMemberThatDoesNotReadGetsBusyNotABacklog) {
  // A larger shard: 24 chunks.
  std::vector<TokenId> tokens(12'000'000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i % 50000);
  write_shard(source_ / "train_000001.bin", tokens, 1);
  DataLimits limits;
  limits.queued_bytes = 2 << 20;
  limits.burst_bytes = 64.0 * (1 << 20);  // the rate alone would answer every ask
  TestDataServer server(source_, limits);
  const DataIdentity identity = data_identity(source_);
  net::Context context;
  // At most one message waits unread on this side: ZeroMQ stops reading, TCP pushes back.
  net::Client client(context, member_, server.endpoint(), server.key(),
                     net::DecodeLimits{net::kMaxControlBytes, size_t{4} << 20}, 1);
  for (const auto& hash : identity.shards[1].chunk_hashes) {
    wire::Envelope e;
    e.mutable_get_blob()->set_hash(hash);
    client.send(e);
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  server.stop();
  const DataService::Counters& c = server.counters();
  EXPECT_GT(c.busy, 0u);
  EXPECT_EQ(c.chunks + c.busy, identity.shards[1].chunk_hashes.size());
  EXPECT_LT(c.chunks, identity.shards[1].chunk_hashes.size());
}

TEST_F(DataMountTest, ACacheHoldingOtherShardsIsRefused) {
  TestDataServer server(source_);
  fs::create_directories(dir_ / "cache");
  write_shard(dir_ / "cache" / "train_000099.bin", std::vector<TokenId>(5000, 3), 1);
  EXPECT_ERROR_WITH(DataMount::open(member_, options(server, server.hex())), "train_000099.bin",
                    "empty folder");
}

// `agora data serve` on a thread: the admission lets `member` through, nobody else.
class RealDataServer {
 public:
  RealDataServer(const fs::path& dir, const net::Identity& member, double messages_per_second)
      : thread_([this, dir, &member, messages_per_second] {
          DataServerOptions o;
          o.listen = "tcp://127.0.0.1:*";
          o.admission = net::admission_of({member.public_key()});
          o.data_dir = dir;
          o.messages_per_second = messages_per_second;
          o.burst = messages_per_second;
          o.stop = &stop_;
          o.on_bound = [this](const std::string& endpoint, const std::string&) {
            endpoint_.set_value(endpoint);
          };
          summary_ = run_data_server(id_, o);
        }) {}
  ~RealDataServer() { stop(); }
  std::string endpoint() { return endpoint_future_.get(); }
  const DataServerSummary& stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return summary_;
  }
  net::Identity id_ = identity(9);

 private:
  std::atomic<bool> stop_{false};
  std::promise<std::string> endpoint_;
  std::shared_future<std::string> endpoint_future_ = endpoint_.get_future().share();
  DataServerSummary summary_;
  std::thread thread_;
};

TEST_F(DataMountTest, TheDataServerServesTheKeysItAdmits) {
  RealDataServer server(source_, member_, 200);
  DataMountOptions o;
  o.endpoint = server.endpoint();
  o.server_key = server.id_.public_key();
  o.data_hash = data_identity(source_).hex();
  o.cache_dir = dir_ / "cache";
  auto mount = DataMount::open(member_, o);
  ASSERT_TRUE(mount->wait_complete(30));
  EXPECT_EQ(data_identity(o.cache_dir).hex(), o.data_hash);
  mount.reset();
  const DataServerSummary& s = server.stop();
  EXPECT_EQ(s.data_hash, o.data_hash);
  EXPECT_EQ(s.counters.manifests, 1u);
  EXPECT_EQ(s.counters.chunks, 4u);  // each chunk once
}

TEST_F(DataMountTest, TheDataServerDropsWhatIsOverAKeysMessageBudget) {
  RealDataServer server(source_, member_, 20);  // 20 messages a second, 20 at once
  net::Context context;
  net::Client client(context, member_, server.endpoint(), server.id_.public_key(),
                     net::DecodeLimits{});
  wire::Envelope hello;
  hello.mutable_heartbeat();
  for (int i = 0; i < 400; ++i) client.send(hello);
  // Every message that passed the budget is answered with the refusal; the rest are dropped.
  int refusals = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    wait_readable(client.socket(), std::chrono::milliseconds(50));
    while (auto m = client.recv()) refusals += m->has_refused() ? 1 : 0;
  }
  const DataServerSummary& s = server.stop();
  EXPECT_EQ(static_cast<uint64_t>(refusals), s.refused);
  EXPECT_EQ(s.refused + s.dropped, 400u);
  EXPECT_LT(s.refused, 200u);  // 20 at once plus 20 a second, however slowly they arrived
  EXPECT_GT(s.dropped, 0u);
}

}  // namespace
}  // namespace agora::serve
