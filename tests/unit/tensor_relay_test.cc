// The coordinator's relay for the model state of members nobody can dial (coord/tensor_relay.h):
// who may ask, how much waits, how fast it is forwarded, and what a lying holder gets.
#include "agora/coord/tensor_relay.h"

#include <gtest/gtest.h>

namespace agora::coord {
namespace {

net::PublicKey key(int i) {
  return std::string(32, static_cast<char>('a' + i));
}

wire::GetTensor chunk(int holder, const std::string& name, uint64_t offset, uint64_t length = 8) {
  wire::GetTensor get;
  get.set_applied_steps(10);
  get.set_name(name);
  get.set_holder(key(holder));
  get.set_offset(offset);
  get.set_length(length);
  return get;
}

// The holder's answer to `get` for a tensor of `total` bytes.
wire::TensorData answer_to(const wire::GetTensor& get, uint64_t total) {
  wire::TensorData d;
  d.set_applied_steps(get.applied_steps());
  d.set_name(get.name());
  d.set_offset(get.offset());
  d.set_total_bytes(total);
  d.set_dtype("F32");
  d.set_data(std::string(std::min(get.length(), total - get.offset()), 'x'));
  return d;
}

bool is_not_found(const RelayOutgoing& o, const wire::GetTensor& get) {
  return o.message.has_not_found() &&
         o.message.not_found().what() == net::relayed_chunk_what(get.name(), get.offset());
}

TEST(TensorRelayTest, ForwardsARequestToItsHolderAndTheAnswerToTheAsker) {
  TensorRelay relay;
  const wire::GetTensor get = chunk(1, "w", 0);
  EXPECT_TRUE(relay.request(key(0), "route-0", get, true, true, 0.0).empty());
  const auto forwarded = relay.pump(0.0);
  ASSERT_EQ(forwarded.size(), 1u);
  EXPECT_TRUE(forwarded[0].route.empty());  // on the holder's own connection
  EXPECT_EQ(forwarded[0].member, key(1));
  ASSERT_TRUE(forwarded[0].message.has_get_tensor());
  EXPECT_EQ(forwarded[0].message.get_tensor().offset(), 0u);
  EXPECT_TRUE(relay.pump(0.1).empty());  // forwarded once

  const auto out = relay.answer(key(1), answer_to(get, 20), 0.2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].route, "route-0");
  ASSERT_TRUE(out[0].message.has_tensor_data());
  EXPECT_EQ(out[0].message.tensor_data().holder(), key(1));  // whose bytes these are
  EXPECT_EQ(out[0].message.tensor_data().data().size(), 8u);
  EXPECT_EQ(relay.waiting(), 0u);
  EXPECT_EQ(relay.counters().chunks, 1u);
  EXPECT_EQ(relay.counters().bytes_out, 8u);
  // Answered already: the same answer again is nobody's.
  EXPECT_TRUE(relay.answer(key(1), answer_to(get, 20), 0.3).empty());
  EXPECT_EQ(relay.counters().unsolicited, 1u);
}

TEST(TensorRelayTest, RefusesStrangersHoldersItDoesNotServeAndOddSizes) {
  TensorRelay relay;
  const wire::GetTensor get = chunk(1, "w", 0);
  auto out = relay.request(key(0), "r", get, /*fetcher_current=*/false, true, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_not_found(out[0], get));
  EXPECT_EQ(out[0].route, "r");
  out = relay.request(key(0), "r", get, true, /*holder_relayed=*/false, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_not_found(out[0], get));
  for (uint64_t length : {uint64_t{0}, uint64_t{net::kMaxRelayedChunkBytes + 1}}) {
    const wire::GetTensor odd = chunk(1, "w", 0, length);
    EXPECT_EQ(relay.request(key(0), "r", odd, true, true, 0).size(), 1u) << length;
  }
  EXPECT_EQ(relay.request(key(0), "r", chunk(1, std::string(2000, 'n'), 0), true, true, 0).size(),
            1u);
  EXPECT_EQ(relay.request(key(0), "r", chunk(1, "w", uint64_t{1} << 50), true, true, 0).size(), 1u);
  EXPECT_EQ(relay.counters().refused, 6u);
  EXPECT_EQ(relay.waiting(), 0u);
  EXPECT_TRUE(relay.pump(0).empty());
}

TEST(TensorRelayTest, IdenticalRequestsAreForwardedOnceAndAnsweredTogether) {
  TensorRelay relay;
  const wire::GetTensor get = chunk(2, "w", 8);
  relay.request(key(0), "r0", get, true, true, 0);
  relay.request(key(0), "r0", get, true, true, 0);  // asked again: still one answer
  relay.request(key(1), "r1", get, true, true, 0);
  EXPECT_EQ(relay.pump(0).size(), 1u);
  const auto out = relay.answer(key(2), answer_to(get, 20), 0.1);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].route, "r0");
  EXPECT_EQ(out[1].route, "r1");
  EXPECT_EQ(out[0].message.tensor_data().data().size(), 8u);
  EXPECT_EQ(relay.counters().bytes_in, 8u);
  EXPECT_EQ(relay.counters().bytes_out, 16u);
}

TEST(TensorRelayTest, BoundsWhatOneMemberAndEveryoneMayHaveWaiting) {
  TensorRelay relay(TensorRelay::Limits{.per_fetcher = 3, .max_waiting = 5});
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(relay.request(key(0), "r", chunk(9, "w", 8 * i), true, true, 0).empty());
  }
  EXPECT_EQ(relay.request(key(0), "r", chunk(9, "w", 24), true, true, 0).size(), 1u);
  EXPECT_TRUE(relay.request(key(1), "q", chunk(9, "w", 32), true, true, 0).empty());
  EXPECT_TRUE(relay.request(key(1), "q", chunk(9, "w", 40), true, true, 0).empty());
  EXPECT_EQ(relay.request(key(2), "p", chunk(9, "w", 48), true, true, 0).size(), 1u);  // full
  EXPECT_EQ(relay.waiting(), 5u);
  // Answered, a member's room comes back.
  const auto forwarded = relay.pump(0);
  ASSERT_FALSE(forwarded.empty());
  relay.answer(key(9), answer_to(forwarded[0].message.get_tensor(), 64), 0.1);
  EXPECT_TRUE(relay.request(key(0), "r", chunk(9, "w", 56), true, true, 0.2).empty());
}

TEST(TensorRelayTest, PacesForwardingToItsBytesPerSecondAndEachHolderToItsBound) {
  TensorRelay relay(TensorRelay::Limits{
      .per_fetcher = 100, .per_holder = 2, .bytes_per_second = 80, .burst_bytes = 16});
  for (int i = 0; i < 6; ++i) relay.request(key(0), "r", chunk(1, "w", 8 * i), true, true, 0);
  relay.request(key(0), "r", chunk(2, "v", 0), true, true, 0);
  // The burst holds two chunks of 8 bytes; holder 1 may have two unanswered.
  auto out = relay.pump(0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].member, key(1));
  // Holder 1 is busy: after 0.1 s (8 bytes), holder 2's request goes ahead of holder 1's.
  out = relay.pump(0.1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].member, key(2));
  EXPECT_TRUE(relay.pump(0.1).empty());  // no bytes left, and holder 1 busy
  relay.answer(key(1), answer_to(chunk(1, "w", 0), 48), 0.15);
  out = relay.pump(0.2);  // 8 bytes more, a free slot at holder 1: the oldest waiting goes
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.get_tensor().offset(), 16u);
  // An idle second refills only the burst.
  relay.answer(key(1), answer_to(chunk(1, "w", 8), 48), 0.3);
  relay.answer(key(1), answer_to(chunk(1, "w", 16), 48), 0.3);
  EXPECT_EQ(relay.pump(1.3).size(), 2u);
}

TEST(TensorRelayTest, ARequestItsHolderDoesNotAnswerInTimeGetsANotFound) {
  TensorRelay relay(TensorRelay::Limits{.timeout_seconds = 5});
  const wire::GetTensor get = chunk(1, "w", 0);
  relay.request(key(0), "r", get, true, true, 0);
  EXPECT_EQ(relay.pump(1).size(), 1u);
  EXPECT_TRUE(relay.pump(4).empty());
  const auto out = relay.pump(5.5);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_not_found(out[0], get));
  EXPECT_EQ(relay.counters().expired, 1u);
  EXPECT_EQ(relay.waiting(), 0u);
  // The holder's late answer finds nobody waiting.
  EXPECT_TRUE(relay.answer(key(1), answer_to(get, 20), 6).empty());
}

TEST(TensorRelayTest, AnAnswerThatDoesNotFitTheRequestOrComesFromAnotherMemberIsNotPassedOn) {
  TensorRelay relay;
  const wire::GetTensor get = chunk(1, "w", 8);
  relay.request(key(0), "r", get, true, true, 0);
  // Before it was forwarded, nobody asked the holder yet.
  EXPECT_TRUE(relay.answer(key(1), answer_to(get, 20), 0).empty());
  relay.pump(0);
  // Another member claiming to be the holder: not its request.
  EXPECT_TRUE(relay.answer(key(3), answer_to(get, 20), 0.1).empty());
  EXPECT_EQ(relay.counters().unsolicited, 2u);
  EXPECT_EQ(relay.waiting(), 1u);
  // More bytes than a chunk of 8 at offset 8 of 20 holds: the asker gets a NotFound.
  wire::TensorData lie = answer_to(get, 20);
  lie.set_data(std::string(12, 'x'));
  const auto out = relay.answer(key(1), lie, 0.2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_not_found(out[0], get));
  EXPECT_EQ(relay.counters().unsolicited, 3u);
  EXPECT_EQ(relay.counters().chunks, 0u);
  EXPECT_EQ(relay.waiting(), 0u);
}

TEST(TensorRelayTest, AHolderThatNoLongerKeepsTheTensorSaysSoAndTheAskerHearsIt) {
  TensorRelay relay;
  const wire::GetTensor get = chunk(1, "w", 0);
  relay.request(key(0), "r", get, true, true, 0);
  relay.pump(0);
  wire::TensorData missing;
  missing.set_applied_steps(10);
  missing.set_name("w");
  missing.set_missing(true);
  const auto out = relay.answer(key(1), missing, 0.1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_not_found(out[0], get));
  EXPECT_EQ(relay.counters().bytes_out, 0u);
}

}  // namespace
}  // namespace agora::coord
