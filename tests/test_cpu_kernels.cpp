// The CPU fast paths (model/cpu_kernels.h, model/fused_block.h) against ATen's own ops and the per-operator model:
// forward values and every gradient.
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "model/cpu_kernels.h"
#include "model/fused_block.h"
#include "model/precision.h"
#include "model/row_kernels.h"
#include "model/vit.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "vit/build_config.h"
#if VIT_WITH_DNNL
#include "model/dnnl_matmul.h"
#endif

namespace vit {
namespace {

#define SKIP_WITHOUT_KERNELS()                                                                                   \
  if (!cpu_kernels_available()) {                                                                                \
    GTEST_SKIP() << "CPU fast path not available here (no oneDNN sgemm in this libtorch, or VIT_CPU_KERNELS=aten)"; \
  }

// Gradients of sum(out * weights) for a fixed random weighting: every output element matters.
std::vector<torch::Tensor> grads_of(const torch::Tensor& out, const std::vector<torch::Tensor>& inputs) {
  torch::manual_seed(7);
  auto weights = torch::randn(out.sizes());
  return torch::autograd::grad({(out * weights).sum()}, inputs);
}

TEST(CpuKernels, LinearMatchesAten) {
  SKIP_WITHOUT_KERNELS();
  for (const bool with_bias : {true, false}) {
    torch::manual_seed(0);
    auto x = torch::randn({3, 17, 24}, torch::requires_grad());
    auto weight = torch::randn({40, 24}, torch::requires_grad());
    auto bias = with_bias ? torch::randn({40}, torch::requires_grad()) : torch::Tensor();
    std::vector<torch::Tensor> inputs{x, weight};
    if (with_bias) inputs.push_back(bias);
    auto expected = torch::nn::functional::linear(x, weight, bias);
    auto actual = linear(x, weight, bias);
    ASSERT_EQ(actual.sizes(), expected.sizes());
    EXPECT_LT(test::max_abs_diff(actual, expected), 1e-4) << "bias " << with_bias;
    const auto expected_grads = grads_of(expected, inputs);
    const auto actual_grads = grads_of(actual, inputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_LT(test::max_abs_diff(actual_grads[i], expected_grads[i]), 1e-3) << "input " << i << " bias " << with_bias;
    }
  }
}

TEST(CpuKernels, LinearWithoutGradIsPlainForward) {
  SKIP_WITHOUT_KERNELS();
  auto x = torch::randn({5, 8});
  auto weight = torch::randn({3, 8});
  c10::InferenceMode inference;
  auto y = linear(x, weight, torch::Tensor());
  EXPECT_LT(test::max_abs_diff(y, torch::mm(x, weight.t())), 1e-5);
}

// One row (a classifier head at batch 1): the bias broadcast to the output is itself contiguous, and must be copied
// before the sgemm accumulates into it, or the bias parameter is overwritten.
TEST(CpuKernels, LinearOnOneRowLeavesTheBiasAlone) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(3);
  auto x = torch::randn({1, 8});
  auto weight = torch::randn({3, 8});
  auto bias = torch::randn({3});
  const auto bias_before = bias.clone();
  c10::InferenceMode inference;
  const auto first = linear(x, weight, bias);
  const auto second = linear(x, weight, bias);
  EXPECT_TRUE(torch::equal(bias, bias_before));
  EXPECT_TRUE(torch::equal(first, second));
  EXPECT_LT(test::max_abs_diff(first, torch::nn::functional::linear(x, weight, bias)), 1e-5);
}

TEST(CpuKernels, AttentionCoreMatchesExplicitAttention) {
  SKIP_WITHOUT_KERNELS();
  // Many heads; and one image with 3 heads, where the forward also splits each head's query rows across threads.
  for (const auto& [B, heads] : {std::pair<int64_t, int64_t>{3, 4}, {1, 3}}) {
    const int64_t N = 11, hd = 8, D = heads * hd;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    torch::manual_seed(0);
    auto qkv = torch::randn({B, N, 3 * D}, torch::requires_grad());
    // timm's explicit attention, as AttentionImpl's generic path computes it.
    auto parts = qkv.reshape({B, N, 3, heads, hd}).permute({2, 0, 3, 1, 4});  // (3, B, nh, N, hd)
    auto probs = torch::matmul(parts[0] * scale, parts[1].transpose(-2, -1)).softmax(-1);
    auto expected = torch::matmul(probs, parts[2]).transpose(1, 2).reshape({B, N, D});
    auto actual = attention_core(qkv, heads, scale);
    const double forward_diff = test::max_abs_diff(actual, expected);
    std::printf("attention core vs explicit (B %lld, %lld heads): max |diff| %.3g\n", static_cast<long long>(B),
                static_cast<long long>(heads), forward_diff);
    EXPECT_LT(forward_diff, 1e-5);
    const auto expected_grad = grads_of(expected, {qkv})[0];
    const auto actual_grad = grads_of(actual, {qkv})[0];
    EXPECT_LT(test::max_abs_diff(actual_grad, expected_grad), 1e-4);
  }
}

TEST(CpuKernels, ModelFastPathMatchesExplicitPath) {
  SKIP_WITHOUT_KERNELS();
  const ModelConfig config = test::tiny_vit(/*img=*/32, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/5,
                                            /*embed_dim=*/48, /*depth=*/2, /*num_heads=*/3, /*mlp_ratio=*/4.0);
  torch::manual_seed(0);
  VisionTransformer net(config);
  net->eval();
  auto images = torch::randn({2, 3, 32, 32});
  torch::NoGradGuard no_grad;
  const auto fast = net->forward(images);
  Capture capture;
  capture.attention = true;  // asking for the probabilities takes the explicit attention path
  const auto explicit_logits = net->forward_head(net->forward_features(images, {}, &capture));
  EXPECT_LT(test::max_abs_diff(fast, explicit_logits), 1e-5);
}

// The patch embedding as a linear layer over flattened patches (the CPU path) against the convolution it replaces:
// outputs and the gradients of the input and of the conv weight and bias, including an input whose size is not a
// multiple of the patch (the convolution drops the remainder).
TEST(CpuKernels, PatchEmbedMatchesItsConvolution) {
  ModelConfig config;
  config.img_h = config.img_w = 28;
  config.patch_size = 7;
  config.in_chans = 2;
  config.embed_dim = 24;
  torch::manual_seed(0);
  PatchEmbed embed(config);
  for (const auto& size : {std::vector<int64_t>{3, 2, 28, 28}, std::vector<int64_t>{1, 2, 30, 23}}) {
    auto x = torch::randn(size, torch::requires_grad());
    const auto expected = embed->proj->forward(x).flatten(2).transpose(1, 2);  // (B, gh*gw, D)
    const auto actual = embed->forward(x);
    ASSERT_EQ(actual.sizes(), expected.sizes());
    EXPECT_LT(test::max_abs_diff(actual, expected), 1e-5);
    const std::vector<torch::Tensor> inputs{x, embed->proj->weight, embed->proj->bias};
    const auto expected_grads = grads_of(expected, inputs);
    const auto actual_grads = grads_of(actual, inputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_LT(test::max_abs_diff(actual_grads[i], expected_grads[i]), 1e-4) << "input " << i;
    }
  }
}


// ---- the fused block ----

// max |a - b| over max |b|: a difference relative to the tensor's scale.
double relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return test::max_abs_diff(a, b) / (scale > 0.0 ? scale : 1.0);
}

// `count` intra-op threads for a scope: with three the fused block's regions split rows and (image, head) pairs
// unevenly, and per-thread partial sums are reduced (the suite otherwise runs on LibTorch's default count).
struct Threads {
  explicit Threads(int count) : previous(at::get_num_threads()) { at::set_num_threads(count); }
  ~Threads() { at::set_num_threads(previous); }
  int previous;
};

struct FusedCase {
  const char* name;
  void (*set)(ModelConfig&);
};

// A case's two-block model with perturbed weights in training mode, three images, and what the tests take gradients
// of: the images, then every parameter. 17 tokens, head dim 16: the short-sequence attention kernels
// (model/row_kernels.h).
struct TrainingCase {
  // The logits, then the gradients of the inputs, with the blocks fused or not and their products in bf16 or not.
  std::vector<torch::Tensor> run(bool fused, bool bf16 = false) {
    net->set_fused_blocks(fused);
    net->set_bf16_products(bf16);
    torch::manual_seed(3);  // the drop-path draws
    auto logits = net->forward(images);
    auto grads = grads_of(logits, inputs);
    grads.insert(grads.begin(), logits);
    return grads;
  }

  VisionTransformer net{nullptr};
  torch::Tensor images;
  std::vector<torch::Tensor> inputs;
};

TrainingCase training_case(const FusedCase& fused_case) {
  ModelConfig config = test::tiny_vit(/*img=*/24, /*patch=*/6, /*in_chans=*/3, /*num_classes=*/5,
                                      /*embed_dim=*/64, /*depth=*/2, /*num_heads=*/4, /*mlp_ratio=*/3.0);
  fused_case.set(config);
  torch::manual_seed(0);
  TrainingCase made;
  made.net = VisionTransformer(config);
  test::perturb_weights(made.net, 1);
  made.net->train();
  torch::manual_seed(2);
  made.images = torch::randn({3, 3, config.img_h, config.img_w}, torch::requires_grad());
  made.inputs.push_back(made.images);
  for (const auto& p : made.net->parameters()) made.inputs.push_back(p);
  return made;
}

// The fused block against the per-operator path on each option it covers, in training mode: logits within 1e-5
// (relative to their scale), the gradient of every parameter and of the input within 1e-5 relative. Stochastic
// depth draws the same samples under the same seed.
TEST(FusedBlock, MatchesThePerOperatorPathOnEveryCoveredOption) {
  SKIP_WITHOUT_KERNELS();
  const FusedCase cases[] = {
      {"plain", [](ModelConfig&) {}},
      {"LayerScale", [](ModelConfig& c) { c.init_values = 0.1; }},
      {"no qkv bias", [](ModelConfig& c) { c.qkv_bias = false; }},
      {"quick_gelu", [](ModelConfig& c) { c.act_layer = Activation::quick_gelu; }},
      {"gelu_tanh", [](ModelConfig& c) { c.act_layer = Activation::gelu_tanh; }},
      {"registers, no class token, avg pool",
       [](ModelConfig& c) { c.reg_tokens = 2, c.class_token = false, c.global_pool = GlobalPool::avg; }},
      {"MAP head", [](ModelConfig& c) { c.global_pool = GlobalPool::map; }},
      {"drop path", [](ModelConfig& c) { c.drop_path_rate = 0.5, c.init_values = 0.1; }},
      {"head dim 8, 101 tokens (attention through sgemm)",
       [](ModelConfig& c) { c.embed_dim = 32, c.img_h = c.img_w = 40, c.patch_size = 4; }},
      {"width 256 (2.6 MB of weights, 17 rows per thread: products on all rows)",
       [](ModelConfig& c) { c.embed_dim = 256; }},
      {"silu", [](ModelConfig& c) { c.act_layer = Activation::silu; }},
      {"no proj bias, LayerScale", [](ModelConfig& c) { c.proj_bias = false, c.init_values = 0.1; }},
      {"AIMv2's block: RmsNorm, SwiGLU (fc1_g, fc1_x), SiLU, no biases",
       [](ModelConfig& c) {
         c.norm_layer = NormLayer::rmsnorm, c.mlp_layer = MlpLayer::swiglu, c.act_layer = Activation::silu;
         c.proj_bias = false, c.qkv_bias = false, c.layer_norm_eps = 1e-5;
       }},
      {"DINOv2 giant's block: packed SwiGLU with biases, LayerScale",
       [](ModelConfig& c) {
         c.mlp_layer = MlpLayer::swiglu_packed, c.act_layer = Activation::silu, c.init_values = 0.1;
       }},
      {"EVA-02's block: rotary cat (adjacent pairs), q_bias / v_bias, packed SwiGLU, gamma_1 / gamma_2, drop path",
       [](ModelConfig& c) {
         c.model_class = ModelClass::eva, c.use_rot_pos_emb = true, c.swiglu_mlp = true, c.init_values = 0.1;
         c.drop_path_rate = 0.3;
       }},
      {"DINOv3's block: rotary dinov3 (halves, augmented), 4 registers, no qkv bias, LayerScale",
       [](ModelConfig& c) {
         c.model_class = ModelClass::eva, c.use_rot_pos_emb = true, c.rope_type = RopeType::dinov3;
         c.rope_rotate_half = true, c.rope_temperature = 100, c.reg_tokens = 4, c.qkv_bias = false;
         c.init_values = 0.1, c.use_abs_pos_emb = false, c.rope_rescale_coords = 2.0, c.rope_shift_coords = 0.5;
       }},
      {"gated gelu_tanh, RmsNorm, width 256 (products on all rows)",
       [](ModelConfig& c) {
         c.mlp_layer = MlpLayer::swiglu, c.act_layer = Activation::gelu_tanh, c.norm_layer = NormLayer::rmsnorm;
         c.embed_dim = 256;
       }},
  };
  // Three images on three threads: each thread takes its image through the whole block in one parallel region
  // (the narrow plans); on two threads, region by region.
  for (const int count : {3, 2}) {
    Threads threads(count);
    for (const auto& fused_case : cases) {
      TrainingCase made = training_case(fused_case);
      ASSERT_EQ(made.net->blocks[0]->as<Block>()->fused_refusal(), "") << fused_case.name;
      const auto expected = made.run(false);
      const auto actual = made.run(true);
      double worst_grad = 0.0;
      for (size_t i = 1; i < expected.size(); ++i) {
        worst_grad = std::max(worst_grad, relative_diff(actual[i], expected[i]));
      }
      const double logits_diff = relative_diff(actual[0], expected[0]);
      std::printf("fused block, %s, %d threads: logits %.3g, worst gradient %.3g (relative)\n", fused_case.name, count,
                  logits_diff, worst_grad);
      EXPECT_LT(logits_diff, 1e-5) << fused_case.name << ", " << count << " threads";
      for (size_t i = 1; i < expected.size(); ++i) {
        EXPECT_LT(relative_diff(actual[i], expected[i]), 1e-5)
            << fused_case.name << ", " << count << " threads: gradient of "
            << (i == 1 ? "the input" : "parameter " + std::to_string(i - 2));
      }
    }
  }
}

// Inference takes the fused path too, also at batches that do not split evenly over the threads (1 and 8 on 3), where
// each thread takes its own rows through the block in one region, its queries' rows through the attention: with
// attention through sgemm (101 tokens), through the short-sequence kernels (50 tokens, head dim 32), with 3 MB of
// weights a block (width 256), and with weights large enough (width 320: 4.9 MB) that each product runs on all rows
// at once instead; with each of the four activations, which a packed fc1 applies in its kernel. Its products run on the
// packed weights where this CPU has oneDNN's kernels for them (PackedProducts), and through sgemm where a block has
// none: both are checked, and a weight changed in place is packed again.
TEST(FusedBlock, InferenceMatchesAtBatchOneAndEight) {
  SKIP_WITHOUT_KERNELS();
  Threads threads(3);
  enum Variant { plain, aimv2, rope_mixed, gelu_tanh, quick_gelu, silu };
  const char* names[] = {
      "", " (AIMv2's block)", " (RoPE-ViT mixed, a table per head)", " (GELU, tanh form)", " (QuickGELU)", " (SiLU)"};
  for (const auto& [img, width, heads, variant] : {std::tuple<int64_t, int64_t, int64_t, Variant>{40, 48, 3, plain},
                                                   {28, 64, 2, plain},
                                                   {28, 256, 4, plain},
                                                   {28, 320, 4, plain},
                                                   {28, 64, 2, aimv2},
                                                   {28, 256, 4, aimv2},
                                                   {40, 48, 3, rope_mixed},
                                                   {28, 64, 2, gelu_tanh},
                                                   {28, 64, 2, quick_gelu},
                                                   {28, 64, 2, silu}}) {
    ModelConfig config = test::tiny_vit(img, /*patch=*/4, /*in_chans=*/3, /*num_classes=*/7, width,
                                        /*depth=*/2, heads, /*mlp_ratio=*/4.0);
    if (variant == aimv2) {  // RmsNorm, SwiGLU, SiLU, no biases on proj and the MLP
      config.norm_layer = NormLayer::rmsnorm, config.mlp_layer = MlpLayer::swiglu, config.act_layer = Activation::silu;
      config.proj_bias = false;
    } else if (variant == rope_mixed) {  // learned frequencies: covered where no gradient is asked
      config.model_class = ModelClass::eva, config.use_rot_pos_emb = true, config.rope_type = RopeType::mixed;
      config.attn_type = AttnType::rope, config.init_values = 0.1;
    } else if (variant != plain) {  // a plain MLP's other activations: in fc1's kernel where it is packed
      config.act_layer = variant == gelu_tanh    ? Activation::gelu_tanh
                         : variant == quick_gelu ? Activation::quick_gelu
                                                 : Activation::silu;
    }
    torch::manual_seed(0);
    VisionTransformer net(config);
    test::perturb_weights(net, 4);
    net->eval();
    torch::NoGradGuard no_grad;
    auto first_block = net->blocks[0]->as<Block>();
    const auto packed = first_block->packed_products;
    // The lambda names the case through copies: C++17 lambdas cannot capture structured bindings (clang refuses).
    const int64_t size = img, embed_dim = width;
    const char* name = names[variant];
    auto check = [&](int64_t batch, const char* what) {
      const auto images = torch::randn({batch, 3, size, size});
      c10::InferenceMode inference;  // where the packed weights are used
      net->set_fused_blocks(false);
      const auto expected = net->forward(images);
      net->set_fused_blocks(true);
      const auto actual = net->forward(images);
      first_block->packed_products = nullptr;  // this block's products through sgemm
      const auto unpacked = net->forward(images);
      first_block->packed_products = packed;
      std::printf(
          "fused block inference, %lldx%lld, width %lld%s, batch %lld%s: logits %.3g, with the first block's "
          "products through sgemm %.3g (relative)\n",
          static_cast<long long>(size), static_cast<long long>(size), static_cast<long long>(embed_dim), name,
          static_cast<long long>(batch), what, relative_diff(actual, expected), relative_diff(unpacked, expected));
      EXPECT_LT(relative_diff(actual, expected), 1e-5) << size << "x" << size << " batch " << batch << what;
      EXPECT_LT(relative_diff(unpacked, expected), 1e-5) << size << "x" << size << " batch " << batch << what;
    };
    for (const int64_t batch : {1, 8}) check(batch, "");
    if (!PackedProducts::available()) continue;
    // qkv, proj, fc1, fc2: packed once, whatever the batch. A gated MLP's fc1 products write strided rows and stay on
    // sgemm.
    const int64_t packs = variant == aimv2 ? 3 : 4;
    EXPECT_EQ(packed->packs(), packs);
    first_block->attn->qkv->weight.mul_(1.5);
    first_block->mlp->fc2->weight.add_(0.01);
    check(8, ", after qkv and fc2 changed in place");
    EXPECT_EQ(packed->packs(), packs + 2);
  }
}

// Training writes the weights through FlatAdamW's flat buffer, which the parameters alias: inference after a step
// must see the new weights, not the packed copy of the old ones. And a forward outside InferenceMode (the trainer's
// evaluation) packs nothing.
TEST(FusedBlock, PackedWeightsFollowTheOptimizer) {
  SKIP_WITHOUT_KERNELS();
  if (!PackedProducts::available()) GTEST_SKIP() << "no packed float32 products on this CPU";
  Threads threads(2);
  ModelConfig config = test::tiny_vit(/*img=*/28, /*patch=*/4, /*in_chans=*/3, /*num_classes=*/5, /*embed_dim=*/64,
                                      /*depth=*/2, /*num_heads=*/2, /*mlp_ratio=*/4.0);
  torch::manual_seed(0);
  VisionTransformer net(config);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : net->named_parameters()) named.emplace_back(p.key(), p.value());
  FlatAdamW optimizer(named, TrainConfig{});
  const auto images = torch::randn({4, 3, 28, 28});
  const auto packed = net->blocks[0]->as<Block>()->packed_products;
  for (int step = 0; step < 3; ++step) {
    net->eval();
    torch::Tensor expected, actual;
    {
      c10::InferenceMode inference;
      net->set_fused_blocks(false);
      expected = net->forward(images);
      net->set_fused_blocks(true);
      actual = net->forward(images);
    }
    {
      torch::NoGradGuard no_grad;
      net->forward(images);  // as the trainer evaluates
    }
    std::printf("packed products after %d optimizer steps: logits %.3g (relative), %lld packs\n", step,
                relative_diff(actual, expected), static_cast<long long>(packed->packs()));
    EXPECT_LT(relative_diff(actual, expected), 1e-5) << "after " << step << " steps";
    EXPECT_EQ(packed->packs(), 4 * (step + 1)) << "qkv, proj, fc1, fc2 packed again after each step, and only then";
    net->train();
    optimizer.zero_grad();
    net->forward(images).square().mean().backward();
    optimizer.step(0.05);
  }
}

// Each instruction set's row kernels (AVX-512, AVX2, baseline: those this CPU runs) against ATen: the short-sequence
// attention forward and backward at every (keys, head dim) block count, layer norm and RmsNorm with their backward,
// softmax.
TEST(RowKernels, EveryInstructionSetMatchesAten) {
  for (const auto& k : available_row_kernels()) {
    double worst = 0.0;
    for (const int64_t N : {5, 17, 33, 50, 64}) {
      for (const int64_t hd : {16, 32, 64}) {
        ASSERT_TRUE(short_attention_applies(N, hd));
        torch::manual_seed(N * 100 + hd);
        const int64_t row = 3 * hd + 8;  // q, k, v side by side in a wider row, as inside qkv
        const auto qkv = torch::randn({N, row});
        const auto q = qkv.narrow(1, 0, hd), key = qkv.narrow(1, hd, hd), v = qkv.narrow(1, 2 * hd, hd);
        const float scale = 0.3f;
        // Forward, in two row blocks as batch-1 inference splits them.
        auto probs = torch::empty({N, N}), out = torch::empty({N, hd});
        std::vector<float> kT(hd * 64);
        const float* base = qkv.data_ptr<float>();
        const int64_t first = N / 2;
        k.short_attention(base, base + hd, base + 2 * hd, row, N, hd, scale, first, probs.data_ptr<float>(),
                          out.data_ptr<float>(), hd, kT.data());
        k.short_attention(base + first * row, base + hd, base + 2 * hd, row, N, hd, scale, N - first,
                          probs.data_ptr<float>() + first * N, out.data_ptr<float>() + first * hd, hd, kT.data());
        const auto expected_probs = torch::matmul(q * scale, key.t()).softmax(-1);
        worst = std::max({worst, test::max_abs_diff(probs, expected_probs),
                          test::max_abs_diff(out, torch::matmul(expected_probs, v))});
        // Backward against autograd through the same expression.
        auto q_leaf = q.clone().requires_grad_(), k_leaf = key.clone().requires_grad_(),
             v_leaf = v.clone().requires_grad_();
        const auto dout = torch::randn({N, hd});
        const auto reference = torch::matmul(torch::matmul(q_leaf * scale, k_leaf.t()).softmax(-1), v_leaf);
        const auto grads = torch::autograd::grad({reference}, {q_leaf, k_leaf, v_leaf}, {dout});
        auto dqkv = torch::zeros({N, row});
        std::vector<float> vT(hd * 64), ds(N * 64);
        float* d = dqkv.data_ptr<float>();
        k.short_attention_backward(probs.data_ptr<float>(), dout.data_ptr<float>(), hd, base, base + hd, base + 2 * hd,
                                   row, N, hd, scale, d, d + hd, d + 2 * hd, vT.data(), ds.data());
        for (int part = 0; part < 3; ++part) {
          worst = std::max(worst, test::max_abs_diff(dqkv.narrow(1, part * hd, hd), grads[part]));
        }
      }
    }
    // Layer norm and its backward over rows of 48, softmax over rows of 19.
    torch::manual_seed(5);
    const int64_t D = 48;
    const auto x = torch::randn({4, D}), w = torch::randn({D}), b = torch::randn({D}), dout = torch::randn({4, D});
    auto out = torch::empty({4, D}), mean = torch::empty({4}), rstd = torch::empty({4});
    auto dx = torch::empty({4, D}), dw = torch::zeros({D}), db = torch::zeros({D});
    const auto zeros = torch::zeros({4, D});
    for (int64_t r = 0; r < 4; ++r) {
      k.layer_norm_row(x[r].data_ptr<float>(), D, 1e-6f, w.data_ptr<float>(), b.data_ptr<float>(), out[r].data_ptr<float>(),
                       mean.data_ptr<float>() + r, rstd.data_ptr<float>() + r);
      k.layer_norm_backward_row(dout[r].data_ptr<float>(), x[r].data_ptr<float>(), mean[r].item<float>(),
                                rstd[r].item<float>(), w.data_ptr<float>(), D, zeros[r].data_ptr<float>(),
                                dx[r].data_ptr<float>(), dw.data_ptr<float>(), db.data_ptr<float>());
    }
    auto x_leaf = x.clone().requires_grad_(), w_leaf = w.clone().requires_grad_(), b_leaf = b.clone().requires_grad_();
    const auto reference = torch::layer_norm(x_leaf, {D}, w_leaf, b_leaf, 1e-6);
    const auto grads = torch::autograd::grad({reference}, {x_leaf, w_leaf, b_leaf}, {dout});
    // RmsNorm and its backward over the same rows.
    auto rms_out = torch::empty({4, D}), rms_rstd = torch::empty({4}), rms_dx = torch::empty({4, D});
    auto rms_dw = torch::zeros({D});
    for (int64_t r = 0; r < 4; ++r) {
      k.rms_norm_row(x[r].data_ptr<float>(), D, 1e-5f, w.data_ptr<float>(), rms_out[r].data_ptr<float>(),
                     rms_rstd.data_ptr<float>() + r);
      k.rms_norm_backward_row(dout[r].data_ptr<float>(), x[r].data_ptr<float>(), rms_rstd[r].item<float>(),
                              w.data_ptr<float>(), D, zeros[r].data_ptr<float>(), rms_dx[r].data_ptr<float>(),
                              rms_dw.data_ptr<float>());
    }
    auto rms_x = x.clone().requires_grad_(), rms_w = w.clone().requires_grad_();
    const auto rms_reference = rms_x * torch::rsqrt(rms_x.pow(2).mean(-1, true) + 1e-5) * rms_w;
    const auto rms_grads = torch::autograd::grad({rms_reference}, {rms_x, rms_w}, {dout});
    worst = std::max({worst, test::max_abs_diff(rms_out, rms_reference.detach()),
                      test::max_abs_diff(rms_dx, rms_grads[0]), test::max_abs_diff(rms_dw, rms_grads[1])});
    auto scores = torch::randn({3, 19}) * 4;
    const auto expected_softmax = scores.softmax(-1);
    k.softmax_rows(scores.data_ptr<float>(), 3, 19);
    worst = std::max({worst, test::max_abs_diff(out, reference.detach()), test::max_abs_diff(dx, grads[0]),
                      test::max_abs_diff(dw, grads[1]), test::max_abs_diff(db, grads[2]),
                      test::max_abs_diff(scores, expected_softmax)});
    // Rows of 197 keys (ViT/16's at 224), scores far apart, the row's maximum first, inside the vectors and in the
    // tail: with a wrong maximum the exp overflows and the row turns NaN.
    auto long_scores = torch::randn({3, 197}) * 30;
    const int64_t peaks[3] = {0, 37, 196};
    for (int64_t r = 0; r < 3; ++r) long_scores[r][peaks[r]] = 400.0f;
    const auto expected_long = long_scores.softmax(-1);
    k.softmax_rows(long_scores.data_ptr<float>(), 3, 197);
    EXPECT_TRUE(torch::allclose(long_scores, expected_long, 0.0, 1e-6)) << k.isa;
    worst = std::max(worst, test::max_abs_diff(long_scores, expected_long));
    std::printf("row kernels, %s: max |diff| against ATen %.3g\n", k.isa, worst);
    EXPECT_LT(worst, 1e-4) << k.isa;
    // GELU with its derivative over [-12, 12] (both tails, zero, and 1,001 values: a partial last vector), against the
    // erf GELU and its derivative in float64 through erfc (ATen's float GELU rounds the left tail to zero).
    const auto gelu_in = torch::linspace(-12.0, 12.0, 1001);
    auto derivative = gelu_in.clone(), gelu_out = torch::empty_like(gelu_in);
    k.gelu_with_derivative(derivative.data_ptr<float>(), gelu_out.data_ptr<float>(), gelu_in.numel());
    const auto x64 = gelu_in.to(torch::kFloat64);
    const auto cdf = 0.5 * torch::erfc(-x64 / std::sqrt(2.0));
    const auto expected_gelu = x64 * cdf;
    const auto expected_derivative = cdf + x64 * torch::exp(-0.5 * x64 * x64) / std::sqrt(2.0 * M_PI);
    const double gelu_diff = test::max_abs_diff(gelu_out.to(torch::kFloat64), expected_gelu);
    const double derivative_diff = test::max_abs_diff(derivative.to(torch::kFloat64), expected_derivative);
    const double tail_relative = ((gelu_out.to(torch::kFloat64) - expected_gelu).abs() / expected_gelu.abs())
                                     .masked_select(gelu_in.lt(-3.0))
                                     .max()
                                     .item<double>();
    std::printf("gelu with derivative, %s: max |diff| %.3g (value), %.3g (derivative); below -3 relative %.3g\n", k.isa,
                gelu_diff, derivative_diff, tail_relative);
    EXPECT_LT(gelu_diff, 1e-6) << k.isa;
    EXPECT_LT(derivative_diff, 1e-6) << k.isa;
    EXPECT_LT(tail_relative, 0.05) << k.isa;  // A&S 7.1.26's relative error there: 3%; 1 + erf would give 100%
  }
}

// The fused path is what runs (its autograd node), and an option it does not cover says so and keeps the blocks on
// the per-operator path.
TEST(FusedBlock, RunsWhereItAppliesAndNamesWhatItDoesNotCover) {
  SKIP_WITHOUT_KERNELS();
  ModelConfig config = test::tiny_vit(/*img=*/16, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/2,
                                      /*embed_dim=*/16, /*depth=*/1, /*num_heads=*/2, /*mlp_ratio=*/2.0);
  VisionTransformer net(config);
  const auto tokens = torch::randn({2, 5, 16});
  auto block = net->blocks[0]->as<Block>();
  const auto out = block->forward(tokens, {2, 2}, {}, nullptr);
  ASSERT_TRUE(out.grad_fn() != nullptr);
  EXPECT_NE(out.grad_fn()->name().find("BlockFunction"), std::string::npos) << out.grad_fn()->name();
  torch::Tensor probs;
  const auto explicit_out = block->forward(tokens, {2, 2}, {}, &probs);  // probabilities asked for: explicit path
  EXPECT_EQ(explicit_out.grad_fn()->name().find("BlockFunction"), std::string::npos);

  // AIMv2's block (RmsNorm, SwiGLU, SiLU, no biases) and DINOv2 giant's (packed SwiGLU) run fused too.
  for (const MlpLayer form : {MlpLayer::swiglu, MlpLayer::swiglu_packed}) {
    ModelConfig gated = config;
    gated.norm_layer = NormLayer::rmsnorm, gated.mlp_layer = form, gated.act_layer = Activation::silu;
    gated.proj_bias = false;
    const auto gated_out = VisionTransformer(gated)->blocks[0]->as<Block>()->forward(tokens, {2, 2}, {}, nullptr);
    EXPECT_NE(gated_out.grad_fn()->name().find("BlockFunction"), std::string::npos) << name_of(form);
  }

  // Eva's blocks with their rotary table: fused; RoPE-ViT mixed's table has learned frequencies, so where a gradient
  // is asked for it stays on the per-operator path.
  for (const RopeType type : {RopeType::cat, RopeType::dinov3, RopeType::mixed}) {
    ModelConfig eva = config;
    eva.model_class = ModelClass::eva, eva.use_rot_pos_emb = true, eva.rope_type = type;
    eva.attn_type = type == RopeType::mixed ? AttnType::rope : AttnType::eva;
    VisionTransformer rotary(eva);
    const auto table = rotary->rope->embed({2, 2});
    const auto rope = type == RopeType::mixed ? table[0] : table;
    const auto rotated = rotary->blocks[0]->as<Block>()->forward(tokens, {2, 2}, {}, nullptr, rope);
    const bool fused_node = rotated.grad_fn()->name().find("BlockFunction") != std::string::npos;
    EXPECT_EQ(fused_node, type != RopeType::mixed) << name_of(type) << ": " << rotated.grad_fn()->name();
  }

  config.qk_norm = true;
  EXPECT_EQ(VisionTransformer(config)->blocks[0]->as<Block>()->fused_refusal(), "qk_norm");
  config.qk_norm = false;
  config.rel_pos_bias = true;
  EXPECT_EQ(VisionTransformer(config)->blocks[0]->as<Block>()->fused_refusal(), "rel_pos_bias");
  config.rel_pos_bias = false;
  config.proj_drop_rate = 0.1;
  VisionTransformer dropping(config);
  EXPECT_EQ(dropping->blocks[0]->as<Block>()->fused_refusal(), "attn_drop_rate or proj_drop_rate in training");
  dropping->eval();  // dropout is off in evaluation: covered again
  EXPECT_EQ(dropping->blocks[0]->as<Block>()->fused_refusal(), "");
}

#define SKIP_WITHOUT_BF16()                                        \
  if (const auto refusal = cpu_bf16_refusal(); !refusal.empty()) { \
    GTEST_SKIP() << "bfloat16 products " << refusal;               \
  }

// Every instruction set's bfloat16 rounding is c10::BFloat16's: to nearest even (ties both ways), infinities,
// denormals, the largest finite values (which round to infinity) and NaN.
TEST(RowKernels, Bf16RoundingIsC10s) {
  torch::manual_seed(11);
  auto values =
      torch::cat({torch::randn({997}) * 1e3, torch::randn({64}) * 1e-39,
                  torch::tensor({0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 3.3895e38f, -3.3895e38f,
                                 std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN()})});
  const float* x = values.data_ptr<float>();
  const int64_t n = values.numel();
  for (const auto& k : available_row_kernels()) {
    std::vector<uint16_t> out(n);
    k.round_bf16_row(x, n, out.data());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += out[i] != c10::BFloat16(x[i]).x;
    std::printf("bf16 rounding, %s: %lld of %lld values differ from c10::BFloat16\n", k.isa,
                static_cast<long long>(wrong), static_cast<long long>(n));
    EXPECT_EQ(wrong, 0) << k.isa;
  }
}

#if VIT_WITH_DNNL
// gemm_bf16 computes what float32 products of the rounded inputs compute (only the order of the float32 sums may
// differ): every transpose, alpha and beta, a bias, leading dimensions wider than the rows, one call inside a
// parallel region per thread.
TEST(Bf16Products, GemmIsTheFloat32ProductOfTheRoundedInputs) {
  SKIP_WITHOUT_BF16();
  double worst = 0.0;
  for (const char ta : {'N', 'T'}) {
    for (const char tb : {'N', 'T'}) {
      for (const auto& [alpha, beta, with_bias] :
           {std::tuple<float, float, bool>{1.0f, 0.0f, false}, {0.5f, 1.0f, false}, {1.0f, 0.5f, true}}) {
        const int64_t M = 37, N = 24, K = 53, pad = 3;
        torch::manual_seed(ta * 7 + tb);
        // Stored as op() reads them: A (M, K) or its transpose (K, M), each row padded.
        const auto a = torch::randn({ta == 'N' ? M : K, (ta == 'N' ? K : M) + pad}).to(torch::kBFloat16);
        const auto b = torch::randn({tb == 'N' ? K : N, (tb == 'N' ? N : K) + pad}).to(torch::kBFloat16);
        const auto c0 = torch::randn({M, N + pad});  // C wider than its rows too (written through a dense copy)
        auto op = [](const torch::Tensor& t, char trans, int64_t cols) {
          const auto view = t.narrow(1, 0, cols).to(torch::kFloat);
          return trans == 'N' ? view : view.t();
        };
        const auto bias = with_bias ? torch::randn({N}) : torch::zeros({N});
        const auto expected = alpha * torch::mm(op(a, ta, ta == 'N' ? K : M), op(b, tb, tb == 'N' ? N : K)) + bias +
                              beta * c0.narrow(1, 0, N);
        auto c = c0.clone();
        const auto* a_bits = reinterpret_cast<const uint16_t*>(a.data_ptr<at::BFloat16>());
        const auto* b_bits = reinterpret_cast<const uint16_t*>(b.data_ptr<at::BFloat16>());
        gemm_bf16(ta, tb, M, N, K, alpha, a_bits, a.size(1), b_bits, b.size(1), beta, c.data_ptr<float>(), c.size(1),
                  with_bias ? bias.data_ptr<float>() : nullptr);
        worst = std::max(worst, relative_diff(c.narrow(1, 0, N), expected));
        EXPECT_TRUE(torch::equal(c.narrow(1, N, pad), c0.narrow(1, N, pad))) << "the padding was written";
      }
    }
  }
  // Two threads at once, each on its own rows inside one parallel region, with a bias (the fused block's narrow plan).
  const auto a = torch::randn({64, 32}).to(torch::kBFloat16), b = torch::randn({16, 32}).to(torch::kBFloat16);
  const auto bias = torch::randn({16});
  auto c = torch::empty({64, 16});
  at::parallel_for(0, 64, 1, [&](int64_t r0, int64_t r1) {
    gemm_bf16('N', 'T', r1 - r0, 16, 32, 1.0f, reinterpret_cast<const uint16_t*>(a.data_ptr<at::BFloat16>()) + r0 * 32,
              32, reinterpret_cast<const uint16_t*>(b.data_ptr<at::BFloat16>()), 32, 0.0f,
              c.data_ptr<float>() + r0 * 16, 16, bias.data_ptr<float>());
  });
  worst = std::max(worst, relative_diff(c, torch::mm(a.to(torch::kFloat), b.to(torch::kFloat).t()) + bias));
  std::printf("gemm_bf16 against float32 products of the rounded inputs: max relative difference %.3g\n", worst);
  EXPECT_LT(worst, 1e-5);
}

// gemm_f32 (the fused block's float32 products of at most 256 inner values, the bias inside oneDNN's brgemm kernel)
// computes LibTorch's product: every transpose, alpha and beta, a bias; then one call inside a parallel region per
// thread. Where oneDNN has no float32 brgemm kernel it must say so (false) and leave C as it was, for the caller's
// sgemm; on a CPU with one (f32_packing_available) it must run. Strided operands are refused.
TEST(F32Products, GemmIsLibTorchsProduct) {
  const bool brgemm = DnnlMatmul::f32_packing_available();
  double worst = 0.0;
  int ran = 0;
  for (const char ta : {'N', 'T'}) {
    for (const char tb : {'N', 'T'}) {
      for (const auto& [alpha, beta, with_bias] :
           {std::tuple<float, float, bool>{1.0f, 0.0f, false}, {0.5f, 1.0f, false}, {1.0f, 0.5f, true}}) {
        const int64_t M = 37, N = 24, K = 53;
        torch::manual_seed(ta * 7 + tb);
        const auto a = ta == 'N' ? torch::randn({M, K}) : torch::randn({K, M});
        const auto b = tb == 'N' ? torch::randn({K, N}) : torch::randn({N, K});
        const auto c0 = torch::randn({M, N});
        const auto bias = with_bias ? torch::randn({N}) : torch::zeros({N});
        const auto expected = alpha * torch::mm(ta == 'N' ? a : a.t(), tb == 'N' ? b : b.t()) + bias + beta * c0;
        auto c = c0.clone();
        if (gemm_f32(ta, tb, M, N, K, alpha, a.data_ptr<float>(), a.size(1), b.data_ptr<float>(), b.size(1), beta,
                     c.data_ptr<float>(), N, with_bias ? bias.data_ptr<float>() : nullptr)) {
          worst = std::max(worst, relative_diff(c, expected));
          ++ran;
        } else {
          EXPECT_TRUE(torch::equal(c, c0)) << ta << tb << ": C written by a product that did not run";
          EXPECT_FALSE(brgemm) << ta << tb << ": no brgemm kernel on a CPU that has them";
        }
      }
    }
  }
  const auto a = torch::randn({64, 32}), b = torch::randn({16, 32}), bias = torch::randn({16});
  auto c = torch::empty({64, 16});
  std::atomic<int> refused{0};
  at::parallel_for(0, 64, 1, [&](int64_t r0, int64_t r1) {
    if (!gemm_f32('N', 'T', r1 - r0, 16, 32, 1.0f, a.data_ptr<float>() + r0 * 32, 32, b.data_ptr<float>(), 32, 0.0f,
                  c.data_ptr<float>() + r0 * 16, 16, bias.data_ptr<float>())) {
      ++refused;
    }
  });
  if (refused == 0) {
    worst = std::max(worst, relative_diff(c, torch::mm(a, b.t()) + bias));
    ++ran;
  }
  EXPECT_TRUE(refused == 0 || !brgemm) << "no brgemm kernel inside a parallel region on a CPU that has them";
  std::printf("gemm_f32 against LibTorch's product: %d of 13 products ran on brgemm, max relative difference %.3g\n",
              ran, worst);
  EXPECT_LT(worst, 1e-5);
  EXPECT_THROW(gemm_f32('N', 'T', 8, 16, 16, 1.0f, a.data_ptr<float>(), 32, b.data_ptr<float>(), 32, 0.0f,
                        c.data_ptr<float>(), 16),
               std::invalid_argument);
}
#endif

// The fused block with its products in bfloat16 (train.amp bf16 on the CPU) stays within bfloat16's rounding of the
// float32 per-operator path, in training: logits and every gradient, on the plain block (narrow plan), at width 256
// (products on all rows), DINOv2 giant's packed SwiGLU and EVA-02's rotary block. And it is not float32: the
// differences are those of 8-bit mantissas, not zero.
TEST(FusedBlock, Bf16ProductsStayWithinBf16RoundingOfFloat32) {
  SKIP_WITHOUT_KERNELS();
  SKIP_WITHOUT_BF16();
  const FusedCase cases[] = {
      {"plain", [](ModelConfig&) {}},
      {"width 256 (products on all rows)", [](ModelConfig& c) { c.embed_dim = 256; }},
      {"packed SwiGLU, LayerScale",
       [](ModelConfig& c) {
         c.mlp_layer = MlpLayer::swiglu_packed, c.act_layer = Activation::silu, c.init_values = 0.1;
       }},
      {"EVA-02's block: rotary cat, q_bias / v_bias",
       [](ModelConfig& c) { c.model_class = ModelClass::eva, c.use_rot_pos_emb = true, c.swiglu_mlp = true; }},
  };
  Threads threads(3);
  for (const auto& fused_case : cases) {
    TrainingCase made = training_case(fused_case);
    const auto expected = made.run(false);
    const auto actual = made.run(true, /*bf16=*/true);
    // The blocks' weight gradients (2-D parameters of the blocks) come from bfloat16 products; the rest through them.
    double worst = 0.0;
    for (size_t i = 0; i < expected.size(); ++i) worst = std::max(worst, relative_diff(actual[i], expected[i]));
    const double logits_diff = relative_diff(actual[0], expected[0]);
    std::printf("fused block in bf16, %s: logits %.3g, worst of logits and gradients %.3g (relative)\n",
                fused_case.name, logits_diff, worst);
    EXPECT_GT(logits_diff, 1e-5) << fused_case.name << ": no bfloat16 rounding at all";
    EXPECT_LT(logits_diff, 5e-3) << fused_case.name;
    EXPECT_LT(worst, 3e-2) << fused_case.name;
  }
}

// train.amp (and bench's --amp) on the CPU: bf16 turns the fused blocks' bfloat16 products on; fp16 is refused
// there, with float32 instead.
TEST(FusedBlock, CpuAmpBf16TurnsOnBf16ProductsAndFp16FallsBackToFloat32) {
  SKIP_WITHOUT_BF16();
  ModelConfig config = test::tiny_vit(/*img=*/16, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/2,
                                      /*embed_dim=*/16, /*depth=*/2, /*num_heads=*/2, /*mlp_ratio=*/2.0);
  VisionTransformer net(config);
  EXPECT_EQ(apply_amp(net, AmpMode::fp16, torch::kCPU, "train.amp"), AmpMode::off);
  for (const auto& module : *net->blocks) EXPECT_FALSE(module->as<Block>()->bf16_products);
  EXPECT_EQ(apply_amp(net, AmpMode::bf16, torch::kCPU, "train.amp"), AmpMode::bf16);
  for (const auto& module : *net->blocks) EXPECT_TRUE(module->as<Block>()->bf16_products);
}

// train.amp auto: bf16 where it trains faster than float32 (CUDA; a CPU with AMX, as oneDNN's bfloat16 kernels
// without AMX ran at 0.62-0.76x float32's img/s), float32 on every other CPU; the other modes pass through as asked.
TEST(Amp, AutoIsBf16OnlyWhereItPays) {
  const bool amx = cpu_has_amx_bf16() && cpu_bf16_refusal().empty();
  std::printf("this CPU: %s; train.amp auto on it: %s\n", cpu_precision_features().c_str(),
              name_of(resolve_amp(AmpMode::automatic, torch::kCPU)));
  EXPECT_EQ(resolve_amp(AmpMode::automatic, torch::kCPU), amx ? AmpMode::bf16 : AmpMode::off);
  EXPECT_EQ(resolve_amp(AmpMode::automatic, torch::Device(torch::kCUDA, 0)), AmpMode::bf16);
  for (const auto mode : {AmpMode::off, AmpMode::bf16, AmpMode::fp16}) {
    EXPECT_EQ(resolve_amp(mode, torch::kCPU), mode);
    EXPECT_EQ(resolve_amp(mode, torch::kCUDA), mode);
  }
  // apply_amp turns the blocks' bfloat16 products on exactly where auto chose bf16.
  ModelConfig config = test::tiny_vit(/*img=*/16, /*patch=*/8, /*in_chans=*/3, /*num_classes=*/2,
                                      /*embed_dim=*/16, /*depth=*/2, /*num_heads=*/2, /*mlp_ratio=*/2.0);
  VisionTransformer net(config);
  EXPECT_EQ(apply_amp(net, AmpMode::automatic, torch::kCPU, "train.amp"), amx ? AmpMode::bf16 : AmpMode::off);
  for (const auto& module : *net->blocks) EXPECT_EQ(module->as<Block>()->bf16_products, amx);
}

}  // namespace
}  // namespace vit
