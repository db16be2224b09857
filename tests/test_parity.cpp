// Parity with timm: the reference model in tests/data/tiny32 (weights and outputs computed by timm) must produce
// the same intermediates, attention and logits through our library within the stated float32 tolerances.
#include <gtest/gtest.h>

#include "config/config.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace vit {
namespace {

using test::data_path;
using test::max_abs_diff;

class TimmParity : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    const auto config = load_config(data_path("tiny32/config.json"));
    model_ = new LoadedModel(load_model(data_path("tiny32/weights.safetensors"), config));
    expected_ = new safetensors::Archive(safetensors::read(data_path("tiny32/expected_tensors.safetensors")));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete expected_;
  }
  torch::Tensor expected(const std::string& name) const { return expected_->tensor(GetParam() + "/" + name); }

  static LoadedModel* model_;
  static safetensors::Archive* expected_;
};
LoadedModel* TimmParity::model_ = nullptr;
safetensors::Archive* TimmParity::expected_ = nullptr;

TEST_P(TimmParity, IntermediatesAttentionAndLogits) {
  torch::NoGradGuard no_grad;
  auto& net = model_->net;
  const auto input = expected("input").unsqueeze(0);  // (1, 3, 32, 32), timm's preprocessed image
  Capture capture;
  capture.attention = true;
  capture.block_outputs = true;
  const auto tokens = net->forward_features(input, {}, &capture);
  const auto logits = net->forward_head(tokens);

  const double embed = max_abs_diff(capture.embed[0], expected("embed"));
  EXPECT_LE(embed, 1e-4) << "embed";
  for (int b = 0; b < 2; ++b) {
    const std::string index = std::to_string(b);
    const double block = max_abs_diff(capture.outputs[b][0], expected("block_out." + index));
    const double attention = max_abs_diff(capture.attention_probs[b][0], expected("attention." + index));
    std::cout << GetParam() << " block " << b << ": max |d| output " << block << ", attention " << attention << "\n";
    EXPECT_LE(block, 1e-4) << "block_out." << b;
    EXPECT_LE(attention, 1e-5) << "attention." << b;
  }
  const double final_norm = max_abs_diff(tokens[0], expected("final_norm"));
  const double cls = max_abs_diff(net->forward_head(tokens, /*pre_logits=*/true)[0], expected("cls_feature"));
  const double logit = max_abs_diff(logits[0], expected("logits"));
  const double prob = max_abs_diff(logits[0].softmax(-1), expected("probs"));
  std::cout << GetParam() << ": max |d| final_norm " << final_norm << ", cls_feature " << cls << ", logits " << logit
            << ", probs " << prob << "\n";
  EXPECT_LE(final_norm, 1e-4);
  EXPECT_LE(cls, 1e-4);
  EXPECT_LE(logit, 1e-4);
  EXPECT_LE(prob, 1e-5);
}

// predict's path (which may use a faster attention kernel) and the explicit path export-attention captures agree.
TEST_P(TimmParity, PlainForwardMatchesCapturedForward) {
  torch::NoGradGuard no_grad;
  const auto input = expected("input").unsqueeze(0);
  Capture capture;
  capture.attention = true;
  const auto with_capture = model_->net->forward_head(model_->net->forward_features(input, {}, &capture));
  const auto plain = model_->net->forward(input);
  EXPECT_LE(test::max_abs_diff(plain, with_capture), 1e-5);
  EXPECT_LE(test::max_abs_diff(plain[0], expected("logits")), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Images, TimmParity, ::testing::Values("synthetic", "chelsea"));

TEST(TimmFile, LoadsWithoutMetadataOnlyWithConfig) {
  try {
    load_model(data_path("tiny32/weights.safetensors"));
    FAIL() << "a plain timm file loaded without --config";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("--config"), std::string::npos) << e.what();
  }
}

TEST(TimmFile, WrongArchitectureListsTensorsByName) {
  auto config = load_config(data_path("tiny32/config.json"), {"model.depth=3", "model.num_classes=7"});
  try {
    load_model(data_path("tiny32/weights.safetensors"), config);
    FAIL() << "mismatched architecture loaded";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("missing: blocks.2."), std::string::npos) << message;
    EXPECT_NE(message.find("head.weight (file [10, 64], model [7, 64])"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace vit
