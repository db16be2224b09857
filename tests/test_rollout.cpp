// Attention rollout, gradient rollout, transformer attribution, attention Grad-CAM, the readout rule and the
// perturbation curves against hand-computed answers (src/explain/rollout.h).
// Every expected value is worked out in the comments from the inputs written here, not with the library.
#include <cmath>

#include <gtest/gtest.h>

#include "explain/rollout.h"
#include "test_util.h"

namespace vit {
namespace {

// Two blocks, two heads, N = 3 tokens: the class token and a 1 x 2 patch grid. Rows are queries.
torch::Tensor block0() {
  return torch::tensor({0.5, 0.25, 0.25, 0.2, 0.6, 0.2, 0.1, 0.1, 0.8,     // head 0
                        0.3, 0.45, 0.25, 0.4, 0.4, 0.2, 0.3, 0.5, 0.2},   // head 1
                       torch::kFloat64)
      .view({2, 3, 3});
}
torch::Tensor block1() {
  return torch::tensor({0.1, 0.6, 0.3, 0.4, 0.4, 0.2, 0.2, 0.2, 0.6,     // head 0
                        0.3, 0.4, 0.3, 0.4, 0.4, 0.2, 0.1, 0.3, 0.6},     // head 1
                       torch::kFloat64)
      .view({2, 3, 3});
}

void expect_map(const torch::Tensor& map, std::vector<double> expected, int64_t grid_h, int64_t grid_w) {
  ASSERT_EQ(map.dim(), 2);
  ASSERT_EQ(map.size(0), grid_h);
  ASSERT_EQ(map.size(1), grid_w);
  EXPECT_EQ(map.scalar_type(), torch::kFloat32);
  const auto flat = map.to(torch::kFloat64).reshape(-1);
  double worst = 0.0;
  for (int64_t i = 0; i < flat.numel(); ++i) {
    worst = std::max(worst, std::abs(flat[i].item<double>() - expected[i]));
    EXPECT_NEAR(flat[i].item<double>(), expected[i], 1e-6) << "entry " << i;
  }
  std::printf("max |delta| vs hand-computed map: %.3g\n", worst);
}

TEST(RolloutMath, MeanFusionMatchesHandComputation) {
  // Block 0 head mean [[.4 .35 .25] [.3 .5 .2] [.2 .3 .5]]; + I has row sums 2, so
  //   A0 = [[.7 .175 .125] [.15 .75 .1] [.1 .15 .75]].
  // Block 1 head mean row 0 = [.2 .5 .3]; + I -> [1.2 .5 .3] / 2 = [.6 .25 .15] (the only row that matters).
  // R = A1 A0, row 0 = .6 * A0[0] + .25 * A0[1] + .15 * A0[2] = [.4725 .315 .2125].
  // Patches [.315 .2125] / .315 = [1, .2125 / .315].
  const auto map = attention_rollout({block0(), block1()}, "mean", 0.0, /*prefix_tokens=*/1, 1, 2);
  expect_map(map, {1.0, 0.2125 / 0.315}, 1, 2);
}

TEST(RolloutMath, MaxFusionMatchesHandComputation) {
  // Block 0 max over heads + I: [[1.5 .45 .25] [.4 1.6 .2] [.3 .5 1.8]], row sums 2.2, 2.2, 2.6.
  // Block 1 max row 0 = [.3 .6 .3]; + I: [1.3 .6 .3], sum 2.2.
  // R[0, 1] = (1.3 * .45 / 2.2 + .6 * 1.6 / 2.2 + .3 * .5 / 2.6) / 2.2
  // R[0, 2] = (1.3 * .25 / 2.2 + .6 * .2 / 2.2 + .3 * 1.8 / 2.6) / 2.2
  const double r1 = (1.3 * 0.45 / 2.2 + 0.6 * 1.6 / 2.2 + 0.3 * 0.5 / 2.6) / 2.2;
  const double r2 = (1.3 * 0.25 / 2.2 + 0.6 * 0.2 / 2.2 + 0.3 * 1.8 / 2.6) / 2.2;
  const auto map = attention_rollout({block0(), block1()}, "max", 0.0, 1, 1, 2);
  expect_map(map, {1.0, r2 / r1}, 1, 2);  // r1 > r2
}

TEST(RolloutMath, MinFusionMatchesHandComputation) {
  // Block 0 min over heads + I: [[1.3 .25 .25] [.2 1.4 .2] [.1 .1 1.2]], row sums 1.8, 1.8, 1.4.
  // Block 1 min row 0 = [.1 .4 .3]; + I: [1.1 .4 .3], sum 1.8.
  const double r1 = (1.1 * 0.25 / 1.8 + 0.4 * 1.4 / 1.8 + 0.3 * 0.1 / 1.4) / 1.8;
  const double r2 = (1.1 * 0.25 / 1.8 + 0.4 * 0.2 / 1.8 + 0.3 * 1.2 / 1.4) / 1.8;
  const auto map = attention_rollout({block0(), block1()}, "min", 0.0, 1, 1, 2);
  expect_map(map, {1.0, r2 / r1}, 1, 2);
}

TEST(RolloutMath, DiscardNeverDropsTheClassColumn) {
  // Discard 1/3 of the 3 x 2 = 6 entries outside column 0, i.e. the 2 smallest, per block (mean fusion).
  // Block 0 mean [[.4 .35 .25] [.3 .5 .2] [.2 .3 .5]]: drop (1,2) = .2 and (0,2) = .25. The class column's
  //   (2,0) = .2 ties the smallest and must survive.
  //   + I: [[1.4 .35 0] [.3 1.5 0] [.2 .3 1.5]], row sums 1.75, 1.8, 2 -> A0 = [[.8 .2 0] [1/6 5/6 0] [.1 .15 .75]].
  // Block 1 mean [[.2 .5 .3] [.4 .4 .2] [.15 .25 .6]]: drop (1,2) = .2 and (2,1) = .25 (not (2,0) = .15, the
  //   smallest entry of all, which sits in the class column). Row 0 untouched: [1.2 .5 .3] / 2 = [.6 .25 .15].
  // R[0, 1] = .6 * .2 + .25 * 5/6 + .15 * .15;  R[0, 2] = .6 * 0 + .25 * 0 + .15 * .75.
  const double r1 = 0.6 * 0.2 + 0.25 * 5.0 / 6.0 + 0.15 * 0.15;
  const double r2 = 0.15 * 0.75;
  const auto map = attention_rollout({block0(), block1()}, "mean", 1.0 / 3.0, 1, 1, 2);
  expect_map(map, {1.0, r2 / r1}, 1, 2);
}

TEST(RolloutMath, DiscardCountsOnlyEntriesOutsideTheClassColumn) {
  const auto fused = torch::tensor({0.1, 0.9, 0.5, 0.05, 0.7, 0.3, 0.01, 0.2, 0.6}, torch::kFloat64).view({3, 3});
  // Ratio 0.5 of the 6 candidates: the 3 smallest outside column 0 are .2, .3, .5; column 0 (.1 .05 .01) stays.
  const auto out = discard_lowest(fused, 0.5, 1);
  const auto expected =
      torch::tensor({0.1, 0.9, 0.0, 0.05, 0.7, 0.0, 0.01, 0.0, 0.6}, torch::kFloat64).view({3, 3});
  EXPECT_TRUE(torch::equal(out, expected)) << out;
  EXPECT_THROW(discard_lowest(fused, 1.0, 1), std::invalid_argument);
  EXPECT_THROW(discard_lowest(fused, -0.1, 1), std::invalid_argument);
}

TEST(RolloutMath, RowsAreRenormalisedPerRow) {
  const auto fused = torch::tensor({1.0, 1.0, 0.0, 0.0, 3.0, 1.0, 2.0, 2.0, 4.0}, torch::kFloat64).view({3, 3});
  // + I: [[2 1 0] [0 4 1] [2 2 5]], rows / [3 5 9].
  const auto a = add_identity_and_normalise(fused);
  const auto expected = torch::tensor({2.0 / 3, 1.0 / 3, 0.0, 0.0, 0.8, 0.2, 2.0 / 9, 2.0 / 9, 5.0 / 9},
                                      torch::kFloat64).view({3, 3});
  EXPECT_TRUE(torch::allclose(a, expected, 0, 1e-12)) << a;
}

// The hand-made gradients of the tests below: block 0 head 0 +1 and head 1 -1 everywhere; block 1 head 0
// 2 at (0,1) only, head 1 -1 everywhere but +1 at (0,0) and (0,2).
std::vector<torch::Tensor> hand_gradients() {
  auto g0 = torch::cat({torch::ones({1, 3, 3}), -torch::ones({1, 3, 3})}).to(torch::kFloat64);
  auto g1 = torch::zeros({2, 3, 3}, torch::kFloat64);
  g1[0][0][1] = 2.0;
  g1[1] = -1.0;
  g1[1][0][0] = 1.0;
  g1[1][0][2] = 1.0;
  return {g0, g1};
}

TEST(RolloutMath, GradientRolloutMatchesHandComputation) {
  // Block 0: head 0 gradient +1 everywhere, head 1 gradient -1 everywhere (its positive part is 0), so
  //   F0 = mean(h0 * 1, h1 * 0) = h0 / 2 = [[.25 .125 .125] [.1 .3 .1] [.05 .05 .4]]; + I, row sums all 1.5:
  //   A0 = [[5/6 1/12 1/12] [1/15 13/15 1/15] [1/30 1/30 14/15]].
  // Block 1: head 0 gradient 2 at (0,1) only -> .6 * 2 = 1.2 there; head 1 gradient [[1 -1 1] [-1 ...]] ->
  //   .3 at (0,0) and (0,2). F1 = mean = [[.15 .6 .15] [0 0 0] [0 0 0]]; + I row 0 = [1.15 .6 .15] / 1.9.
  // R = A1 A0 (forward order: the later block on the left):
  //   R[0, 1] = (1.15 / 12 + .6 * 13/15 + .15 / 30) / 1.9;  R[0, 2] = (1.15 / 12 + .6 / 15 + .15 * 14/15) / 1.9.
  // (The reversed product A0 A1 would give .430 instead of .444; clamping after the head mean, as jacobgil does,
  //  would let head 1's negative gradient at (0,1) cancel part of head 0's.)
  const double r1 = (1.15 / 12 + 0.6 * 13.0 / 15 + 0.15 / 30) / 1.9;
  const double r2 = (1.15 / 12 + 0.6 / 15 + 0.15 * 14.0 / 15) / 1.9;
  const auto map = gradient_rollout({block0(), block1()}, hand_gradients(), 0.0, 1, 1, 2);
  expect_map(map, {1.0, r2 / r1}, 1, 2);
}

TEST(RolloutMath, TransformerAttributionMatchesHandComputation) {
  // Block 0: relu(G * A) is head 0's attention and 0 for head 1, so Abar0 = h0 / 2 =
  //   [[.25 .125 .125] [.1 .3 .1] [.05 .05 .4]];  R0 = I + Abar0 @ I = [[1.25 .125 .125] [.1 1.3 .1] [.05 .05 1.4]].
  // Block 1: head 0's product is 1.2 at (0,1); head 1's is [.3 -.4 .3] in row 0 and negative elsewhere, clamped
  //   per head to [.3 0 .3]. Abar1 = mean = [[.15 .6 .15] [0 0 0] [0 0 0]].
  // R = R0 + Abar1 @ R0, row 0 = [1.25 .125 .125] + .15 * R0[0] + .6 * R0[1] + .15 * R0[2]
  //   = [1.505, .125 + .01875 + .78 + .0075, .125 + .01875 + .06 + .21] = [1.505 .93125 .41375].
  // (Clamping after the head mean would give head 1's -.4 a say: Abar1[0][1] = (1.2 - .4) / 2 = .4.)
  const auto g = hand_gradients();
  const auto map = transformer_attribution({block0(), block1()}, g, /*start_layer=*/0, 1, 1, 2);
  expect_map(map, {1.0, 0.41375 / 0.93125}, 1, 2);
  // From block 1 on: R = I + Abar1, row 0 = [1.15 .6 .15].
  expect_map(transformer_attribution({block0(), block1()}, g, 1, 1, 1, 2), {1.0, 0.25}, 1, 2);
  EXPECT_THROW(transformer_attribution({block0(), block1()}, g, 2, 1, 1, 2), std::invalid_argument);
  // The patch-mean readout (average pooling): rows 1 and 2 of R = R0 + Abar1 @ R0 are R0's (Abar1 is zero there):
  //   mean of [.1 1.3 .1] and [.05 .05 1.4] over the patches = [.675 .75] -> [.9, 1].
  const auto mean_rows = torch::tensor({0.0, 0.5, 0.5}, torch::kFloat64);
  expect_map(transformer_attribution({block0(), block1()}, g, 0, 1, 1, 2, mean_rows), {0.9, 1.0}, 1, 2);
}

TEST(RolloutMath, AttentionGradcamMatchesHandComputation) {
  // Last block, class token's row: a0 = [.1 .6 .3], a1 = [.3 .4 .3]; g0 = [0 2 0], g1 = [1 -1 1].
  // Weights: mean over the patches (columns 1, 2): w0 = (2 + 0) / 2 = 1, w1 = (-1 + 1) / 2 = 0.
  // cam = mean over heads of w * a[patches] = ([.6 .3] + 0) / 2 = [.3 .15] -> [1, .5].
  const auto g = hand_gradients();
  expect_map(attention_gradcam(block1(), g[1], 1, 1, 2), {1.0, 0.5}, 1, 2);
  // The opposite gradient makes every entry negative: clamped to zero, the map is all zero (not divided by 0).
  expect_map(attention_gradcam(block1(), -g[1], 1, 1, 2), {0.0, 0.0}, 1, 2);
  // Patch-mean readout: rows 1 and 2 of head 0 average to [.3 .4] over the patches, its gradient there is 0, so
  // w0 = 0; head 1's rows [.4 .2], [.3 .6] average to [.35 .4], its gradient rows are all -1, so w1 = -1:
  // cam = -[.35 .4] / 2 is negative everywhere, so zero (and [.35 .4] / 2 -> [.875, 1] for the opposite gradient).
  const auto mean_rows = torch::tensor({0.0, 0.5, 0.5}, torch::kFloat64);
  expect_map(attention_gradcam(block1(), g[1], 1, 1, 2, mean_rows), {0.0, 0.0}, 1, 2);
  expect_map(attention_gradcam(block1(), -g[1], 1, 1, 2, mean_rows), {0.35 / 0.4, 1.0}, 1, 2);
}

TEST(RolloutMath, HeadReadoutFollowsThePooling) {
  ModelConfig model = test::tiny_vit(32, 16, 3, 5, 32, 2, 2, 4.0);  // 2 x 2 patches + class token
  model.global_pool = GlobalPool::token;
  EXPECT_TRUE(torch::equal(head_readout(model), torch::tensor({1.0, 0.0, 0.0, 0.0, 0.0}, torch::kFloat64)));
  // Average pooling never reads the class token: the mean of the patch rows, class token or not.
  model.global_pool = GlobalPool::avg;
  EXPECT_TRUE(torch::equal(head_readout(model), torch::tensor({0.0, 0.25, 0.25, 0.25, 0.25}, torch::kFloat64)));
  EXPECT_NE(head_readout_name(model).find("mean of the patch rows"), std::string::npos);
  model.class_token = false;
  EXPECT_TRUE(torch::equal(head_readout(model), torch::tensor({0.25, 0.25, 0.25, 0.25}, torch::kFloat64)));
}

TEST(RolloutMath, MapUsesTheGivenRectangularGridRowMajor) {
  // N = 1 + 2 * 3: nothing about N = 7 is a square, the grid must come from the caller.
  auto r = torch::eye(7, torch::kFloat64);
  r[0] = torch::tensor({9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, torch::kFloat64);
  const auto map = rollout_to_map(r, 1, 2, 3);
  expect_map(map, {1.0 / 6, 2.0 / 6, 3.0 / 6, 4.0 / 6, 5.0 / 6, 1.0}, 2, 3);
  EXPECT_THROW(rollout_to_map(r, 1, 3, 3), c10::Error);
  // Without a class token the map is the mean attention each patch receives: column means of R.
  const auto no_class = rollout_to_map(torch::eye(6, torch::kFloat64) * 2 + 1, 0, 2, 3);
  expect_map(no_class, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0}, 2, 3);
}

TEST(RolloutMath, MaskedHeadsAreLeftOutOfTheFusion) {
  // Head 1 of block 1 switched off: block 1 fuses head 0 only, row 0 = [.1 .6 .3]; + I -> [1.1 .6 .3] / 2.
  // R[0] = .55 * A0[0] + .3 * A0[1] + .15 * A0[2] with A0 from the mean fusion test.
  const double r1 = 0.55 * 0.175 + 0.3 * 0.75 + 0.15 * 0.15;
  const double r2 = 0.55 * 0.125 + 0.3 * 0.1 + 0.15 * 0.75;
  const auto map = attention_rollout({block0(), block1()}, "mean", 0.0, 1, 1, 2,
                                     {torch::ones({2}), torch::tensor({1.0f, 0.0f})});
  expect_map(map, {1.0, r2 / r1}, 1, 2);
  // Every head off: the block is the identity after + I and renormalisation.
  const auto off = attention_rollout({block0(), block1()}, "mean", 0.0, 1, 1, 2, {torch::ones({2}), torch::zeros({2})});
  expect_map(off, {1.0, 0.125 / 0.175}, 1, 2);
}

TEST(RolloutMath, ClassAttentionMapsPerHeadAndMean) {
  const auto maps = class_attention_maps(block0(), 1, 1, 2);  // head 0 row 0 patches [.25 .25], head 1 [.45 .25]
  ASSERT_EQ(maps.sizes(), (std::vector<int64_t>{2, 1, 2}));
  EXPECT_NEAR(maps[0][0][0].item<float>(), 1.0, 1e-6);
  EXPECT_NEAR(maps[0][0][1].item<float>(), 1.0, 1e-6);
  EXPECT_NEAR(maps[1][0][1].item<float>(), 0.25 / 0.45, 1e-6);
  const auto mean = class_attention_mean(block0(), 1, 1, 2);  // [.35 .25] / .35
  EXPECT_NEAR(mean[0][1].item<float>(), 0.25 / 0.35, 1e-6);
  const auto head1 = class_attention_mean(block0(), 1, 1, 2, torch::tensor({0.0f, 1.0f}));
  EXPECT_NEAR(head1[0][1].item<float>(), 0.25 / 0.45, 1e-6);
  EXPECT_THROW(check_head_fusion("median"), std::invalid_argument);
}

TEST(RolloutMath, ImportanceAndRandomOrders) {
  const auto order = importance_order(torch::tensor({0.2, 0.9, 0.2, 0.5}).view({2, 2}));
  EXPECT_EQ(order, (std::vector<int64_t>{1, 3, 0, 2}));  // ties keep index order
  auto shuffled = random_order(50, 7);
  EXPECT_EQ(shuffled, random_order(50, 7));
  EXPECT_NE(shuffled, random_order(50, 8));
  std::sort(shuffled.begin(), shuffled.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(shuffled[i], i);
}

// A small random ViT: 32 x 48 input, 16 px patches -> a 2 x 3 grid, 2 blocks of 2 heads, 5 classes.
VisionTransformer tiny_model() {
  ModelConfig config = test::tiny_vit(/*img=*/32, /*patch=*/16, /*in_chans=*/3, /*num_classes=*/5, /*embed_dim=*/32,
                                      /*depth=*/2, /*num_heads=*/2, /*mlp_ratio=*/4.0);
  config.img_w = 48;
  torch::manual_seed(3);
  VisionTransformer net(config);
  net->eval();
  return net;
}

TEST(RolloutModel, CaptureGivesAttentionAndGradientsOfTheForwardPass) {
  auto net = tiny_model();
  torch::manual_seed(4);
  const auto image = torch::randn({3, 32, 48});
  const auto capture = capture_attention(net, image, kPredictedClass);
  ASSERT_EQ(capture.attentions.size(), 2u);
  ASSERT_EQ(capture.gradients.size(), 2u);
  EXPECT_EQ(capture.attentions[0].sizes(), (std::vector<int64_t>{2, 7, 7}));
  EXPECT_TRUE(torch::allclose(capture.attentions[1].sum(-1), torch::ones({2, 7}), 0, 1e-5));  // softmax rows
  EXPECT_EQ(capture.gradient_class, capture.logits.argmax().item<int64_t>());
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::allclose(capture.logits, net->forward(image.unsqueeze(0))[0], 0, 1e-5));
  }
  // The last block only reaches the logit through the class token's row: every other row has zero gradient.
  EXPECT_EQ(capture.gradients[1].narrow(1, 1, 6).abs().max().item<float>(), 0.0f);
  EXPECT_GT(capture.gradients[1].select(1, 0).abs().max().item<float>(), 0.0f);

  // A switched-off head's output is zeroed, so nothing downstream depends on its attention.
  net->set_head_mask(0, {1});
  const auto masked = capture_attention(net, image, 2);
  EXPECT_EQ(masked.gradient_class, 2);
  EXPECT_EQ(masked.gradients[0][1].abs().max().item<float>(), 0.0f);
  EXPECT_GT(masked.gradients[0][0].abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(masked.attentions[0], capture.attentions[0]));  // its map is still there
  const auto keep = head_keep_masks(net);
  EXPECT_TRUE(torch::equal(keep[0], torch::tensor({1.0f, 0.0f})));
  EXPECT_TRUE(torch::equal(keep[1], torch::ones({2})));
  EXPECT_THROW(capture_attention(net, image, 5), std::invalid_argument);
}

TEST(RolloutModel, DeletionCurveBlanksPatchesInOrder) {
  auto net = tiny_model();
  torch::manual_seed(5);
  const auto image = torch::randn({3, 32, 48});
  const std::vector<int64_t> order = {4, 0, 5, 1, 3, 2};
  const auto curve = deletion_curve(net, image, order, /*target_class=*/1, /*steps=*/3, /*batch_size=*/2);
  ASSERT_EQ(curve.fractions, (std::vector<double>{0.0, 1.0 / 3, 2.0 / 3, 1.0}));
  ASSERT_EQ(curve.probs.size(), 4u);
  torch::NoGradGuard no_grad;
  auto prob = [&](const torch::Tensor& x) { return net->forward(x.unsqueeze(0)).softmax(-1)[0][1].item<double>(); };
  // Level 1 blanks patches 4 and 0: (row 1, col 1) and (row 0, col 0).
  auto level1 = image.clone();
  level1.narrow(1, 16, 16).narrow(2, 16, 16).zero_();
  level1.narrow(1, 0, 16).narrow(2, 0, 16).zero_();
  EXPECT_NEAR(curve.probs[0], prob(image), 1e-6);
  EXPECT_NEAR(curve.probs[1], prob(level1), 1e-6);
  EXPECT_NEAR(curve.probs[3], prob(torch::zeros_like(image)), 1e-6);
  double auc = 0.0;
  for (int i = 0; i < 3; ++i) auc += (curve.probs[i] + curve.probs[i + 1]) / 2.0 / 3.0;
  EXPECT_NEAR(curve.auc, auc, 1e-12);
}

TEST(RolloutModel, InsertionAndPerturbationCurves) {
  auto net = tiny_model();  // 2 x 3 patches of 16 px
  torch::manual_seed(6);
  const auto image = torch::randn({3, 32, 48});
  const std::vector<int64_t> order = {4, 0, 5, 1, 3, 2};
  torch::NoGradGuard no_grad;
  auto probs = [&](const torch::Tensor& x) { return net->forward(x.unsqueeze(0)).softmax(-1)[0]; };
  auto patch = [](torch::Tensor& x, int64_t p) { return x.narrow(1, (p / 3) * 16, 16).narrow(2, (p % 3) * 16, 16); };

  // Insertion restores patches onto a blank image: level 0 is all blank, the last level the intact image.
  const auto insertion = insertion_curve(net, image, order, /*target_class=*/2, /*steps=*/3, /*batch_size=*/2);
  ASSERT_EQ(insertion.fractions, (std::vector<double>{0.0, 1.0 / 3, 2.0 / 3, 1.0}));
  EXPECT_NEAR(insertion.probs[0], probs(torch::zeros_like(image))[2].item<double>(), 1e-6);
  EXPECT_NEAR(insertion.probs[3], probs(image)[2].item<double>(), 1e-6);
  auto level1 = torch::zeros_like(image);  // patches 4 and 0 back
  for (int64_t p : {4, 0}) {
    auto source = image.clone();
    patch(level1, p).copy_(patch(source, p));
  }
  EXPECT_NEAR(insertion.probs[1], probs(level1)[2].item<double>(), 1e-6);

  // Positive perturbation: 0%, 10%, .., 90% -> counts floor(0.6 i) = 0 0 1 1 2 3 3 4 4 5 for 6 patches.
  const auto positive = positive_perturbation(net, image, order, 2);
  ASSERT_EQ(positive.fractions.size(), 10u);
  const std::vector<int64_t> counts = {0, 0, 1, 1, 2, 3, 3, 4, 4, 5};
  for (size_t i = 0; i < counts.size(); ++i) EXPECT_DOUBLE_EQ(positive.fractions[i], counts[i] / 6.0) << i;
  // Negative perturbation blanks the reversed order: at 90%, every patch but order[0] = 4.
  const auto negative = negative_perturbation(net, image, order, 2);
  auto all_but_first = torch::zeros_like(image);
  auto source = image.clone();
  patch(all_but_first, 4).copy_(patch(source, 4));
  const auto last = probs(all_but_first);
  EXPECT_NEAR(negative.probs[9], last[2].item<double>(), 1e-6);
  EXPECT_EQ(negative.top1[9], last.argmax().item<int64_t>() == 2 ? 1 : 0);
  EXPECT_EQ(negative.top1[0], probs(image).argmax().item<int64_t>() == 2 ? 1 : 0);
  double auc = 0.0;
  for (size_t i = 1; i < 10; ++i) {
    auc += (negative.fractions[i] - negative.fractions[i - 1]) * (negative.probs[i] + negative.probs[i - 1]) / 2;
  }
  EXPECT_NEAR(negative.auc, auc, 1e-12);
  EXPECT_THROW(perturbation_curve(net, image, order, {2, 1}, 2, false), c10::Error);  // counts must not go back
}

}  // namespace
}  // namespace vit
