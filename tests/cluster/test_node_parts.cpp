// The node parts that need no process: partition parsing/validation and the stage-link activation frames.
#include <catch2/catch.hpp>

#include <random>

#include "prefill_node/partition.h"
#include "prefill_node/stage_link.h"

using namespace k3;
using namespace k3::prefill;

TEST_CASE("partition: default even split, explicit lists, and errors naming the bad entry", "[cluster]") {
  CHECK(parse_partition("", 2, 8).value() == std::vector<int>{4, 4});
  CHECK(parse_partition("", 3, 8).value() == std::vector<int>{3, 3, 2});
  CHECK(parse_partition("3,1,2,2", 4, 8).value() == std::vector<int>{3, 1, 2, 2});
  std::vector<int> prod;
  std::string text;
  for (int i = 0; i < 7; ++i) text += "7,5,";
  text += "6,3";
  auto p93 = parse_partition(text, 16, 93);
  REQUIRE(p93.is_ok());
  CHECK(p93->size() == 16);
  CHECK(stage_begin(*p93, 15) == 90);
  auto bad_sum = parse_partition("4,3", 2, 8);
  REQUIRE_FALSE(bad_sum.is_ok());
  CHECK(bad_sum.status().message().find("sums to 7") != std::string::npos);
  auto bad_len = parse_partition("4,4", 3, 8);
  REQUIRE_FALSE(bad_len.is_ok());
  CHECK(bad_len.status().message().find("2 entries") != std::string::npos);
  auto bad_entry = parse_partition("4,x", 2, 8);
  REQUIRE_FALSE(bad_entry.is_ok());
  CHECK(bad_entry.status().message().find("entry 1 'x'") != std::string::npos);
  CHECK_FALSE(parse_partition("8,0", 2, 8).is_ok());
  CHECK_FALSE(parse_partition("", 9, 8).is_ok());
}

TEST_CASE("activation frames round-trip bit-exactly and malformed frames are rejected", "[cluster]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int banks : {0, 1, 3}) {
    const int rows = 1 + banks * 2, width = 8;
    auto rnd = [&] {
      std::vector<float> v(rows * width);
      for (float& x : v) x = nd(rng);
      return Tensor::from_f32({rows, width}, v);
    };
    ActivationChunk c{.request_id = 77, .epoch = uint32_t(banks), .chunk_start = 3, .prompt_len = 3 + uint32_t(rows) + 4};
    c.act.partial = rnd();
    for (int b = 0; b < banks; ++b) c.act.bank.push_back(rnd());
    if (banks == 1) {   // a first chunk with the prefix-cache sync: the prompt and stage 0's plan
      c.cache.evictions_before = 2;
      c.cache.prompt.assign(c.prompt_len, 0);
      for (uint32_t i = 0; i < c.prompt_len; ++i) c.cache.prompt[i] = int32_t(i * 7);
      c.cache.plan = {uint64_t(c.prompt_len)};
    }
    auto bytes = encode_chunk(c);
    auto back = decode_chunk(bytes);
    REQUIRE(back.is_ok());
    CHECK(back->request_id == 77);
    CHECK(back->epoch == uint32_t(banks));
    CHECK(back->chunk_start == 3);
    CHECK(back->prompt_len == c.prompt_len);
    REQUIRE(back->act.bank.size() == size_t(banks));
    auto same = [](const Tensor& a, const Tensor& b) {
      return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
    };
    CHECK(same(back->act.partial, c.act.partial));
    for (int b = 0; b < banks; ++b) CHECK(same(back->act.bank[b], c.act.bank[b]));
    CHECK(back->cache == c.cache);
    if (banks == 1) {
      ActivationChunk bad_plan = c;    // a checkpoint at or before the chunk's start
      bad_plan.cache.plan = {3};
      CHECK_FALSE(decode_chunk(encode_chunk(bad_plan)).is_ok());
      ActivationChunk short_prompt = c;   // the sync's prompt must be the whole prompt
      short_prompt.cache.prompt.pop_back();
      CHECK_FALSE(decode_chunk(encode_chunk(short_prompt)).is_ok());
    }

    auto truncated = bytes;
    truncated.pop_back();
    CHECK_FALSE(decode_chunk(truncated).is_ok());
    auto bad_magic = bytes;
    bad_magic[0] ^= 1;
    CHECK_FALSE(decode_chunk(bad_magic).is_ok());
    ActivationChunk past = c;
    past.prompt_len = 3 + rows - 1;  // rows beyond the prompt
    CHECK_FALSE(decode_chunk(encode_chunk(past)).is_ok());
  }
  CHECK_FALSE(decode_chunk(std::vector<uint8_t>(10, 0)).is_ok());

  // The frame a stage sends back when its prefix cache lacks a request's state.
  const RecomputeRequest rr{.request_id = 0x1234567890abcdefULL, .epoch = 2};
  auto rb = encode_recompute(rr);
  auto rr_back = decode_recompute(rb);
  REQUIRE(rr_back.is_ok());
  CHECK(*rr_back == rr);
  auto short_rr = rb;
  short_rr.pop_back();
  CHECK(decode_recompute(short_rr).status().message().find("bytes") != std::string::npos);
  auto bad_rr = rb;
  bad_rr[0] ^= 1;
  CHECK(decode_recompute(bad_rr).status().message().find("magic") != std::string::npos);
  CHECK(decode_recompute(encode_recompute({.request_id = 1, .epoch = 0})).status().message().find("epoch") != std::string::npos);
  CHECK_FALSE(decode_chunk(rb).is_ok());   // the two kinds of frame are not mistaken for each other
}
