// Decode's data-plane ownership rule (transfer/partner_auth.h): a prefill stage speaks only for its own
// stage and only about requests claimed for its own prefill instance.
#include <catch2/catch.hpp>

#include "transfer/partner_auth.h"

using namespace k3::transfer;
namespace proto = k3::protocol;

TEST_CASE("partner messages: only the request's own stage may speak for itself", "[auth]") {
  const proto::Claim claim{.request_id = 9, .prompt_len = 4, .decode_ranks = {0}, .prefill_instance = "p"};
  auto ok = [&](const std::string& sender, const proto::Message& m) {
    return stage_message_refusal(sender, m, &claim).empty();
  };
  CHECK(ok("prefill/p/1", proto::ComputeDone{.request_id = 9, .stage = 1}));
  CHECK(ok("prefill/p/1", proto::TransferDone{.request_id = 9, .stage = 1}));
  CHECK(ok("prefill/p/0", proto::AbortAck{.request_id = 9, .stage = 0}));
  CHECK(ok("prefill/p/0", proto::Abort{.request_id = 9, .origin_role = proto::Role::Prefill, .origin_instance = "p"}));
  // Another stage of the same instance speaking for stage 1.
  CHECK_FALSE(ok("prefill/p/0", proto::ComputeDone{.request_id = 9, .stage = 1}));
  CHECK_FALSE(ok("prefill/p/0", proto::TransferDone{.request_id = 9, .stage = 1}));
  CHECK_FALSE(ok("prefill/p/1", proto::AbortAck{.request_id = 9, .stage = 0}));
  // Another instance's stage (valid key, wrong request).
  const auto why = stage_message_refusal("prefill/q/1", proto::ComputeDone{.request_id = 9, .stage = 1}, &claim);
  CHECK(why.find("claimed for prefill p") != std::string::npos);
  CHECK_FALSE(ok("prefill/q/0", proto::Abort{.request_id = 9, .origin_role = proto::Role::Prefill, .origin_instance = "q"}));
  // An ABORT whose origin is not the sender, or that poses as the router.
  CHECK_FALSE(ok("prefill/p/0", proto::Abort{.request_id = 9, .origin_role = proto::Role::Router}));
  CHECK_FALSE(ok("prefill/p/0", proto::Abort{.request_id = 9, .origin_role = proto::Role::Prefill, .origin_instance = "q"}));
  CHECK_FALSE(ok("prefill/p/0", proto::Abort{.request_id = 9, .origin_role = proto::Role::Prefill, .origin_instance = "p",
                                             .origin_stage = 1}));
  // Decode or router names do not speak on the stages' socket; REGISTER is checked by registration.
  CHECK_FALSE(ok("decode/e", proto::ComputeDone{.request_id = 9}));
  CHECK(ok("prefill/q/0", proto::Register{}));
  // Unknown requests are left to the state machine (it ignores them).
  CHECK(stage_message_refusal("prefill/q/0", proto::ComputeDone{.request_id = 7}, nullptr).empty());
  CHECK(request_id_of(proto::TransferDone{.request_id = 77}) == 77);
  CHECK(request_id_of(proto::Register{}) == 0);

  k3::protocol::MetricsRegistry metrics;
  count_control_refusal(&metrics, "not_owner", proto::ComputeDone{});
  CHECK(metrics.counter_value("k3_control_rejected_total", {{"kind", "not_owner"}, {"message", "COMPUTE_DONE"}}) == 1);
}
