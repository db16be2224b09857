// LibTorch >= 2: attention through scaled_dot_product_attention against the explicit softmax path (the reference),
// in the forward pass, in every gradient, and over 50 training steps. Skips with its reason on LibTorch 1.x.
#include <gtest/gtest.h>

#include <torch/torch.h>
#include <torch/version.h>

#include <cstdio>
#include <deque>
#include <set>
#include <string>

#include "model/cpu_kernels.h"
#include "model/vit.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace vit {
namespace {

#define SKIP_WITHOUT_SDPA()                                                                                     \
  if (!sdpa_available()) {                                                                                      \
    GTEST_SKIP() << "SDPA test skipped: this libtorch (" TORCH_VERSION ") has no scaled_dot_product_attention"; \
  }

// Width 48 over 4 heads: head dim 12, a scale 1/sqrt(12) that no kernel applies exactly, unlike 1/4.
ModelConfig small_model() {
  return test::tiny_vit(/*img=*/32, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/5, /*embed_dim=*/48, /*depth=*/3,
                        /*num_heads=*/4, /*mlp_ratio=*/2.0);
}

// A second model with the same weights, attention through `kernel`.
VisionTransformer twin(const VisionTransformer& source, AttentionKernel kernel) {
  VisionTransformer copy(source->config(), Init::none);
  torch::NoGradGuard no_grad;
  auto target = copy->named_parameters();
  for (const auto& item : source->named_parameters()) target[item.key()].copy_(item.value());
  copy->set_attention_kernel(kernel);
  return copy;
}

// The names of every autograd node behind `output`: which kernel really ran.
std::set<std::string> graph_nodes(const torch::Tensor& output) {
  std::set<std::string> names;
  std::set<const torch::autograd::Node*> seen;
  std::deque<torch::autograd::Node*> pending{output.grad_fn().get()};
  while (!pending.empty()) {
    auto* node = pending.front();
    pending.pop_front();
    if (node == nullptr || !seen.insert(node).second) continue;
    names.insert(node->name());
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return names;
}

bool any_contains(const std::set<std::string>& names, const std::string& part) {
  for (const auto& name : names) {
    if (name.find(part) != std::string::npos) return true;
  }
  return false;
}

struct Case {
  std::string name;
  bool rel_pos_bias;
  bool padding_mask;
};

TEST(Sdpa, ForwardAndGradientsMatchExplicitPath) {
  SKIP_WITHOUT_SDPA();
  for (const Case& c : {Case{"plain", false, false}, Case{"relative bias", true, false},
                        Case{"key padding mask", false, true}, Case{"bias and mask", true, true}}) {
    SCOPED_TRACE(c.name);
    torch::manual_seed(11);
    auto config = small_model();
    config.rel_pos_bias = c.rel_pos_bias;
    VisionTransformer source(config);
    if (c.rel_pos_bias) {
      torch::NoGradGuard no_grad;
      for (const auto& module : *source->blocks) module->as<Block>()->attn->relative_position_bias_table.normal_(0, 1);
    }
    auto reference = twin(source, AttentionKernel::explicit_softmax);
    auto fused = twin(source, AttentionKernel::sdpa);
    const auto images = torch::randn({3, 3, 32, 32});
    const auto labels = torch::tensor({0, 3, 1});
    torch::Tensor mask;  // (B, 1, 1, N): the last two patch tokens of sample 1 are padding
    if (c.padding_mask) {
      auto keep = torch::ones({3, 17}, torch::kBool);
      keep[1][15] = false;
      keep[1][16] = false;
      mask = key_padding_mask(keep);
    }
    auto forward = [&](VisionTransformer& net) { return net->forward_head(net->forward_features(images, mask)); };
    const auto expected = forward(reference);
    const auto actual = forward(fused);
    const double forward_diff = test::max_abs_diff(expected, actual);
    std::printf("%s: sdpa vs explicit logits max |diff| %.3g\n", c.name.c_str(), forward_diff);
    EXPECT_LT(forward_diff, 1e-5);
    EXPECT_GT(expected.abs().max().item<double>(), 1e-2);

    // Which kernel ran, read off the autograd graph: SDPA shows as its fused kernel's backward (flash on the CPU) or,
    // where it falls back to its math path (additive bias), as its own safe softmax; the explicit path as Softmax.
    const auto nodes = graph_nodes(actual);
    EXPECT_EQ(graph_nodes(expected).count("SoftmaxBackward0"), 1u);
    EXPECT_EQ(nodes.count("SoftmaxBackward0"), 0u) << "the explicit path ran instead of SDPA";
    EXPECT_TRUE(any_contains(nodes, "ScaledDotProduct") || nodes.count("SafeSoftmaxBackward0") == 1)
        << "no SDPA node in the graph";
    if (!c.rel_pos_bias) {
      EXPECT_TRUE(any_contains(nodes, "ScaledDotProduct")) << "a boolean or no mask should take a fused kernel";
    }
    // The default (training, predict, evaluate, bench) on the CPU is the fused block (model/fused_block.h), which
    // runs the whole block as one node; with it off, SDPA.
    if (!c.rel_pos_bias && !c.padding_mask) {
      auto automatic = twin(source, AttentionKernel::automatic);
      EXPECT_TRUE(any_contains(graph_nodes(forward(automatic)),
                               cpu_kernels_available() ? "BlockFunction" : "ScaledDotProduct"));
      automatic->set_fused_blocks(false);
      EXPECT_TRUE(any_contains(graph_nodes(forward(automatic)), "ScaledDotProduct"));
    }

    classification_loss(expected, labels, {}, 0.1).backward();
    classification_loss(actual, labels, {}, 0.1).backward();
    auto fused_params = fused->named_parameters();
    double worst = 0.0;
    std::string worst_name;
    for (const auto& item : reference->named_parameters()) {
      const auto& grad = fused_params[item.key()].grad();
      ASSERT_TRUE(grad.defined()) << item.key() << " has no gradient through SDPA";
      const double diff = test::max_abs_diff(item.value().grad(), grad);
      if (diff > worst) worst = diff, worst_name = item.key();
    }
    std::printf("%s: sdpa vs explicit gradients max |diff| %.3g (%s)\n", c.name.c_str(), worst, worst_name.c_str());
    EXPECT_LT(worst, 1e-5);
  }
}

TEST(Sdpa, FiftyTrainingStepsTrackExplicitPath) {
  SKIP_WITHOUT_SDPA();
  torch::manual_seed(12);
  VisionTransformer source(small_model());
  struct {
    torch::Tensor images = torch::randn({64, 3, 32, 32});
    torch::Tensor labels = torch::randint(0, 5, {64});
  } data;
  auto train = [&](AttentionKernel kernel) {
    auto net = twin(source, kernel);
    net->train();
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
    FlatAdamW optimizer(named, TrainConfig{});
    std::vector<double> losses;
    for (int step = 0; step < 50; ++step) {
      const auto images = data.images.narrow(0, 16 * (step % 4), 16);  // 4 batches, cycled: the loss can fall
      const auto labels = data.labels.narrow(0, 16 * (step % 4), 16);
      optimizer.zero_grad();
      auto loss = classification_loss(net->forward(images), labels, {}, 0.1);
      loss.backward();
      optimizer.clip_grad_norm(1.0);
      optimizer.step(1e-3);
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const auto expected = train(AttentionKernel::explicit_softmax);
  const auto actual = train(AttentionKernel::sdpa);
  double worst = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) worst = std::max(worst, std::abs(expected[i] - actual[i]));
  std::printf("50 steps: loss %.4f -> %.4f (explicit), %.4f -> %.4f (sdpa); max |loss diff| %.3g\n", expected.front(),
              expected.back(), actual.front(), actual.back(), worst);
  EXPECT_LT(worst, 1e-3);
  EXPECT_LT(expected.back(), expected.front());  // it trained: the comparison is not between two constants
}

#if TORCH_VERSION_MAJOR < 2
TEST(Sdpa, UnavailableKernelIsAClearError) {
  VisionTransformer net(small_model());
  net->set_attention_kernel(AttentionKernel::sdpa);
  EXPECT_EQ(test::error_of([&] { net->forward(torch::randn({1, 3, 32, 32})); }),
            "attention kernel sdpa needs LibTorch >= 2.0; this vit is built against " TORCH_VERSION);
}
#endif

}  // namespace
}  // namespace vit
