// The flight recorder (its ring of collectives, the phases) and the explanation of a hang built from the
// ranks' records, without MPI: the hang tests under mpirun (hang_report_test.sh) take it end to end.
#include "runtime/distributed/hang_diagnosis/flight_recorder.h"

#include <gtest/gtest.h>

#include <thread>

#include "runtime/core/phase.h"
#include "runtime/distributed/hang_diagnosis/stall_report.h"

namespace ddp {
namespace {

CollectiveState collective(std::int64_t seq, const char* op, std::int64_t count, int bucket, int buckets,
                           std::int64_t step, bool completed) {
  CollectiveState c;
  c.seq = seq;
  c.operation = op;
  c.count = count;
  c.bucket = bucket;
  c.buckets = buckets;
  c.step = step;
  c.issued_s_ago = 5;
  c.completed_s_ago = completed ? 4.9 : -1;
  return c;
}

RankState rank_at(int rank, std::vector<CollectiveState> collectives, Phase phase = Phase::kUserCode,
                  double for_s = 1) {
  RankState r;
  r.rank = rank;
  r.answered = true;
  r.phases = {PhaseState{Phase::kUserCode, 9}};
  if (phase != Phase::kUserCode) r.phases.push_back(PhaseState{phase, for_s});
  r.phases.back().for_s = for_s;
  r.collectives = std::move(collectives);
  return r;
}

// Ranks that completed #812 (bucket 3 of 4, step 41); `waiting` ones also issued #813 (bucket 0, step 42).
RankState at_812(int rank, bool waiting, Phase phase = Phase::kUserCode, double for_s = 1) {
  std::vector<CollectiveState> c = {collective(812, "MPI_Allreduce", 4160, 3, 4, 41, true)};
  if (waiting) c.push_back(collective(813, "MPI_Allreduce", 1000, 0, 4, 42, false));
  return rank_at(rank, c, phase, for_s);
}

TEST(StallReport, NamesTheRankBehindWhereItIsAndWhatTheOthersWaitIn) {
  const std::vector<RankState> ranks = {at_812(0, true), at_812(1, true), at_812(2, false, Phase::kData, 302),
                                        at_812(3, true)};
  EXPECT_EQ(explain_stall(ranks),
            "rank 2 is behind: last collective #812 (MPI_Allreduce of 4160 float32, bucket 3 of 4, step 41), in "
            "data loading for 302 s; ranks 0,1,3 wait in #813 (MPI_Allreduce of 1000 float32, bucket 0 of 4, step "
            "42)");
}

// A session on a split communicator: ddprun's and mpirun's prefixes are world ranks, so both numbers are given.
TEST(StallReport, OnASplitCommunicatorNamesTheSessionRankAndTheWorldRank) {
  std::vector<RankState> ranks = {at_812(0, true), at_812(1, false, Phase::kData, 5)};
  ranks[0].world_rank = 1;
  ranks[1].world_rank = 3;
  EXPECT_EQ(explain_stall(ranks),
            "session rank 1 (world rank 3) is behind: last collective #812 (MPI_Allreduce of 4160 float32, bucket "
            "3 of 4, step 41), in data loading for 5.0 s; session rank 0 (world rank 1) waits in #813 "
            "(MPI_Allreduce of 1000 float32, bucket 0 of 4, step 42)");
  // The world itself: the numbers agree and are given once.
  ranks[0].world_rank = 0;
  ranks[1].world_rank = 1;
  EXPECT_EQ(explain_stall(ranks).rfind("rank 1 is behind: ", 0), 0u);
}

TEST(StallReport, GroupsRanksBehindInTheSamePlaceAndNamesRanksThatDidNotAnswer) {
  std::vector<RankState> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back(at_812(r, r < 5));
  ranks[5] = at_812(5, false, Phase::kEvaluation, 30);
  ranks[6] = at_812(6, false, Phase::kEvaluation, 30);
  ranks[7] = RankState{};
  ranks[7].rank = 7;
  ranks[7].no_answer = "connection refused: the process has exited";
  EXPECT_EQ(explain_stall(ranks),
            "ranks 5,6 are behind: last collective #812 (MPI_Allreduce of 4160 float32, bucket 3 of 4, step 41), "
            "in evaluation for 30 s; rank 7 did not answer (connection refused: the process has exited); ranks 0-4 "
            "wait in #813 (MPI_Allreduce of 1000 float32, bucket 0 of 4, step 42)");
}

TEST(StallReport, SaysWhichPhaseANestedPhaseIsIn) {
  RankState r = at_812(1, false, Phase::kEvaluation, 40);
  r.phases.push_back(PhaseState{Phase::kForward, 12});
  EXPECT_EQ(r.phase_text(), "in forward for 12 s, within evaluation");
  EXPECT_NE(explain_stall({at_812(0, true), r}).find("rank 1 is behind: last collective #812 (MPI_Allreduce of "
                                                     "4160 float32, bucket 3 of 4, step 41), in forward for 12 s, "
                                                     "within evaluation; rank 0 waits in #813"),
            std::string::npos);
}

TEST(StallReport, NamesBothSidesOfCollectivesThatDiffer) {
  RankState odd = at_812(2, false);
  odd.collectives.push_back(collective(813, "MPI_Bcast", 100, -1, 0, 41, false));
  const std::string report = explain_stall({at_812(0, true), at_812(1, true), odd});
  EXPECT_EQ(report,
            "the ranks differ in #813: rank 2 issued MPI_Bcast of 100 float32 (step 41), ranks 0,1 issued "
            "MPI_Allreduce of 1000 float32 (bucket 0 of 4, step 42); each waits in its own (DDP_DEBUG=collectives "
            "stops at the first difference, naming both sides)");
}

TEST(StallReport, WhenEveryRankWaitsInTheSameCollectiveNoneIsBehind) {
  const std::string report = explain_stall({at_812(0, true), at_812(1, true)});
  EXPECT_EQ(report,
            "ranks 0,1 wait in #813 (MPI_Allreduce of 1000 float32, bucket 0 of 4, step 42); every rank issued #813 "
            "and none is behind: the collective itself is stuck (the network, NCCL, or a GPU that stopped)");
}

TEST(StallReport, ARankWithNoCollectiveYetIsBehind) {
  const std::string report = explain_stall({rank_at(0, {}, Phase::kData, 20), at_812(1, true)});
  EXPECT_EQ(report.substr(0, 73), "rank 0 is behind: last collective none recorded, in data loading for 20 s");
}

TEST(StallReport, RankLists) {
  EXPECT_EQ(rank_list({3}), "3");
  EXPECT_EQ(rank_list({3, 0, 1}), "0,1,3");
  EXPECT_EQ(rank_list({0, 1, 2}), "0,1,2");
  EXPECT_EQ(rank_list({7, 0, 1, 2, 3, 4, 5, 9}), "0-5,7,9");
}

TEST(FlightRecorder, KeepsTheLastCollectivesAndEveryOneInFlight) {
  const std::int64_t first = record_collective_issued("MPI_Bcast", 10, DType::kFloat32, -1, 0, 0);
  // Completed ones scroll out of a 256-slot ring; the one never completed stays until overwritten.
  std::int64_t last = first;
  for (int k = 0; k < 20; ++k) {
    last = record_collective_issued("MPI_Allreduce", 4160, DType::kFloat32, k % 4, 4, k / 4);
    if (k != 17) record_collective_completed(last);
  }
  EXPECT_EQ(last, first + 20);
  const RankState state = local_rank_state(3, 4);
  ASSERT_GE(state.collectives.size(), 5u);
  // The first one (still in flight) and the last four.
  EXPECT_EQ(state.collectives.front().seq, first);
  EXPECT_FALSE(state.collectives.front().completed());
  EXPECT_EQ(state.collectives.back().seq, last);
  EXPECT_TRUE(state.collectives.back().completed());
  EXPECT_EQ(state.oldest_in_flight()->seq, first);
  const CollectiveState* c = state.find(first + 18);
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->completed());
  EXPECT_EQ(c->text(), "MPI_Allreduce of 4160 float32, bucket 1 of 4, step 4");
  const std::string dump = format_rank_state(state);
  EXPECT_EQ(dump.rfind("rank 3: flight recorder: in user code for ", 0), 0u) << dump;
  EXPECT_NE(dump.find("rank 3:   #" + std::to_string(first + 18) +
                      " MPI_Allreduce of 4160 float32, bucket 1 of 4, step 4: issued 0.0 s ago, in flight\n"),
            std::string::npos)
      << dump;
}

TEST(FlightRecorder, OffRecordsNothingButStillNumbers) {
  set_flight_recorder_enabled(false);
  const std::int64_t a = record_collective_issued("MPI_Bcast", 1, DType::kFloat32, -1, 0, 0);
  const std::int64_t b = record_collective_issued("MPI_Bcast", 1, DType::kFloat32, -1, 0, 0);
  set_flight_recorder_enabled(true);
  EXPECT_EQ(b, a + 1);
  EXPECT_EQ(local_rank_state(0, 1000).find(b), nullptr);
}

TEST(Phases, NestAndSayHowLongTheRankHasBeenInThem) {
  EXPECT_EQ(phase_snapshot().depth, 1);
  {
    PhaseGuard evaluating(Phase::kEvaluation);
    {
      PhaseGuard forward(Phase::kForward);
      PhaseGuard again(Phase::kForward);  // already in it: no level of its own
      const PhaseSnapshot s = phase_snapshot();
      ASSERT_EQ(s.depth, 3);
      EXPECT_EQ(s.phases[0], Phase::kUserCode);
      EXPECT_EQ(s.phases[1], Phase::kEvaluation);
      EXPECT_EQ(s.phases[2], Phase::kForward);
      EXPECT_LE(s.since[1], s.since[2]);
      // Another thread's guard is not the training thread's phase.
      std::thread([] { PhaseGuard elsewhere(Phase::kData); }).join();
      EXPECT_EQ(phase_snapshot().depth, 3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const RankState state = local_rank_state(0, 0);
    ASSERT_EQ(state.phases.size(), 2u);
    // Back in evaluation since the forward ended, not since evaluation began.
    EXPECT_LT(state.phases[1].for_s, 1.0);
    EXPECT_GE(state.phases[1].for_s, 0.015);
    EXPECT_EQ(state.phase_text().substr(0, 17), "in evaluation for");
  }
  EXPECT_EQ(phase_snapshot().depth, 1);
  set_flight_recorder_enabled(false);
  {
    PhaseGuard off(Phase::kData);
    EXPECT_EQ(phase_snapshot().depth, 1);
  }
  set_flight_recorder_enabled(true);
  set_current_step(41);
  EXPECT_EQ(phase_snapshot().step, 41);
}

TEST(Phases, NamesRoundTrip) {
  for (int p = 0; p < kPhaseCount; ++p) {
    Phase parsed = Phase::kUserCode;
    ASSERT_TRUE(parse_phase_name(phase_name(static_cast<Phase>(p)), &parsed));
    EXPECT_EQ(static_cast<int>(parsed), p);
  }
  Phase unused;
  EXPECT_FALSE(parse_phase_name("lunch", &unused));
}

}  // namespace
}  // namespace ddp
