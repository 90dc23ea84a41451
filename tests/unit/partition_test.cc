// pipeline/partition.h: the cut of a model into stages.
#include "agora/pipeline/partition.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "agora/core/error.h"

namespace agora {
namespace {

ModelConfig small() {
  return model_preset("small", 8192, 256);
}

int64_t largest(const std::vector<StageSpan>& spans) {
  int64_t out = 0;
  for (const StageSpan& s : spans) out = std::max(out, s.parameters);
  return out;
}

TEST(Partition, CoversEveryLayerOnceInOrder) {
  const ModelConfig model = small();
  for (int64_t stages = 1; stages <= model.num_layers; ++stages) {
    const std::vector<StageSpan> spans = partition_model(model, stages);
    ASSERT_EQ(static_cast<int64_t>(spans.size()), stages);
    int64_t next = 0, total = 0;
    for (const StageSpan& s : spans) {
      EXPECT_EQ(s.first_layer, next);
      EXPECT_GE(s.layers(), 1);
      EXPECT_EQ(s.embedding, s.stage == 0);
      EXPECT_EQ(s.head, s.stage == stages - 1);
      next = s.end_layer;
      total += s.parameters;
    }
    EXPECT_EQ(next, model.num_layers);
    EXPECT_EQ(total, model.num_parameters()) << stages << " stages";
  }
}

TEST(Partition, MinimisesTheLargestStage) {
  // Every other cut of the small model into 3 stages has a stage at least as large.
  const ModelConfig model = small();
  const int64_t best = largest(partition_model(model, 3));
  const int64_t L = model.num_layers, layer = layer_parameters(model);
  for (int64_t a = 1; a < L; ++a) {
    for (int64_t b = a + 1; b < L; ++b) {
      const int64_t s0 = embedding_parameters(model) + a * layer, s1 = (b - a) * layer,
                    s2 = (L - b) * layer + head_parameters(model);
      EXPECT_LE(best, std::max({s0, s1, s2})) << a << "," << b;
    }
  }
  // The embedding and the head weigh about two layers each here, so the end stages get fewer.
  const std::vector<StageSpan> four = partition_model(model, 4);
  EXPECT_LT(four[0].layers(), four[1].layers() + four[2].layers());
}

TEST(Partition, RejectsCutsThatCannotBe) {
  const ModelConfig model = small();
  EXPECT_THROW(partition_model(model, 0), Error);
  EXPECT_THROW(partition_model(model, model.num_layers + 1), Error);
  ModelConfig tied = model;
  tied.tie_embeddings = true;
  EXPECT_THROW(partition_model(tied, 2), Error);
  EXPECT_NO_THROW(partition_model(tied, 1));
}

TEST(Partition, Describes) {
  const std::vector<StageSpan> spans = partition_model(small(), 2);
  EXPECT_EQ(describe(spans).substr(0, 7), "0:[emb ");
}

}  // namespace
}  // namespace agora
