// The transport on loopback: CURVE servers and clients, the ZAP allowlist, size limits, and
// malformed frames.
#include "agora/net/curve_socket.h"

#include <gtest/gtest.h>

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "agora/core/error.h"

namespace agora::net {
namespace {

using Clock = std::chrono::steady_clock;

wire::Envelope heartbeat(uint64_t applied) {
  wire::Envelope e;
  e.mutable_heartbeat()->set_applied_steps(applied);
  return e;
}

// Polls `server` for up to `seconds`.
std::optional<Incoming> wait_for(Server& server, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (auto m = server.recv()) return m;
    zmq::pollitem_t item{server.socket().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

std::optional<wire::Envelope> wait_for(Client& client, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (auto m = client.recv()) return m;
    zmq::pollitem_t item{client.socket().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

TEST(CurveSocketTest, RoundTripCarriesTheAuthenticatedKey) {
  const Identity server_id = Identity::generate(), client_id = Identity::generate();
  Context context;
  Server server(context, server_id, "tcp://127.0.0.1:*", {});
  Client client(context, client_id, server.bound_endpoint(), server_id.public_key(), {});
  client.send(heartbeat(7));
  auto got = wait_for(server, 10);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->message.heartbeat().applied_steps(), 7u);
  EXPECT_EQ(got->curve_key, client_id.curve_public());
  server.send(got->route, heartbeat(8));
  auto reply = wait_for(client, 10);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->heartbeat().applied_steps(), 8u);
}

TEST(CurveSocketTest, AllowlistRefusesOtherKeys) {
  const Identity server_id = Identity::generate(), member = Identity::generate(),
                 stranger = Identity::generate();
  Context context(Admission{false, {member.curve_public()}});
  Server server(context, server_id, "tcp://127.0.0.1:*", {});
  Client outsider(context, stranger, server.bound_endpoint(), server_id.public_key(), {});
  outsider.send(heartbeat(1));
  Client insider(context, member, server.bound_endpoint(), server_id.public_key(), {});
  insider.send(heartbeat(2));
  auto got = wait_for(server, 10);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->message.heartbeat().applied_steps(), 2u);
  EXPECT_EQ(got->curve_key, member.curve_public());
  EXPECT_FALSE(wait_for(server, 0.5).has_value());
  EXPECT_GE(context.refused(), 1u);
}

TEST(CurveSocketTest, WrongServerKeyNeverConnects) {
  const Identity server_id = Identity::generate(), impostor = Identity::generate();
  Context context;
  Server server(context, server_id, "tcp://127.0.0.1:*", {});
  Client client(context, Identity::generate(), server.bound_endpoint(), impostor.public_key(), {});
  client.send(heartbeat(1));
  EXPECT_FALSE(wait_for(server, 0.5).has_value());
}

TEST(CurveSocketTest, MalformedAndOversizedMessagesAreDroppedAndCounted) {
  const Identity server_id = Identity::generate();
  Context context;
  DecodeLimits limits{.max_control = 256, .max_data = 4096};
  Server server(context, server_id, "tcp://127.0.0.1:*", limits);
  Client client(context, Identity::generate(), server.bound_endpoint(), server_id.public_key(),
                {});
  client.socket().send(zmq::str_buffer("\xff\xff\xff not protobuf"), zmq::send_flags::none);
  wire::Envelope big;
  big.mutable_join()->set_agent(std::string(1000, 'x'));  // a control message above 256 bytes
  client.send(big);
  client.send(heartbeat(3));
  auto got = wait_for(server, 10);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->message.heartbeat().applied_steps(), 3u);
  EXPECT_EQ(server.dropped(), 2u);
  EXPECT_NE(server.last_drop_reason().find("exceeds its limit"), std::string::npos)
      << server.last_drop_reason();
  EXPECT_EQ(server.drops_by_reason().at("over_limit"), 1u);
  EXPECT_EQ(server.drops_by_reason().at("unparsable"), 1u);
  EXPECT_GT(server.bytes_received(), 0u);
}

TEST(EnvelopeTest, DecodeRejectsGarbageEmptyAndTooLarge) {
  EXPECT_TRUE(std::holds_alternative<DecodeFailure>(decode_envelope("\x0a\xff")));
  EXPECT_TRUE(std::holds_alternative<DecodeFailure>(decode_envelope("")));  // no body
  wire::Envelope blob;
  blob.mutable_blob()->set_data(std::string(5000, 'b'));
  const std::string bytes = encode_envelope(blob);
  EXPECT_TRUE(std::holds_alternative<wire::Envelope>(decode_envelope(bytes, {256, 8192})));
  const Decoded refused = decode_envelope(bytes, {256, 4096});
  ASSERT_TRUE(std::holds_alternative<DecodeFailure>(refused));
  EXPECT_EQ(std::get<DecodeFailure>(refused).code, DecodeError::kTooLarge);
  EXPECT_NE(std::get<DecodeFailure>(refused).reason.find(std::to_string(bytes.size())),
            std::string::npos);  // the reason names the size
  EXPECT_EQ(to_token(DecodeError::kTooLarge), "too_large");
  EXPECT_EQ(std::get<DecodeFailure>(decode_envelope("\x0a\xff")).code, DecodeError::kUnparsable);
  EXPECT_EQ(std::get<DecodeFailure>(decode_envelope("")).code, DecodeError::kNoBody);
  wire::Envelope join;
  join.mutable_join()->set_agent(std::string(1000, 'x'));
  const Decoded over = decode_envelope(encode_envelope(join), {256, 8192});
  EXPECT_EQ(std::get<DecodeFailure>(over).code, DecodeError::kOverLimit);
  EXPECT_EQ(to_token(std::get<DecodeFailure>(over).code), "over_limit");
  EXPECT_EQ(kind_name(blob), "blob");
}

// protobuf takes a message's size as an int: a frame of 4 GiB + n bytes once reached the parser
// as n bytes (and one of 2-4 GiB as a negative size) whenever a role's limit was above 2 GiB.
TEST(EnvelopeTest, FramesBeyondWhatProtobufParsesAreTooLargeWhateverTheLimits) {
  wire::Envelope heartbeat;
  heartbeat.mutable_heartbeat();
  const std::string head = encode_envelope(heartbeat);
  // Untouched pages of an anonymous mapping cost nothing: the frame is real memory.
  const size_t size = (size_t{4} << 30) + head.size();
  void* frame = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(frame, MAP_FAILED);
  std::memcpy(frame, head.data(), head.size());
  const DecodeLimits huge{size_t{8} << 30, size_t{8} << 30};
  const Decoded decoded = decode_envelope({static_cast<const char*>(frame), size}, huge);
  munmap(frame, size);
  ASSERT_TRUE(std::holds_alternative<DecodeFailure>(decoded));
  EXPECT_EQ(std::get<DecodeFailure>(decoded).code, DecodeError::kTooLarge);
  EXPECT_EQ(fits_one_message(kMaxEnvelopeBytes, "x"), kMaxEnvelopeBytes);
  try {
    fits_one_message(kMaxEnvelopeBytes + 1, "the contributions of a stage");
    ADD_FAILURE() << "a role whose messages exceed 2 GiB was let start";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the contributions of a stage take up to"),
              std::string::npos)
        << e.what();
  }
}

TEST(IdentityTest, SignVerifyAndKeyFiles) {
  const Identity id = Identity::generate();
  const std::string message = commit_signing_bytes("run", 3, std::string(32, 'h'));
  const std::string signature = id.sign(message);
  EXPECT_TRUE(verify_signature(id.public_key(), message, signature));
  EXPECT_FALSE(verify_signature(id.public_key(), message + "x", signature));
  EXPECT_FALSE(verify_signature(Identity::generate().public_key(), message, signature));
  EXPECT_FALSE(verify_signature(id.public_key(), message, signature.substr(1)));

  const auto dir = std::filesystem::path(testing::TempDir()) / "agora_identity_test";
  std::filesystem::create_directories(dir);
  const auto path = dir / "peer.key";
  std::filesystem::remove(path);
  id.save(path);
  EXPECT_EQ((std::filesystem::status(path).permissions() & std::filesystem::perms::all),
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_EQ(Identity::load(path).public_key(), id.public_key());
  EXPECT_THROW(id.save(path), Error);  // no silent replacement
  std::filesystem::permissions(path, std::filesystem::perms::group_read,
                               std::filesystem::perm_options::add);
  EXPECT_THROW(Identity::load(path), Error);
  EXPECT_EQ(key_from_hex(key_to_hex(id.public_key())), id.public_key());
  EXPECT_THROW(key_from_hex("abc"), Error);
  EXPECT_THROW(key_from_hex(std::string(64, 'z')), Error);
}

}  // namespace
}  // namespace agora::net
