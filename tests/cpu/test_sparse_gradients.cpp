// Embeddings with sparse gradients under DDP over Gloo: their rows are
// gathered and averaged outside the dense buckets, equal to one process that
// saw every rank's batch.

#include <gtest/gtest.h>

#include <ddp/ddp.h>

#include "support/multiprocess.h"
#include "support/sparse_scenarios.h"

namespace {

using namespace ddp::testing;

std::shared_ptr<ddp::ProcessGroup> init_gloo() {
  return ddp::init(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(60)));
}

void expect_matches_one_process(bool rare_on_rank0_only, bool accumulate = false) {
  expect_all_succeeded(run_ranks(2, [rare_on_rank0_only, accumulate](int) {
    check_sparse_matches_one_process(init_gloo(), rare_on_rank0_only, accumulate);
  }));
}

TEST(SparseGradients, EmbeddingsMatchOneProcessOnEveryRanksBatch) { expect_matches_one_process(false); }

// A sparse parameter one rank leaves unused still meets the other's gather.
TEST(SparseGradients, AnEmbeddingOnlyOneRankUsesIsAveragedWithoutHanging) { expect_matches_one_process(true); }

// no_sync: the rows accumulate locally, then the synced backward averages them all.
TEST(SparseGradients, NoSyncAccumulatesThemUntilTheSyncedBackward) { expect_matches_one_process(false, true); }

TEST(SparseGradients, ShardingModesRefuseThemNamingTheParameter) {
  expect_all_succeeded(run_ranks(2, [](int) { check_sharding_refuses_sparse(init_gloo()); }));
}

}  // namespace
