// The bundled ResNet-50 is torchvision's: same parameter count and names.

#include <gtest/gtest.h>

#include "resnet.h"

TEST(ResNet50, HasTorchvisionsParameterCountAndNames) {
  auto model = resnet::resnet50();
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  EXPECT_EQ(count, 25'557'032);
  const auto names = model->named_parameters();
  EXPECT_TRUE(names.contains("layer1.0.downsample.0.weight"));
  EXPECT_TRUE(names.contains("layer4.2.bn3.bias"));
  EXPECT_TRUE(names.contains("fc.weight"));
  EXPECT_EQ(model->forward(torch::randn({2, 3, 64, 64})).sizes(), (std::vector<int64_t>{2, 1000}));
}
