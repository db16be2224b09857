// The ViT as an ONNX graph, node for node as model/vit.cpp's forward in eval mode (dropout and stochastic depth are
// identities there). No torch header here: see onnx_writer.h.
//
// Shape key as in model/vit.h: B batch (symbolic), C, H, W, P, gh/gw, L = gh*gw patches, N tokens, D, nh, hd, K.
// Between the embedding and the pooling the tokens travel as a (B*N, D) matrix, so every linear layer is one Gemm
// over the weight in its state-dict layout (out, in), with transB instead of a transposed copy. Shapes that depend
// on the batch or the token count are read from the tensors at run time (Shape, Concat), so the same graph serves a
// symbolic height and width (dynamic_size), where the position embedding is resampled inside the graph.
#include "export/onnx_writer.h"

#include <fcntl.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>

#include "vit/build_config.h"

// raw_data holds little-endian float32: the weights' bytes go in as they are in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ONNX writer copies float32 bytes as little-endian");

namespace vit::onnx {
namespace {
namespace proto = ::ONNX_NAMESPACE;

// Opset 17 is the first with LayerNormalization; IR version 8 is the one its ONNX release (1.12) writes, and every
// later onnx / onnxruntime reads it. A dynamic-size file needs opset 18 (IR 8 still), the first whose Resize has
// antialias, which timm's resampling of the position embedding uses.
constexpr int64_t kOpset = 17;
constexpr int64_t kDynamicOpset = 18;
constexpr int64_t kIrVersion = 8;
constexpr const char* kBatch = "batch";
// Initializers of at least this many bytes go to the external data file when there is one (onnx's own
// convert_model_to_external_data default); each starts at a multiple of kExternalAlignment, so that a runtime can map
// it in place.
constexpr size_t kExternalMinBytes = 1024;
constexpr uint64_t kExternalAlignment = 4096;
// Weights above this go to an external data file even unasked: protobuf cannot hold a message over 2 GiB, and the
// graph itself needs room beside them.
constexpr uint64_t kInlineWeightLimit = (uint64_t{1} << 31) - (uint64_t{64} << 20);

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The weights by state-dict name, each checked for its shape where the graph takes it; any left over at the end
// belongs to a feature this writer does not know, which must not vanish silently from the exported model.
class Weights {
 public:
  Weights(const std::map<std::string, Weight>& weights, const std::string& path) : weights_(weights), path_(path) {}

  const Weight& take(const std::string& name, const std::vector<int64_t>& shape) {
    const auto found = weights_.find(name);
    if (found == weights_.end()) fail(path_, "missing weight '" + name + "' " + shape_string(shape));
    const Weight& weight = found->second;
    if (weight.shape != shape) {
      fail(path_, "weight '" + name + "' has shape " + shape_string(weight.shape) + ", the model config expects " +
                      shape_string(shape));
    }
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    if (static_cast<int64_t>(weight.data.size()) != count) {
      fail(path_, "weight '" + name + "' " + shape_string(shape) + " holds " + std::to_string(weight.data.size()) +
                      " values, expected " + std::to_string(count));
    }
    taken_.insert(name);
    return weight;
  }

  void check_all_taken() const {
    for (const auto& [name, weight] : weights_) {
      if (taken_.count(name) == 0) {
        fail(path_, "weight '" + name + "' " + shape_string(weight.shape) +
                        " has no place in the ONNX graph of this model config (a feature the writer does not know)");
      }
    }
  }

 private:
  const std::map<std::string, Weight>& weights_;
  const std::string& path_;
  std::set<std::string> taken_;
};

// A dimension of a graph input or output: a number, or a name for one known only at run time.
struct Dim {
  Dim(int64_t size) : value(size) {}  // NOLINT(google-explicit-constructor): shapes read as {C, H, W}
  Dim(const char* symbol) : name(symbol) {}  // NOLINT(google-explicit-constructor)
  int64_t value = 0;
  std::string name;
};

void set_shape(proto::ValueInfoProto* value, const std::vector<Dim>& dims_after_batch) {
  auto* tensor = value->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(proto::TensorProto::FLOAT);
  auto* shape = tensor->mutable_shape();
  shape->add_dim()->set_dim_param(kBatch);
  for (const Dim& dim : dims_after_batch) {
    if (dim.name.empty()) {
      shape->add_dim()->set_dim_value(dim.value);
    } else {
      shape->add_dim()->set_dim_param(dim.name);
    }
  }
}

// The external data file: the weights' bytes, appended through a temp file that write_onnx renames beside the model.
class DataFile {
 public:
  DataFile(std::string temp, std::string location, const std::string& path)
      : temp_(std::move(temp)), location_(std::move(location)), path_(path) {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(path_, "cannot open " + temp_ + " for writing: " + std::strerror(errno));
  }
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  ~DataFile() {  // not finished: an error on the way, so the temp file goes
    if (fd_ >= 0) ::close(fd_);
    if (!finished_) ::unlink(temp_.c_str());
  }

  // Appends `bytes` at the next aligned offset and points `tensor` at them.
  void put(proto::TensorProto* tensor, const void* data, size_t bytes) {
    const uint64_t offset = (size_ + kExternalAlignment - 1) / kExternalAlignment * kExternalAlignment;
    if (offset > size_) write_all(std::string(offset - size_, '\0').data(), offset - size_);
    write_all(data, bytes);
    tensor->set_data_location(proto::TensorProto::EXTERNAL);
    auto entry = [&](const std::string& key, const std::string& value) {
      auto* e = tensor->add_external_data();
      e->set_key(key);
      e->set_value(value);
    };
    entry("location", location_);
    entry("offset", std::to_string(offset));
    entry("length", std::to_string(bytes));
  }

  // Flushes to disk; the temp file stays until rename() or the destructor.
  void close() {
    if (::fsync(fd_) != 0) fail(path_, "cannot fsync " + temp_ + ": " + std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(path_, "cannot close " + temp_ + ": " + std::strerror(errno));
  }
  void rename(const std::string& target) {
    if (std::rename(temp_.c_str(), target.c_str()) != 0) {
      fail(path_, "cannot rename " + temp_ + " to " + target + ": " + std::strerror(errno));
    }
    finished_ = true;
  }

 private:
  void write_all(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(path_, "cannot write " + temp_ + ": " + std::strerror(n < 0 ? errno : EIO));
      p += n, bytes -= static_cast<size_t>(n), size_ += static_cast<uint64_t>(n);
    }
  }

  std::string temp_, location_;
  const std::string& path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  bool finished_ = false;
};

// Appends nodes and initializers to a graph. Every tensor name is assigned once; a node is named after its output.
class GraphBuilder {
 public:
  // With `data`, float initializers of kExternalMinBytes or more are written there instead of into the graph.
  GraphBuilder(proto::GraphProto* graph, DataFile* data) : graph_(graph), data_(data) {}

  proto::NodeProto* node(const std::string& op, const std::vector<std::string>& inputs, const std::string& output) {
    auto* node = graph_->add_node();
    node->set_op_type(op);
    node->set_name(output);
    for (const auto& input : inputs) node->add_input(input);
    node->add_output(output);
    return node;
  }
  std::string op(const std::string& op, const std::vector<std::string>& inputs, const std::string& output) {
    node(op, inputs, output);
    return output;
  }

  std::string floats(const std::string& name, const std::vector<int64_t>& shape, const float* data, size_t count) {
    auto* tensor = graph_->add_initializer();
    tensor->set_name(name);
    tensor->set_data_type(proto::TensorProto::FLOAT);
    for (int64_t dim : shape) tensor->add_dims(dim);
    if (data_ != nullptr && count * sizeof(float) >= kExternalMinBytes) {
      data_->put(tensor, data, count * sizeof(float));
    } else {
      tensor->set_raw_data(data, count * sizeof(float));
    }
    return name;
  }
  std::string weight(const std::string& name, const Weight& weight) {
    return floats(name, weight.shape, weight.data.data(), weight.data.size());
  }
  // A float scalar constant, shared by every node that uses the same value under the same role. A role asked for
  // with another value is the writer's bug (one role, one value), never a silently shared wrong constant.
  std::string scalar(const std::string& role, float value) {
    const std::string name = "const." + role;
    const auto [it, added] = scalar_values_.emplace(name, value);
    if (added) {
      constants_.insert(name);
      floats(name, {}, &value, 1);
    } else if (it->second != value) {
      throw std::logic_error("onnx writer: constant " + name + " asked for with two values");
    }
    return name;
  }
  // A shape (B, rest...) with B read from the input at run time ("batch_size"), shared by value.
  std::string batch_shape(const std::vector<int64_t>& rest) {
    std::string name = "shape.batch";
    for (int64_t v : rest) {
      name += '.';
      name += std::to_string(v);
    }
    if (constants_.insert(name).second) {
      auto* concat = node("Concat", {"batch_size", ints(rest)}, name);
      auto* a = concat->add_attribute();
      a->set_name("axis");
      a->set_type(proto::AttributeProto::INT);
      a->set_i(0);
    }
    return name;
  }
  // A 1-D int64 constant (a shape, an axis list), shared by value; scalar_index gives a 0-d index for Gather.
  std::string ints(const std::vector<int64_t>& values, bool scalar_index = false) {
    std::string name = scalar_index ? "const.index" : "const.ints";
    for (int64_t v : values) {
      name += '.';  // appended in two steps: GCC 12 in C++20 mode warns falsely on "." + std::string&&
      name += std::to_string(v);
    }
    if (constants_.insert(name).second) {
      auto* tensor = graph_->add_initializer();
      tensor->set_name(name);
      tensor->set_data_type(proto::TensorProto::INT64);
      if (!scalar_index) tensor->add_dims(static_cast<int64_t>(values.size()));
      tensor->set_raw_data(values.data(), values.size() * sizeof(int64_t));
    }
    return name;
  }

 private:
  proto::GraphProto* graph_;
  DataFile* data_;
  std::set<std::string> constants_;
  std::map<std::string, float> scalar_values_;
};

void attribute(proto::NodeProto* node, const std::string& name, int64_t value) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(proto::AttributeProto::INT);
  a->set_i(value);
}
void attribute(proto::NodeProto* node, const std::string& name, float value) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(proto::AttributeProto::FLOAT);
  a->set_f(value);
}
void attribute(proto::NodeProto* node, const std::string& name, const std::string& value) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(proto::AttributeProto::STRING);
  a->set_s(value);
}
void attribute(proto::NodeProto* node, const std::string& name, const std::vector<int64_t>& values) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(proto::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

// The architecture, with the checks the graph relies on (the model validates more; this writer is torch-free).
// H, W, gh, gw, L and N are the trained size's; with `dynamic` the graph takes any multiple of the patch.
struct Geometry {
  int64_t C, H, W, P, gh, gw, L, prefix, N, D, nh, hd, hidden, K;
  int64_t pos_rows;  // rows of pos_embed: L, plus the prefix tokens' unless no_embed_class
  bool dynamic;      // symbolic height and width (opset 18)
  int64_t opset;
};

Geometry geometry(const ModelConfig& m, bool dynamic, const std::string& path) {
  if (m.patch_size <= 0 || m.img_h <= 0 || m.img_w <= 0 || m.img_h % m.patch_size != 0 ||
      m.img_w % m.patch_size != 0) {
    fail(path, "model.img_size " + std::to_string(m.img_h) + "x" + std::to_string(m.img_w) +
                   " is not a positive multiple of patch_size " + std::to_string(m.patch_size));
  }
  if (m.num_heads <= 0 || m.embed_dim <= 0 || m.embed_dim % m.num_heads != 0) {
    fail(path, VIT_MODEL_KEY(num_heads) + " " + std::to_string(m.num_heads) + " does not divide embed_dim " +
                   std::to_string(m.embed_dim));
  }
  if (m.depth < 1 || m.in_chans < 1 || m.num_classes < 0) {
    fail(path, "model depth " + std::to_string(m.depth) + ", in_chans " + std::to_string(m.in_chans) +
                   ", num_classes " + std::to_string(m.num_classes) + " out of range");
  }
  if (m.global_pool == GlobalPool::token && !m.class_token) {
    fail(path, VIT_MODEL_KEY(global_pool) + " \"token\" needs class_token true");
  }
  if (dynamic && m.rel_pos_bias) {
    fail(path, "a dynamic input size cannot hold the relative position bias (" + VIT_MODEL_KEY(rel_pos_bias) +
                   "): its table is gathered per grid; export at a fixed size (--img-size) instead");
  }
  Geometry g{};
  g.dynamic = dynamic;
  g.opset = dynamic ? kDynamicOpset : kOpset;
  g.C = m.in_chans;
  g.H = m.img_h;
  g.W = m.img_w;
  g.P = m.patch_size;
  g.gh = m.grid_h();
  g.gw = m.grid_w();
  g.L = g.gh * g.gw;
  g.prefix = m.num_prefix_tokens();
  g.N = g.L + g.prefix;
  g.pos_rows = g.L + m.pos_embed_prefix();
  g.D = m.embed_dim;
  g.nh = m.num_heads;
  g.hd = m.head_dim();
  g.hidden = m.mlp_hidden();  // as the model's Block
  g.K = m.num_classes;
  return g;
}

// The MLP activation (opset 17 has no Gelu). Exact GELU from Erf, in torch's order: x * 0.5 * (1 + erf(x / sqrt(2)));
// quick_gelu: x * sigmoid(1.702 x); gelu_tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); silu: x * sigmoid(x).
std::string silu(GraphBuilder& b, const std::string& x, const std::string& name);

std::string activation(GraphBuilder& b, const std::string& x, const std::string& name, Activation act) {
  if (act == Activation::silu) return silu(b, x, name);
  if (act == Activation::quick_gelu) {
    auto scaled = b.op("Mul", {x, b.scalar("quick_gelu.scale", 1.702f)}, name + ".scaled");
    auto gate = b.op("Sigmoid", {scaled}, name + ".sigmoid");
    return b.op("Mul", {x, gate}, name);
  }
  auto half_x = b.op("Mul", {x, b.scalar("gelu.half", 0.5f)}, name + ".half_x");
  std::string squashed;
  if (act == Activation::gelu_tanh) {
    auto cube = b.op("Mul", {b.op("Mul", {x, x}, name + ".x2"), x}, name + ".x3");
    auto inner = b.op("Add", {x, b.op("Mul", {cube, b.scalar("gelu_tanh.c", 0.044715f)}, name + ".cx3")},
                      name + ".inner");
    auto scaled = b.op("Mul", {inner, b.scalar("gelu_tanh.k", static_cast<float>(std::sqrt(2.0 / M_PI)))},
                       name + ".scaled");
    squashed = b.op("Tanh", {scaled}, name + ".tanh");
  } else {
    auto scaled = b.op("Mul", {x, b.scalar("gelu.inv_sqrt2", static_cast<float>(M_SQRT1_2))}, name + ".scaled");
    squashed = b.op("Erf", {scaled}, name + ".erf");
  }
  auto one_plus = b.op("Add", {squashed, b.scalar("gelu.one", 1.0f)}, name + ".one_plus");
  return b.op("Mul", {half_x, one_plus}, name);
}

// The mean over one axis, kept as size 1 or dropped (opset 18 moved ReduceMean's axes from an attribute to an input).
std::string reduce_mean(GraphBuilder& b, const std::string& x, const std::string& name, int64_t axis, bool keepdims,
                        int64_t opset) {
  auto* mean = opset >= 18 ? b.node("ReduceMean", {x, b.ints({axis})}, name) : b.node("ReduceMean", {x}, name);
  if (opset < 18) attribute(mean, "axes", std::vector<int64_t>{axis});
  attribute(mean, "keepdims", int64_t{keepdims ? 1 : 0});
  return name;
}

// A norm over the last dim D of x: LayerNormalization, or RmsNorm written out (opset 17 has no RMSNormalization)
// as x / sqrt(mean(x^2) + eps) * weight.
std::string norm(GraphBuilder& b, Weights& w, const std::string& x, const std::string& name, int64_t D, NormLayer kind,
                 double eps, int64_t opset) {
  auto scale = b.weight(name + ".weight", w.take(name + ".weight", {D}));
  if (kind == NormLayer::rmsnorm) {
    auto mean_square =
        reduce_mean(b, b.op("Mul", {x, x}, name + ".squares"), name + ".mean_square", -1, /*keepdims=*/true, opset);
    auto rms = b.op("Sqrt",
                    {b.op("Add", {mean_square, b.scalar("rms_norm.eps", static_cast<float>(eps))}, name + ".plus_eps")},
                    name + ".rms");
    return b.op("Mul", {b.op("Div", {x, rms}, name + ".normed"), scale}, name);
  }
  auto bias = b.weight(name + ".bias", w.take(name + ".bias", {D}));
  auto* node = b.node("LayerNormalization", {x, scale, bias}, name);
  attribute(node, "axis", int64_t{-1});
  attribute(node, "epsilon", static_cast<float>(eps));
  return name;
}

// x (rows, in) @ weight^T + bias: (rows, out).
std::string linear(GraphBuilder& b, Weights& w, const std::string& x, const std::string& name, int64_t in,
                   int64_t out, bool with_bias = true) {
  std::vector<std::string> inputs{x, b.weight(name + ".weight", w.take(name + ".weight", {out, in}))};
  if (with_bias) inputs.push_back(b.weight(name + ".bias", w.take(name + ".bias", {out})));
  attribute(b.node("Gemm", inputs, name), "transB", int64_t{1});
  return name;
}

// The position embedding for the input's grid, as the model's resample_pos_embed (timm's resample_abs_pos_embed):
// the grid rows as a (1, D, gh0, gw0) image, bicubic with antialias (a = -0.5, taps outside the image left out and
// the rest renormalised, half-pixel centres, as torch's antialiased kernel), the prefix rows kept:
// (1, pos_rows, D) -> (1, [prefix +] gh*gw, D). At the trained grid the Resize is the identity.
std::string resampled_pos_embed(GraphBuilder& b, const std::string& pos, const Geometry& g, const ModelConfig& m) {
  const int64_t prefix_rows = m.pos_embed_prefix();
  std::string grid_rows = pos;
  if (prefix_rows > 0) {
    grid_rows = b.op("Slice", {pos, b.ints({prefix_rows}), b.ints({g.pos_rows}), b.ints({1})}, "pos_embed.grid_rows");
  }
  auto grid = b.op("Reshape", {grid_rows, b.ints({1, g.gh, g.gw, g.D})}, "pos_embed.grid_nhwc");
  // (1, D, gh0, gw0)
  attribute(b.node("Transpose", {grid}, "pos_embed.grid"), "perm", std::vector<int64_t>{0, 3, 1, 2});
  auto* new_grid = b.node("Shape", {"patch_embed.proj"}, "pos_embed.new_grid");  // [gh, gw] of this input
  attribute(new_grid, "start", int64_t{2});
  attribute(new_grid, "end", int64_t{4});
  attribute(b.node("Concat", {b.ints({1, g.D}), "pos_embed.new_grid"}, "pos_embed.sizes"), "axis", int64_t{0});
  auto* resize = b.node("Resize", {"pos_embed.grid", "", "", "pos_embed.sizes"}, "pos_embed.resized");
  attribute(resize, "mode", std::string("cubic"));
  attribute(resize, "cubic_coeff_a", -0.5f);
  attribute(resize, "antialias", int64_t{1});
  attribute(resize, "exclude_outside", int64_t{1});
  attribute(resize, "coordinate_transformation_mode", std::string("half_pixel"));
  auto flat = b.op("Reshape", {"pos_embed.resized", b.ints({1, g.D, -1})}, "pos_embed.resized_flat");  // (1, D, L)
  attribute(b.node("Transpose", {flat}, "pos_embed.resized_rows"), "perm", std::vector<int64_t>{0, 2, 1});
  if (prefix_rows == 0) return "pos_embed.resized_rows";
  auto prefix = b.op("Slice", {pos, b.ints({0}), b.ints({prefix_rows}), b.ints({1})}, "pos_embed.prefix_rows");
  attribute(b.node("Concat", {prefix, "pos_embed.resized_rows"}, "pos_embed.for_input"), "axis", int64_t{1});
  return "pos_embed.for_input";
}

// Patch embedding, prefix tokens (class, registers), position embedding and norm_pre: pixel_values -> (B*N, D).
std::string embed(GraphBuilder& b, Weights& w, const std::string& pixels, const Geometry& g, const ModelConfig& m) {
  // A stride-P P x P convolution, the weight in its state-dict layout (D, C, P, P); no bias with pre_norm.
  std::vector<std::string> conv_inputs{pixels, b.weight("patch_embed.proj.weight",
                                                        w.take("patch_embed.proj.weight", {g.D, g.C, g.P, g.P}))};
  if (!m.pre_norm) conv_inputs.push_back(b.weight("patch_embed.proj.bias", w.take("patch_embed.proj.bias", {g.D})));
  auto* conv = b.node("Conv", conv_inputs, "patch_embed.proj");  // (B, D, gh, gw)
  attribute(conv, "kernel_shape", std::vector<int64_t>{g.P, g.P});
  attribute(conv, "strides", std::vector<int64_t>{g.P, g.P});
  auto flat = b.op("Reshape", {"patch_embed.proj", b.ints({0, g.D, -1})}, "patch_embed.flat");  // (B, D, L)
  auto* rows = b.node("Transpose", {flat}, "patch_embed");  // (B, L, D), row by row
  attribute(rows, "perm", std::vector<int64_t>{0, 2, 1});
  std::string tokens = "patch_embed";
  if (m.embed_norm_layer) {
    tokens = norm(b, w, tokens, "patch_embed.norm", g.D, *m.embed_norm_layer, m.layer_norm_eps, g.opset);
  }
  std::string pos;  // none without use_abs_pos_emb (rotary embeddings only)
  if (m.use_abs_pos_emb) {
    pos = b.weight("pos_embed", w.take("pos_embed", {1, g.pos_rows, g.D}));
    if (g.dynamic) pos = resampled_pos_embed(b, pos, g, m);
  }
  // no_embed_class: the position embedding covers the patches only, added before the prefix tokens join (DeiT-3).
  if (m.no_embed_class && !pos.empty()) tokens = b.op("Add", {tokens, pos}, "patch_embed.pos");
  if (g.prefix) {
    // Prefix tokens broadcast over the batch: Expand to (B, n, D), B read from the input at run time.
    std::vector<std::string> parts;
    auto prefix_tokens = [&](const std::string& name, int64_t count) {
      attribute(b.node("Concat", {"batch_size", b.ints({count, g.D})}, name + ".shape"), "axis", int64_t{0});
      parts.push_back(b.op("Expand", {b.weight(name, w.take(name, {1, count, g.D})), name + ".shape"},
                           name + ".batch"));  // (B, count, D)
    };
    if (m.class_token) prefix_tokens("cls_token", 1);
    if (m.reg_tokens > 0) prefix_tokens("reg_token", m.reg_tokens);
    parts.push_back(tokens);
    attribute(b.node("Concat", parts, "tokens.with_prefix"), "axis", int64_t{1});  // (B, N, D)
    tokens = "tokens.with_prefix";
  }
  std::string added = m.no_embed_class || pos.empty() ? tokens : b.op("Add", {tokens, pos}, "embed");  // (B, N, D)
  if (m.pre_norm) added = norm(b, w, added, "norm_pre", g.D, m.norm_layer, m.layer_norm_eps, g.opset);
  return b.op("Reshape", {added, b.ints({-1, g.D})}, "embed.rows");  // (B*N, D)
}

struct BlockOptions {
  bool qkv_bias = true, layer_scale = false, rel_pos_bias = false, qk_norm = false;
  Activation act = Activation::gelu;
  double eps = 1e-6;
  std::string probs_output;  // the softmax's tensor name: "attention.{i}" when it is a graph output
  const ModelConfig* model = nullptr;  // timm's Eva options (model_class eva)
  std::string rope_sin, rope_cos;  // this block's rotary constants, (Np, hd) or (nh, Np, hd); empty without
  int64_t kv_heads = 0;            // this block's key/value heads (fewer than nh: grouped-query attention)
};

// silu(x) = x * sigmoid(x).
std::string silu(GraphBuilder& b, const std::string& x, const std::string& name) {
  return b.op("Mul", {x, b.op("Sigmoid", {x}, name + ".sigmoid")}, name);
}

// The patch tokens of x (B, nh, N, hd) rotated by their positions as model/rope.h's apply_rope: x * cos +
// rotate(x) * sin, the prefix tokens passed through.
std::string rotate(GraphBuilder& b, const std::string& x, const std::string& name, const Geometry& g,
                   const BlockOptions& o) {
  const int64_t half = g.hd / 2;
  auto patches = b.op("Slice", {x, b.ints({g.prefix}), b.ints({INT64_MAX}), b.ints({2})}, name + ".patches");
  const std::string rotated = name + ".rotated";
  if (o.model->rope_rotate_half) {  // [-x_{hd/2..}, x_{..hd/2}]
    auto first = b.op("Slice", {patches, b.ints({0}), b.ints({half}), b.ints({3})}, name + ".first");
    auto second = b.op("Slice", {patches, b.ints({half}), b.ints({g.hd}), b.ints({3})}, name + ".second");
    attribute(b.node("Concat", {b.op("Neg", {second}, name + ".second_neg"), first}, rotated), "axis", int64_t{3});
  } else {  // [-x1, x0, -x3, x2, ...]
    auto pairs = b.op("Reshape", {patches, b.ints({0, 0, 0, half, 2})}, name + ".pairs");
    auto even = b.op("Slice", {pairs, b.ints({0}), b.ints({1}), b.ints({4})}, name + ".even");
    auto odd = b.op("Slice", {pairs, b.ints({1}), b.ints({2}), b.ints({4})}, name + ".odd");
    attribute(b.node("Concat", {b.op("Neg", {odd}, name + ".odd_neg"), even}, name + ".swapped"), "axis", int64_t{4});
    b.op("Reshape", {name + ".swapped", b.ints({0, 0, 0, g.hd})}, rotated);
  }
  auto out = b.op(
      "Add", {b.op("Mul", {patches, o.rope_cos}, name + ".cos"), b.op("Mul", {rotated, o.rope_sin}, name + ".sin")},
      name + ".patches_rotated");
  if (g.prefix == 0) return out;
  auto prefix = b.op("Slice", {x, b.ints({0}), b.ints({g.prefix}), b.ints({2})}, name + ".prefix");
  attribute(b.node("Concat", {prefix, out}, name), "axis", int64_t{2});
  return name;
}

// --dynamic-size with rotary embeddings: the per-patch coordinates (Np) of the rotary grid's two channels for the
// input's grid, computed in the graph as model/rope.h's embed computes them (patch indices, + rope_grid_offset,
// scaled to ref_feat_shape; or DINOv3's normalised patch centres), row by row.
std::array<std::string, 2> rotary_coordinates(GraphBuilder& b, const ModelConfig& m) {
  auto* grid = b.node("Shape", {"patch_embed.proj"}, "rope.grid");  // [gh, gw] of this input
  attribute(grid, "start", int64_t{2});
  attribute(grid, "end", int64_t{4});
  // One axis's values for `size` positions (scalar int64): its channel's rule, `ref` its ref_feat_shape side.
  auto axis_values = [&](int64_t axis, int64_t ref, const std::string& name) {
    attribute(b.node("Gather", {"rope.grid", b.ints({axis}, /*scalar_index=*/true)}, name + ".size"), "axis",
              int64_t{0});
    attribute(b.node("Cast", {name + ".size"}, name + ".size_f"), "to", int64_t{proto::TensorProto::FLOAT});
    const std::string size_f = name + ".size_f";
    std::string t;
    if (m.rope_type == RopeType::dinov3) {  // (arange(0.5, s) + offset) / s, then to [-1, 1]
      t = b.op("Range", {b.scalar("rope.half", 0.5f), size_f, b.scalar("rope.one", 1.0f)}, name + ".range");
      if (m.rope_grid_offset != 0.0) {
        t = b.op("Add", {t, b.scalar("rope.offset", static_cast<float>(m.rope_grid_offset))}, name + ".offset");
      }
      t = b.op("Div", {t, size_f}, name + ".unit");
      t = b.op("Sub", {b.op("Mul", {t, b.scalar("rope.two", 2.0f)}, name + ".twice"), b.scalar("rope.one", 1.0f)},
               name);
      return t;
    }
    // Patch indices (+ offset; mixed has none), rescaled to the reference grid when there is one.
    b.node("Range", {b.ints({0}, /*scalar_index=*/true), name + ".size", b.ints({1}, /*scalar_index=*/true)},
           name + ".index");
    attribute(b.node("Cast", {name + ".index"}, name + ".index_f"), "to", int64_t{proto::TensorProto::FLOAT});
    t = name + ".index_f";
    if (m.rope_type == RopeType::cat && m.rope_grid_offset != 0.0) {
      t = b.op("Add", {t, b.scalar("rope.offset", static_cast<float>(m.rope_grid_offset))}, name + ".offset");
    }
    if (m.rope_type == RopeType::cat && ref > 0) {
      t = b.op("Mul",
               {b.op("Div", {t, size_f}, name + ".unit"),
                b.scalar("rope.ref." + std::to_string(ref), static_cast<float>(ref))},
               name + ".ref");
    }
    return b.op("Identity", {t}, name);
  };
  // The rows' values (with ref_feat_shape's height) and the columns' (its width); ij makes channel 0 the row's,
  // xy the column's.
  const bool ij = m.rope_grid_indexing == GridIndexing::ij;
  const auto rows = axis_values(0, m.ref_feat_h, "rope.rows");
  const auto cols = axis_values(1, m.ref_feat_w, "rope.cols");
  auto spread = [&](const std::string& values, int64_t axis, const std::string& name) {  // -> (Np), row by row
    auto grid2d =
        b.op("Expand", {b.op("Unsqueeze", {values, b.ints({axis})}, name + ".axis"), "rope.grid"}, name + ".grid");
    return b.op("Reshape", {grid2d, b.ints({-1})}, name);
  };
  const auto row_of = spread(rows, 1, "rope.row_of"), col_of = spread(cols, 0, "rope.col_of");
  return ij ? std::array<std::string, 2>{row_of, col_of} : std::array<std::string, 2>{col_of, row_of};
}

// The rotary sin and cos for the input's grid from its coordinates: cat's and dinov3's (Np, hd) from the model's
// frequencies, or with rope_type mixed block i's (nh, Np, hd) from rope.freqs. Returns their names.
std::array<std::string, 2> rotary_tables(GraphBuilder& b, Weights& w, const std::array<std::string, 2>& coords,
                                         const Geometry& g, const ModelConfig& m, int64_t block,
                                         const std::string& name) {
  const int64_t half = g.hd / 2;
  std::string angles;  // (Np, hd/2) or (nh, Np, hd/2)
  if (m.rope_type == RopeType::mixed) {
    // t_x * freqs[0][block] + t_y * freqs[1][block], each (nh, 1, hd/2) from the parameter.
    const Weight& freqs = w.take("rope.freqs", {2, m.depth, g.nh, half});
    std::string terms[2];
    for (int64_t c = 0; c < 2; ++c) {
      const float* f = freqs.data.data() + (c * m.depth + block) * g.nh * half;
      const auto axis = std::string(c == 0 ? ".fx" : ".fy");
      auto t = b.op("Unsqueeze", {coords[c], b.ints({0, 2})}, name + axis + ".t");  // (1, Np, 1)
      terms[c] = b.op("Mul", {t, b.floats(name + axis, {g.nh, 1, half}, f, static_cast<size_t>(g.nh * half))},
                      name + axis + ".angles");
    }
    angles = b.op("Add", {terms[0], terms[1]}, name + ".angles");
  } else {
    const std::string frequencies = b.weight("rope.frequencies", w.take("rope.frequencies", {g.hd / 4}));
    std::vector<std::string> parts;
    for (int64_t c = 0; c < 2; ++c) {
      const std::string axis = name + (c == 0 ? ".a0" : ".a1");
      auto t = b.op("Unsqueeze", {coords[c], b.ints({1})}, axis + ".t");  // (Np, 1)
      if (m.rope_type == RopeType::cat) {
        parts.push_back(b.op("Mul", {t, frequencies}, axis));  // index * band
      } else {
        // 2 pi * coordinate / period
        auto scaled = b.op("Mul", {t, b.scalar("rope.two_pi", static_cast<float>(2.0 * M_PI))}, axis + ".scaled");
        parts.push_back(b.op("Div", {scaled, frequencies}, axis));
      }
    }
    attribute(b.node("Concat", parts, name + ".angles"), "axis", int64_t{-1});
    angles = name + ".angles";
  }
  // The layout apply_rope reads: [f0, f1, .., f0, f1, ..] with rope_rotate_half, else [f0, f0, f1, f1, ..].
  auto layout = [&](const std::string& values, const std::string& out) {
    if (m.rope_rotate_half) {
      attribute(b.node("Concat", {values, values}, out), "axis", int64_t{-1});
      return out;
    }
    auto column = b.op("Unsqueeze", {values, b.ints({-1})}, out + ".column");
    attribute(b.node("Concat", {column, column}, out + ".pairs"), "axis", int64_t{-1});
    return b.op("Reshape", {out + ".pairs", m.rope_type == RopeType::mixed ? b.ints({0, 0, g.hd}) : b.ints({0, g.hd})},
                out);
  };
  return {layout(b.op("Sin", {angles}, name + ".sin_half"), name + ".sin"),
          layout(b.op("Cos", {angles}, name + ".cos_half"), name + ".cos")};
}

// The q, k, v projections of h (B*N, D) side by side, (B*N, 3D): one qkv (with its bias, Eva's q_bias / 0 / v_bias,
// or none), or Eva's q_proj, k_proj, v_proj.
std::string project_qkv(GraphBuilder& b, Weights& w, const std::string& h, const std::string& p, const Geometry& g,
                        const BlockOptions& o) {
  const ModelConfig& m = *o.model;
  if (!m.qkv_fused) {
    const bool k_bias = m.qkv_bias && m.attn_type != AttnType::eva;
    std::vector<std::string> parts{linear(b, w, h, p + "attn.q_proj", g.D, g.D, m.qkv_bias),
                                   linear(b, w, h, p + "attn.k_proj", g.D, g.D, k_bias),
                                   linear(b, w, h, p + "attn.v_proj", g.D, g.D, m.qkv_bias)};
    attribute(b.node("Concat", parts, p + "attn.qkv"), "axis", int64_t{1});
    return p + "attn.qkv";
  }
  if (!m.eva_qkv_bias()) return linear(b, w, h, p + "attn.qkv", g.D, 3 * g.D, o.qkv_bias);
  const Weight& q_bias = w.take(p + "attn.q_bias", {g.D});
  const Weight& v_bias = w.take(p + "attn.v_bias", {g.D});
  std::vector<float> bias(static_cast<size_t>(3 * g.D), 0.0f);
  std::copy(q_bias.data.begin(), q_bias.data.end(), bias.begin());
  std::copy(v_bias.data.begin(), v_bias.data.end(), bias.begin() + 2 * g.D);
  std::vector<std::string> inputs{h, b.weight(p + "attn.qkv.weight", w.take(p + "attn.qkv.weight", {3 * g.D, g.D})),
                                  b.floats(p + "attn.qkv_bias", {3 * g.D}, bias.data(), bias.size())};
  attribute(b.node("Gemm", inputs, p + "attn.qkv"), "transB", int64_t{1});
  return p + "attn.qkv";
}

// The MLP over (B*N, D) rows: fc1, act, fc2; or SwiGLU (packed fc1 of gate then value rows, or fc1_g and fc1_x);
// mlp.norm on the hidden activations with scale_mlp.
std::string mlp(GraphBuilder& b, Weights& w, const std::string& x, const std::string& p, const Geometry& g,
                const BlockOptions& o) {
  const ModelConfig& m = *o.model;
  const bool bias = m.proj_bias;
  const Activation gate_act = m.gate_activation();
  std::string h;
  if (!m.gated_mlp()) {
    h = activation(b, linear(b, w, x, p + "mlp.fc1", g.D, g.hidden, bias), p + "mlp.act", o.act);
  } else if (m.swiglu_split()) {
    auto gate = activation(b, linear(b, w, x, p + "mlp.fc1_g", g.D, g.hidden, bias), p + "mlp.gate", gate_act);
    h = b.op("Mul", {gate, linear(b, w, x, p + "mlp.fc1_x", g.D, g.hidden, bias)}, p + "mlp.act");
  } else {
    auto both = linear(b, w, x, p + "mlp.fc1", g.D, 2 * g.hidden, bias);
    auto gate = b.op("Slice", {both, b.ints({0}), b.ints({g.hidden}), b.ints({1})}, p + "mlp.fc1.gate");
    auto value = b.op("Slice", {both, b.ints({g.hidden}), b.ints({2 * g.hidden}), b.ints({1})}, p + "mlp.fc1.value");
    h = b.op("Mul", {activation(b, gate, p + "mlp.gate", gate_act), value}, p + "mlp.act");
  }
  if (m.scale_mlp) h = norm(b, w, h, p + "mlp.norm", g.hidden, o.model->norm_layer, o.eps, g.opset);
  return linear(b, w, h, p + "mlp.fc2", g.hidden, g.D, bias);
}

// One transformer block over (B*N, D) rows: x + ls1(attn(norm1(x))), then the same for the MLP.
std::string block(GraphBuilder& b, Weights& w, const std::string& x, const std::string& p, const Geometry& g,
                  const BlockOptions& o) {
  // use_post_norm (EvaBlockPostNorm): the norms after the branches, x + norm1(attn(x)).
  const bool post = o.model->use_post_norm;
  auto block_norm = [&](const std::string& t, const char* name) {
    return norm(b, w, t, p + name, g.D, o.model->norm_layer, o.eps, g.opset);
  };
  auto h = post ? x : block_norm(x, "norm1");
  const bool grouped = o.kv_heads != g.nh;
  std::string q, k, v;  // (B, nh, N, hd); k and v (B, kv_heads, N, hd) with grouped-query attention
  if (grouped) {
    // AttentionRope's q_proj, k_proj, v_proj, the last two of kv_heads * hd rows.
    const int64_t kv = o.kv_heads * g.hd;
    auto heads = [&](const std::string& rows, int64_t count, const std::string& name) {
      auto split = b.op("Reshape", {rows, b.batch_shape({-1, count, g.hd})}, p + name + ".heads");  // (B, N, c, hd)
      attribute(b.node("Transpose", {split}, p + name), "perm", std::vector<int64_t>{0, 2, 1, 3});
      return p + name;  // (B, count, N, hd)
    };
    const bool bias = o.model->qkv_bias;
    q = heads(linear(b, w, h, p + "attn.q_proj", g.D, g.D, bias), g.nh, "attn.q");
    k = heads(linear(b, w, h, p + "attn.k_proj", g.D, kv, bias), o.kv_heads, "attn.k");
    v = heads(linear(b, w, h, p + "attn.v_proj", g.D, kv, bias), o.kv_heads, "attn.v");
  } else {
    // (B*N, 3D)
    const auto qkv = project_qkv(b, w, h, p, g, o);
    auto heads = b.op("Reshape", {qkv, b.batch_shape({-1, 3, g.nh, g.hd})}, p + "attn.qkv.heads");  // (B, N, 3, nh, hd)
    attribute(b.node("Transpose", {heads}, p + "attn.qkv.split"), "perm", std::vector<int64_t>{2, 0, 3, 1, 4});
    const std::string split = p + "attn.qkv.split";  // (3, B, nh, N, hd)
    auto take = [&](int64_t i, const std::string& name) {
      attribute(b.node("Gather", {split, b.ints({i}, /*scalar_index=*/true)}, p + name), "axis", int64_t{0});
      return p + name;  // (B, nh, N, hd)
    };
    q = take(0, "attn.q"), k = take(1, "attn.k"), v = take(2, "attn.v");
  }
  if (o.qk_norm) {  // LayerNorm over each head's hd features
    q = norm(b, w, q, p + "attn.q_norm", g.hd, o.model->norm_layer, o.eps, g.opset);
    k = norm(b, w, k, p + "attn.k_norm", g.hd, o.model->norm_layer, o.eps, g.opset);
  }
  if (!o.rope_sin.empty()) q = rotate(b, q, p + "attn.q_rope", g, o), k = rotate(b, k, p + "attn.k_rope", g, o);
  if (grouped) {
    // Each key/value head repeated for its nh / kv_heads query heads in a row (repeat_interleave over the heads).
    auto repeat = [&](const std::string& t, const std::string& name) {
      auto one = b.op("Unsqueeze", {t, b.ints({2})}, p + name + ".axis");  // (B, kv_heads, 1, N, hd)
      auto tiled = b.op("Tile", {one, b.ints({1, 1, g.nh / o.kv_heads, 1, 1})}, p + name + ".tiled");
      return b.op("Reshape", {tiled, b.ints({0, g.nh, -1, g.hd})}, p + name);  // (B, nh, N, hd)
    };
    k = repeat(k, "attn.k_grouped"), v = repeat(v, "attn.v_grouped");
  }
  // As the model's explicit path: scale q, q @ k^T, (+ relative bias), softmax over keys.
  auto q_scaled =
      b.op("Mul", {q, b.scalar("attn.scale", static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.hd))))},
           p + "attn.q_scaled");
  attribute(b.node("Transpose", {k}, p + "attn.k_t"), "perm", std::vector<int64_t>{0, 1, 3, 2});  // (B, nh, hd, N)

  auto logits = b.op("MatMul", {q_scaled, p + "attn.k_t"}, p + "attn.logits");                   // (B, nh, N, N)
  if (o.rel_pos_bias) {
    // The table is the trained parameter; the graph adds the (nh, N, N) bias the model gathers from it at this grid,
    // which the caller computes with the model itself (ExportInput's comment), so the index rule lives in one place.
    const int64_t entries = (2 * g.gh - 1) * (2 * g.gw - 1) + (g.prefix ? 3 : 0);
    w.take(p + "attn.relative_position_bias_table", {entries, g.nh});
    const Weight& bias = w.take(p + "attn.relative_position_bias", {g.nh, g.N, g.N});
    auto constant = b.floats(p + "attn.relative_position_bias", {g.nh, g.N, g.N}, bias.data.data(), bias.data.size());
    logits = b.op("Add", {logits, constant}, p + "attn.logits_biased");
  }
  attribute(b.node("Softmax", {logits}, o.probs_output), "axis", int64_t{-1});
  auto context = b.op("MatMul", {o.probs_output, v}, p + "attn.context");  // (B, nh, N, hd)
  attribute(b.node("Transpose", {context}, p + "attn.merge"), "perm", std::vector<int64_t>{0, 2, 1, 3});
  auto merged = b.op("Reshape", {p + "attn.merge", b.ints({-1, g.D})}, p + "attn.merged");  // (B*N, D)
  if (o.model->scale_attn_inner) merged = norm(b, w, merged, p + "attn.norm", g.D, o.model->norm_layer, o.eps, g.opset);
  auto a = linear(b, w, merged, p + "attn.proj", g.D, g.D, o.model->proj_bias);
  if (post) a = block_norm(a, "norm1");
  // LayerScale: ls1.gamma / ls2.gamma, or Eva's gamma_1 / gamma_2 (gamma_2 absent with attn_only_layer_scale).
  const bool eva = o.model->model_class == ModelClass::eva;
  auto scale = [&](const std::string& branch, const std::string& vit_name, const std::string& eva_name,
                   const std::string& output) {
    const std::string name = p + (eva ? eva_name : vit_name);
    return b.op("Mul", {branch, b.weight(name, w.take(name, {g.D}))}, p + output);
  };
  if (o.layer_scale) a = scale(a, "ls1.gamma", "gamma_1", "ls1");
  auto y = b.op("Add", {x, a}, p + "attn.residual");

  auto m = mlp(b, w, post ? y : block_norm(y, "norm2"), p, g, o);
  if (post) m = block_norm(m, "norm2");
  if (o.layer_scale && !(eva && o.model->attn_only_layer_scale)) m = scale(m, "ls2.gamma", "gamma_2", "ls2");
  return b.op("Add", {y, m}, p + "output");
}

// global_pool "map": the latent query attends over the patch tokens (B, Np, D), then proj and x + mlp(norm(x)):
// -> (B, D). The softmax is named `probs_output`.
std::string attention_pool(GraphBuilder& b, Weights& w, const std::string& patches, const Geometry& g,
                           const ModelConfig& m, const std::string& probs_output) {
  const std::string p = "attn_pool.";
  const int64_t nh = m.pool_heads(), hd = g.D / nh, hidden = m.pool_hidden();
  auto latent = b.op("Reshape", {b.weight(p + "latent", w.take(p + "latent", {1, 1, g.D})), b.ints({1, g.D})},
                     p + "latent.row");                                      // (1, D)
  auto q = linear(b, w, latent, p + "q", g.D, g.D);                          // (1, D), the same for every image
  auto q_heads = b.op("Reshape", {q, b.ints({1, nh, 1, hd})}, p + "q.heads");  // (1, nh, 1, hd)
  auto q_scaled =
      b.op("Mul", {q_heads, b.scalar("attn_pool.scale", static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))))},
           p + "q.scaled");
  auto rows = b.op("Reshape", {patches, b.ints({-1, g.D})}, p + "x.rows");  // (B*Np, D)
  auto kv = linear(b, w, rows, p + "kv", g.D, 2 * g.D);                     // (B*Np, 2D)
  auto kv_heads = b.op("Reshape", {kv, b.batch_shape({-1, 2, nh, hd})}, p + "kv.heads");
  attribute(b.node("Transpose", {kv_heads}, p + "kv.split"), "perm", std::vector<int64_t>{2, 0, 3, 1, 4});
  auto take = [&](int64_t i, const std::string& name) {
    attribute(b.node("Gather", {p + "kv.split", b.ints({i}, /*scalar_index=*/true)}, p + name), "axis", int64_t{0});
    return p + name;  // (B, nh, Np, hd)
  };
  auto k = take(0, "k"), v = take(1, "v");
  attribute(b.node("Transpose", {k}, p + "k_t"), "perm", std::vector<int64_t>{0, 1, 3, 2});  // (B, nh, hd, Np)
  auto logits = b.op("MatMul", {q_scaled, p + "k_t"}, p + "logits");                        // (B, nh, 1, Np)
  attribute(b.node("Softmax", {logits}, probs_output), "axis", int64_t{-1});
  auto context = b.op("MatMul", {probs_output, v}, p + "context");  // (B, nh, 1, hd)
  attribute(b.node("Transpose", {context}, p + "merge"), "perm", std::vector<int64_t>{0, 2, 1, 3});
  auto merged = b.op("Reshape", {p + "merge", b.ints({-1, g.D})}, p + "merged");  // (B, D)
  auto x = linear(b, w, merged, p + "proj", g.D, g.D);
  auto h = norm(b, w, x, p + "norm", g.D, m.norm_layer, m.layer_norm_eps, g.opset);
  h = linear(b, w, h, p + "mlp.fc1", g.D, hidden);
  h = activation(b, h, p + "mlp.act", m.act_layer);
  h = linear(b, w, h, p + "mlp.fc2", hidden, g.D);
  return b.op("Add", {x, h}, p + "output");  // (B, D)
}

// The final norm (norm on the tokens, or fc_norm after pooling, or neither), the pool (class token, mean of the
// patch tokens, or attn_pool over them), the head: (B*N, D) -> (B, K), or (B, D) without a head.
std::string head(GraphBuilder& b, Weights& w, const std::string& x, const Geometry& g, const ModelConfig& m,
                 const std::string& output, const std::string& pool_probs) {
  auto tokens = b.op("Reshape", {x, b.batch_shape({-1, g.D})}, "tokens");  // (B, N, D)
  // The final norm acts on each token alone, so normalising only the tokens the pool reads gives the model's numbers.
  const bool token_norm = m.final_norm && !m.use_fc_norm();
  std::string pooled;
  if (m.global_pool == GlobalPool::token) {
    attribute(b.node("Gather", {tokens, b.ints({0}, /*scalar_index=*/true)}, "pooled"), "axis", int64_t{1});
    pooled = token_norm ? norm(b, w, "pooled", "norm", g.D, m.norm_layer, m.layer_norm_eps, g.opset) : "pooled";
  } else {
    // Eva's MAP head attends over every token (ModelConfig::pool_includes_prefix).
    const int64_t skip = m.global_pool == GlobalPool::map && m.pool_includes_prefix() ? 0 : g.prefix;
    std::string patches = b.op("Slice", {tokens, b.ints({skip}), b.ints({INT64_MAX}), b.ints({1})}, "patch_tokens");
    if (token_norm) patches = norm(b, w, patches, "norm", g.D, m.norm_layer, m.layer_norm_eps, g.opset);  // (B, Np, D)
    if (m.global_pool == GlobalPool::map) {
      pooled = attention_pool(b, w, patches, g, m, pool_probs);
    } else {
      pooled = reduce_mean(b, patches, "pooled", 1, /*keepdims=*/false, g.opset);  // (B, D)
    }
  }
  if (m.final_norm && m.use_fc_norm()) {
    pooled = norm(b, w, pooled, "fc_norm", g.D, m.norm_layer, m.layer_norm_eps, g.opset);
  }
  if (g.K == 0) return b.op("Identity", {pooled}, output);
  std::vector<std::string> inputs{pooled, b.weight("head.weight", w.take("head.weight", {g.K, g.D})),
                                  b.weight("head.bias", w.take("head.bias", {g.K}))};
  attribute(b.node("Gemm", inputs, output), "transB", int64_t{1});
  return output;
}

// Streams the serialised model to a sibling temp file, then renames it over `path` (the external data file first, when
// there is one): no second in-memory copy of the weights, and a failure leaves neither a partial file nor the temp
// files behind.
void write_atomic(const proto::ModelProto& model, const std::string& path, DataFile* data) {
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot open " + temp + " for writing: " + std::strerror(errno));
  auto abandon = [&](const std::string& what, int error_number) {
    ::close(fd);
    ::unlink(temp.c_str());
    fail(path, what + (error_number ? std::string(": ") + std::strerror(error_number) : std::string()));
  };
  {
    google::protobuf::io::FileOutputStream out(fd);
    if (!model.SerializeToZeroCopyStream(&out) || !out.Flush()) abandon("cannot write " + temp, out.GetErrno());
  }
  // Without fsync a crash after the rename can leave the final name pointing at a partial file.
  if (::fsync(fd) != 0) abandon("cannot fsync " + temp, errno);
  if (::close(fd) != 0) {
    const int error_number = errno;
    ::unlink(temp.c_str());
    fail(path, "cannot close " + temp + ": " + std::strerror(error_number));
  }
  if (data != nullptr) {
    try {
      data->rename(external_data_path(path));
    } catch (...) {
      ::unlink(temp.c_str());
      throw;
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error_number = errno;
    ::unlink(temp.c_str());
    fail(path, "cannot rename " + temp + " over it: " + std::strerror(error_number));
  }
}

}  // namespace

std::string external_data_path(const std::string& path) { return path + ".data"; }

bool needs_external_data(uint64_t weight_bytes) { return weight_bytes > kInlineWeightLimit; }

std::vector<std::string> write_onnx(const ExportInput& input, const std::string& path) {
  const ModelConfig& m = input.model;
  const Geometry g = geometry(m, input.dynamic_size, path);
  Weights w(input.weights, path);
  uint64_t weight_bytes = 0;
  for (const auto& [name, weight] : input.weights) weight_bytes += weight.data.size() * sizeof(float);
  std::unique_ptr<DataFile> data;
  if (input.external_data || needs_external_data(weight_bytes)) {
    const std::string target = external_data_path(path);
    const auto slash = target.find_last_of('/');
    data = std::make_unique<DataFile>(target + ".tmp." + std::to_string(::getpid()),
                                      slash == std::string::npos ? target : target.substr(slash + 1), path);
  }

  proto::ModelProto model;
  model.set_ir_version(kIrVersion);
  model.set_producer_name("vit");
  model.set_producer_version(VIT_VERSION);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(g.opset);
  std::set<std::string> keys;
  for (const auto& [key, value] : input.metadata) {
    // onnx's checker rejects a model whose metadata repeats a key.
    if (!keys.insert(key).second) fail(path, "metadata key '" + key + "' given twice");
    auto* prop = model.add_metadata_props();
    prop->set_key(key);
    prop->set_value(value);
  }

  auto* graph = model.mutable_graph();
  graph->set_name("vit");
  auto* pixels = graph->add_input();
  pixels->set_name("pixel_values");
  if (g.dynamic) {
    set_shape(pixels, {g.C, "height", "width"});
  } else {
    set_shape(pixels, {g.C, g.H, g.W});
  }

  GraphBuilder b(graph, data.get());
  auto* batch = b.node("Shape", {"pixel_values"}, "batch_size");  // (1) = [B], for the reshapes over the batch
  attribute(batch, "start", int64_t{0});
  attribute(batch, "end", int64_t{1});
  std::string x = embed(b, w, "pixel_values", g, m);
  // Rotary embeddings: at a fixed size the model's table at the trained grid (ExportInput's comment), sin and cos as
  // constants; at a dynamic size computed in the graph for the input's grid from the same frequencies.
  const bool mixed = m.use_rot_pos_emb && m.rope_type == RopeType::mixed;
  const Weight* rope = nullptr;
  std::array<std::string, 2> coords;
  if (m.use_rot_pos_emb) {
    if (mixed) w.take("rope.freqs", {2, m.depth, g.nh, g.hd / 2});  // the parameter the table was made from
    if (!mixed) w.take("rope.frequencies", {g.hd / 4});
    rope = &w.take("rope.table",
                   mixed ? std::vector<int64_t>{m.depth, g.nh, g.L, 2 * g.hd} : std::vector<int64_t>{g.L, 2 * g.hd});
    if (g.dynamic) coords = rotary_coordinates(b, m);
  }
  for (int64_t i = 0; i < m.depth; ++i) {
    const std::string prefix = "blocks." + std::to_string(i) + ".";
    BlockOptions options;
    options.qkv_bias = m.qkv_bias, options.layer_scale = m.init_values.has_value();
    options.rel_pos_bias = m.rel_pos_bias, options.qk_norm = m.qk_norm, options.act = m.act_layer;
    options.eps = m.layer_norm_eps, options.model = &m, options.kv_heads = m.kv_heads(i);
    options.probs_output = input.attention_outputs ? "attention." + std::to_string(i) : prefix + "attn.probs";
    if (rope != nullptr && g.dynamic) {
      if (mixed || i == 0) {
        const auto tables = rotary_tables(b, w, coords, g, m, i, mixed ? prefix + "rope" : std::string("rope"));
        options.rope_sin = tables[0], options.rope_cos = tables[1];
      } else {
        options.rope_sin = "rope.sin", options.rope_cos = "rope.cos";
      }
    } else if (rope != nullptr) {
      // This block's rows of the table: all of it, or its own (nh, Np, 2 hd) with rope_type mixed.
      const int64_t rows = (mixed ? g.nh : 1) * g.L;
      const float* table = rope->data.data() + (mixed ? i * rows * 2 * g.hd : 0);
      const std::string name = mixed ? prefix + "rope" : std::string("rope");
      if (mixed || i == 0) {
        std::vector<float> sin(static_cast<size_t>(rows * g.hd)), cos(sin.size());
        for (int64_t r = 0; r < rows; ++r) {
          std::copy(table + r * 2 * g.hd, table + r * 2 * g.hd + g.hd, sin.begin() + r * g.hd);
          std::copy(table + r * 2 * g.hd + g.hd, table + (r + 1) * 2 * g.hd, cos.begin() + r * g.hd);
        }
        const auto shape = mixed ? std::vector<int64_t>{g.nh, g.L, g.hd} : std::vector<int64_t>{g.L, g.hd};
        b.floats(name + ".sin", shape, sin.data(), sin.size());
        b.floats(name + ".cos", shape, cos.data(), cos.size());
      }
      options.rope_sin = name + ".sin", options.rope_cos = name + ".cos";
    }
    x = block(b, w, x, prefix, g, options);
  }
  const std::string output_name = g.K > 0 ? "logits" : "features";
  const bool map_head = m.global_pool == GlobalPool::map;
  head(b, w, x, g, m, output_name, input.attention_outputs ? "pool_attention" : "attn_pool.probs");
  w.check_all_taken();

  auto* output = graph->add_output();
  output->set_name(output_name);
  set_shape(output, {g.K > 0 ? g.K : g.D});
  if (input.attention_outputs) {
    for (int64_t i = 0; i < m.depth; ++i) {
      auto* probs = graph->add_output();
      probs->set_name("attention." + std::to_string(i));
      if (g.dynamic) {
        set_shape(probs, {g.nh, "tokens", "tokens"});
      } else {
        set_shape(probs, {g.nh, g.N, g.N});
      }
    }
    if (map_head) {
      auto* probs = graph->add_output();
      probs->set_name("pool_attention");
      if (g.dynamic) {
        set_shape(probs, {m.pool_heads(), 1, m.pool_includes_prefix() ? "tokens" : "patches"});
      } else {
        set_shape(probs, {m.pool_heads(), 1, g.L + (m.pool_includes_prefix() ? g.prefix : 0)});
      }
    }
  }

  // One protobuf message cannot exceed 2 GiB: larger weights went to the external data file above.
  const size_t bytes = model.ByteSizeLong();
  if (bytes > static_cast<size_t>(INT_MAX)) {
    fail(path, "the graph is " + std::to_string(bytes) + " bytes, over protobuf's 2 GiB limit for one ONNX file");
  }
  if (data) data->close();
  write_atomic(model, path, data.get());
  if (data) return {path, external_data_path(path)};
  return {path};
}

}  // namespace vit::onnx
