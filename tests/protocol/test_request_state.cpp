// The request state machine, every (from, to) pair against a table written out by hand.
#include <catch2/catch.hpp>

#include "common/protocol/request_state.h"

using namespace k3::protocol;

TEST_CASE("every transition pair matches the written table", "[state]") {
  // Rows: from; columns: to. Order Q C P CD AL TR DE FI | AB FA EX.
  // Forward along the chain (skips allowed), any live state -> AB/FA/EX, nothing out of a terminal state.
  const int legal[kNumRequestStates][kNumRequestStates] = {
      /* QUEUED       */ {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
      /* CLAIMED      */ {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1},
      /* PREFILLING   */ {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
      /* COMPUTE_DONE */ {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1},
      /* ALLOCATED    */ {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1},
      /* TRANSFERRING */ {0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1},
      /* DECODING     */ {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1},
      /* FINISHED     */ {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      /* ABORTED      */ {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      /* FAILED       */ {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      /* EXPIRED      */ {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
  };
  int checked = 0;
  for (int f = 0; f < kNumRequestStates; ++f)
    for (int t = 0; t < kNumRequestStates; ++t) {
      const auto from = RequestState(f), to = RequestState(t);
      INFO(state_name(from) << " -> " << state_name(to));
      const k3::Status s = check_transition(from, to);
      CHECK(s.is_ok() == bool(legal[f][t]));
      RequestState st = from;
      const k3::Status applied = transition(st, to);
      CHECK(applied.is_ok() == s.is_ok());
      if (applied.is_ok()) {
        CHECK(st == to);
      } else {
        CHECK(st == from);  // untouched on refusal
        CHECK(applied.message().find(state_name(from)) != std::string::npos);
        CHECK(applied.message().find(state_name(to)) != std::string::npos);
      }
      ++checked;
    }
  CHECK(checked == kNumRequestStates * kNumRequestStates);
}

TEST_CASE("terminal states and names", "[state]") {
  int terminal = 0;
  for (int s = 0; s < kNumRequestStates; ++s) {
    CHECK(std::string(state_name(RequestState(s))) != "?");
    terminal += is_terminal(RequestState(s));
  }
  CHECK(terminal == 4);
  CHECK(is_terminal(RequestState::Finished));
  CHECK(is_terminal(RequestState::Expired));
  CHECK_FALSE(is_terminal(RequestState::Decoding));
  CHECK_FALSE(check_transition(RequestState(200), RequestState::Claimed).is_ok());
}

TEST_CASE("the full happy path walks the chain one step at a time", "[state]") {
  RequestState s = RequestState::Queued;
  for (int t = 1; t <= int(RequestState::Finished); ++t) REQUIRE(transition(s, RequestState(t)).is_ok());
  CHECK(s == RequestState::Finished);
  CHECK_FALSE(transition(s, RequestState::Aborted).is_ok());
}
