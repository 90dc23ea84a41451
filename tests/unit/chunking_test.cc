// DeMo's chunk rule (docs/algorithms.md section 1.3) and the warning for shapes that waste
// compression.
#include "agora/optim/chunking.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace agora {
namespace {

TEST(Chunking, LargestDivisorUpToTheTarget) {
  // The specification's examples.
  EXPECT_EQ(chunk_size_for(12, 5), 4);
  EXPECT_EQ(chunk_size_for(100, 7), 5);
  EXPECT_EQ(chunk_size_for(100, 26), 25);
  EXPECT_EQ(chunk_size_for(100, 101), 100);
  EXPECT_EQ(chunk_size_for(50257, 64), 29);
  EXPECT_EQ(chunk_size_for(50304, 64), 64);
  EXPECT_EQ(chunk_size_for(288, 64), 48);
  EXPECT_EQ(chunk_size_for(7, 64), 7);
  EXPECT_EQ(chunk_size_for(67, 64), 1);  // a prime above the target
  EXPECT_ERROR_WITH(chunk_size_for(0, 64), "n = 0");
}

TEST(Chunking, GeometryOfEachRank) {
  const ChunkGeometry one = chunk_geometry({100}, 64, 32);
  EXPECT_EQ(one.rows, 1);
  EXPECT_EQ(one.cols, 50);
  EXPECT_EQ(one.topk, 32);
  const ChunkGeometry two = chunk_geometry({288, 768}, 64, 32);
  EXPECT_EQ(two.rows, 48);
  EXPECT_EQ(two.cols, 64);
  const ChunkGeometry three = chunk_geometry({3, 12, 20}, 8, 100);
  EXPECT_EQ(three.rows, 6);
  EXPECT_EQ(three.cols, 5);
  EXPECT_EQ(three.topk, 30);  // top-k never exceeds the chunk
  EXPECT_ERROR_WITH(chunk_geometry({}, 64, 4), "0 dimensions");
  EXPECT_ERROR_WITH(chunk_geometry({4, 0}, 64, 4), "empty dimension");
  EXPECT_ERROR_WITH(chunk_geometry({4}, 64, 0), "topk = 0");
}

TEST(Chunking, DemoLayoutUsesTheGeometry) {
  const TensorLayout layout = demo_tensor_layout({128, 64}, 64, 4, /*one_bit=*/true);
  EXPECT_EQ(layout.encoding, TensorEncoding::kDctTopK);
  EXPECT_EQ(layout.value_type, ValueType::kOneBit);
  EXPECT_EQ(layout.chunk_rows, 64);
  EXPECT_EQ(layout.chunk_cols, 64);
  EXPECT_EQ(layout.num_chunks(), 2);
  EXPECT_DOUBLE_EQ(transmitted_density({128, 64}, 64, 4), 4.0 / 4096);
}

TEST(Chunking, WarnsOnlyWhenADimensionGetsTinyChunks) {
  const auto warning = compression_warning("embed", {50257, 768}, 64, 4);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("embed [50257, 768]"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("29 x 64"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("multiple of 64"), std::string::npos) << *warning;
  EXPECT_FALSE(compression_warning("embed", {50304, 768}, 64, 4).has_value());
  EXPECT_FALSE(compression_warning("mlp", {288, 768}, 64, 4).has_value());  // 48 is close enough
  EXPECT_FALSE(compression_warning("norm", {7}, 64, 4).has_value());        // small is whole
  EXPECT_TRUE(compression_warning("odd", {67}, 64, 4).has_value());
}

}  // namespace
}  // namespace agora
