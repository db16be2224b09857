// The units that need no LibTorch (tests/portable/CMakeLists.txt): every entry of every row-kernel table this build has
// and this CPU runs (model/row_kernels.h) and AdamW's update (train/adamw_update.h) against plain loops in double; the
// config, FLOP count, schedule, text, seeded draws and metrics units once each, where a platform could change them.
// No LibTorch here either, so the same file runs cross-built for 64-bit Arm under qemu (scripts/cross-aarch64.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "data/seeded.h"
#include "model/flops.h"
#include "model/row_kernels.h"
#include "serve/metrics.h"
#include "train/adamw_update.h"
#include "train/schedule.h"
#include "util/text.h"

namespace vit {

// gtest names each table's cases by it, and prints it by its ISA rather than its bytes.
void PrintTo(const RowKernels& kernels, std::ostream* out) { *out << kernels.isa; }

namespace {

// Row lengths: shorter than any vector, one vector of 4, 8 and 16 floats, and longer ones with tails.
const std::vector<int64_t> kLengths = {1, 3, 4, 8, 16, 17, 37, 64, 197, 384};

std::vector<float> uniform(int64_t n, float low, float high, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> draw(low, high);
  std::vector<float> values(n);
  for (auto& value : values) value = draw(rng);
  return values;
}

// Folds one difference into the largest so far; a NaN sticks (std::max would drop it).
void keep_largest(double& largest, double difference) {
  if (!(difference <= largest)) largest = difference;
}

// max |actual - expected| over expected's length.
double max_diff(const float* actual, const std::vector<double>& expected) {
  double largest = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) keep_largest(largest, std::fabs(actual[i] - expected[i]));
  return largest;
}

// Every case of this fixture runs once per table of available_row_kernels(); a new table entry needs one TEST_P.
class RowKernelsTest : public ::testing::TestWithParam<RowKernels> {
 protected:
  const RowKernels& kernels() const { return GetParam(); }
  // Prints one comparison's largest difference and holds it to its tolerance.
  void report(const char* what, double difference, double tolerance) const {
    std::printf("%s %s: max |d| %.2e (tolerance %g)\n", GetParam().isa, what, difference, tolerance);
    EXPECT_LE(difference, tolerance) << GetParam().isa << " " << what;
  }
};

// ---- which table ----

// The tables are those this CPU runs, best first, and row_kernels() picks the best or the one VIT_CPU_ISA names.
TEST(RowKernels, EveryInstructionSetThisCpuRunsIsListedAndTheBestChosen) {
  std::vector<std::string> expected;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")) {
    expected.push_back("avx512");
  }
  if (avx2_fma) expected.push_back("avx2");
#endif
  expected.push_back("baseline");  // the only one on every other architecture
  std::vector<std::string> names;
  std::string listed;
  for (const auto& table : available_row_kernels()) {
    names.push_back(table.isa);
    listed += std::string(listed.empty() ? "" : ", ") + table.isa;
  }
  EXPECT_EQ(names, expected);
  const char* forced = std::getenv("VIT_CPU_ISA");
  const std::string chosen = row_kernels().isa;
  std::printf("row kernels: %s chosen, of %s\n", chosen.c_str(), listed.c_str());
  EXPECT_EQ(chosen, forced != nullptr && *forced != '\0' ? std::string(forced) : expected.front());
}

// ---- norms ----

TEST_P(RowKernelsTest, LayerNormRow) {
  double out_diff = 0.0, stats_diff = 0.0;
  for (const int64_t D : kLengths) {
    auto x = uniform(D, -2.0f, 2.0f, 1);
    for (auto& value : x) value += 3.0f;  // off zero: the mean matters
    const auto w = uniform(D, 0.5f, 1.5f, 2), b = uniform(D, -1.0f, 1.0f, 3);
    const float eps = 1e-5f;
    double mean = 0.0, variance = 0.0;
    for (const float value : x) mean += value / static_cast<double>(D);
    for (const float value : x) variance += (value - mean) * (value - mean) / static_cast<double>(D);
    const double rstd = 1.0 / std::sqrt(variance + eps);
    std::vector<double> expected(D);
    for (int64_t j = 0; j < D; ++j) expected[j] = (x[j] - mean) * rstd * w[j] + b[j];
    std::vector<float> out(D), inference(D);
    float mean_out = 0.0f, rstd_out = 0.0f;
    kernels().layer_norm_row(x.data(), D, eps, w.data(), b.data(), out.data(), &mean_out, &rstd_out);
    kernels().layer_norm_row(x.data(), D, eps, w.data(), b.data(), inference.data(), nullptr, nullptr);
    keep_largest(out_diff, max_diff(out.data(), expected));
    keep_largest(out_diff, max_diff(inference.data(), expected));
    keep_largest(stats_diff, std::fabs(mean_out - mean) / mean);
    keep_largest(stats_diff, std::fabs(rstd_out - rstd) / rstd);
  }
  report("layer_norm_row out", out_diff, 1e-5);
  report("layer_norm_row mean, rstd (relative)", stats_diff, 1e-5);
}

// dx = base + rstd (...): rstd multiplies the bracket's rounding too (316 for a row of one, variance 0, eps 1e-5,
// where Arm's fused g - mean(g) leaves the product's rounding), so dx is held to its tolerance over max(1, rstd).
TEST_P(RowKernelsTest, LayerNormBackwardRow) {
  double dx_diff = 0.0, dw_diff = 0.0;
  for (const int64_t D : kLengths) {
    const auto x = uniform(D, -2.0f, 2.0f, 4), dout = uniform(D, -1.0f, 1.0f, 5), w = uniform(D, 0.5f, 1.5f, 6),
               base = uniform(D, -1.0f, 1.0f, 7);
    double mean = 0.0, variance = 0.0;
    for (const float value : x) mean += value / static_cast<double>(D);
    for (const float value : x) variance += (value - mean) * (value - mean) / static_cast<double>(D);
    const float mean_f = static_cast<float>(mean), rstd_f = static_cast<float>(1.0 / std::sqrt(variance + 1e-5));
    auto dw = uniform(D, -1.0f, 1.0f, 8), db = uniform(D, -1.0f, 1.0f, 9);  // accumulated into
    std::vector<double> xhat(D), dx_expected(D), dw_expected(D), db_expected(D);
    double mean_g = 0.0, mean_g_xhat = 0.0;
    for (int64_t j = 0; j < D; ++j) {
      xhat[j] = (x[j] - static_cast<double>(mean_f)) * rstd_f;
      mean_g += static_cast<double>(dout[j]) * w[j] / static_cast<double>(D);
      mean_g_xhat += static_cast<double>(dout[j]) * w[j] * xhat[j] / static_cast<double>(D);
      dw_expected[j] = dw[j] + dout[j] * xhat[j];
      db_expected[j] = static_cast<double>(db[j]) + dout[j];
    }
    for (int64_t j = 0; j < D; ++j) {
      dx_expected[j] = base[j] + rstd_f * (static_cast<double>(dout[j]) * w[j] - mean_g - xhat[j] * mean_g_xhat);
    }
    std::vector<float> dx(D);
    kernels().layer_norm_backward_row(dout.data(), x.data(), mean_f, rstd_f, w.data(), D, base.data(), dx.data(),
                                      dw.data(), db.data());
    keep_largest(dx_diff, max_diff(dx.data(), dx_expected) / std::max(1.0f, rstd_f));
    keep_largest(dw_diff, max_diff(dw.data(), dw_expected));
    keep_largest(dw_diff, max_diff(db.data(), db_expected));
  }
  report("layer_norm_backward_row dx / max(1, rstd)", dx_diff, 1e-5);
  report("layer_norm_backward_row dw, db", dw_diff, 1e-5);
}

TEST_P(RowKernelsTest, RmsNormRow) {
  double out_diff = 0.0, rstd_diff = 0.0;
  for (const int64_t D : kLengths) {
    const auto x = uniform(D, -2.0f, 2.0f, 10), w = uniform(D, 0.5f, 1.5f, 11);
    const float eps = 1e-6f;
    double squares = 0.0;
    for (const float value : x) squares += static_cast<double>(value) * value / static_cast<double>(D);
    const double rstd = 1.0 / std::sqrt(squares + eps);
    std::vector<double> expected(D);
    for (int64_t j = 0; j < D; ++j) expected[j] = x[j] * rstd * w[j];
    std::vector<float> out(D), inference(D);
    float rstd_out = 0.0f;
    kernels().rms_norm_row(x.data(), D, eps, w.data(), out.data(), &rstd_out);
    kernels().rms_norm_row(x.data(), D, eps, w.data(), inference.data(), nullptr);
    keep_largest(out_diff, max_diff(out.data(), expected));
    keep_largest(out_diff, max_diff(inference.data(), expected));
    keep_largest(rstd_diff, std::fabs(rstd_out - rstd) / rstd);
  }
  report("rms_norm_row out", out_diff, 1e-5);
  report("rms_norm_row rstd (relative)", rstd_diff, 1e-5);
}

TEST_P(RowKernelsTest, RmsNormBackwardRow) {
  double dx_diff = 0.0, dw_diff = 0.0;
  for (const int64_t D : kLengths) {
    const auto x = uniform(D, -2.0f, 2.0f, 12), dout = uniform(D, -1.0f, 1.0f, 13), w = uniform(D, 0.5f, 1.5f, 14),
               base = uniform(D, -1.0f, 1.0f, 15);
    double squares = 0.0;
    for (const float value : x) squares += static_cast<double>(value) * value / static_cast<double>(D);
    const float rstd = static_cast<float>(1.0 / std::sqrt(squares + 1e-6));
    auto dw = uniform(D, -1.0f, 1.0f, 16);
    std::vector<double> xhat(D), dx_expected(D), dw_expected(D);
    double mean_g_xhat = 0.0;
    for (int64_t j = 0; j < D; ++j) {
      xhat[j] = static_cast<double>(x[j]) * rstd;
      mean_g_xhat += static_cast<double>(dout[j]) * w[j] * xhat[j] / static_cast<double>(D);
      dw_expected[j] = dw[j] + dout[j] * xhat[j];
    }
    for (int64_t j = 0; j < D; ++j) dx_expected[j] = base[j] + rstd * (dout[j] * w[j] - xhat[j] * mean_g_xhat);
    std::vector<float> dx(D);
    kernels().rms_norm_backward_row(dout.data(), x.data(), rstd, w.data(), D, base.data(), dx.data(), dw.data());
    keep_largest(dx_diff, max_diff(dx.data(), dx_expected) / std::max(1.0f, rstd));
    keep_largest(dw_diff, max_diff(dw.data(), dw_expected));
  }
  report("rms_norm_backward_row dx / max(1, rstd)", dx_diff, 1e-5);
  report("rms_norm_backward_row dw", dw_diff, 1e-5);
}

// ---- residual adds ----

TEST_P(RowKernelsTest, AddBranchRow) {
  double diff = 0.0;
  const float keep = 1.25f;  // drop path's 1 / (1 - p)
  for (const int64_t D : kLengths) {
    const auto base = uniform(D, -2.0f, 2.0f, 17), branch = uniform(D, -2.0f, 2.0f, 18),
               gamma = uniform(D, -0.5f, 0.5f, 19);
    for (const bool layer_scale : {true, false}) {
      std::vector<double> expected(D);
      for (int64_t j = 0; j < D; ++j) {
        expected[j] = base[j] + static_cast<double>(branch[j]) * (layer_scale ? gamma[j] : 1.0f) * keep;
      }
      std::vector<float> out(D);
      kernels().add_branch_row(base.data(), branch.data(), layer_scale ? gamma.data() : nullptr, keep, D, out.data());
      keep_largest(diff, max_diff(out.data(), expected));
    }
  }
  report("add_branch_row", diff, 2e-6);
}

TEST_P(RowKernelsTest, BranchBackwardRow) {
  double diff = 0.0;
  const float keep = 1.25f;
  for (const int64_t D : kLengths) {
    const auto dout = uniform(D, -2.0f, 2.0f, 20), branch = uniform(D, -2.0f, 2.0f, 21),
               gamma = uniform(D, -0.5f, 0.5f, 22);
    for (const bool layer_scale : {true, false}) {
      auto dgamma = uniform(D, -1.0f, 1.0f, 23), dbias = uniform(D, -1.0f, 1.0f, 24);  // accumulated into
      std::vector<double> dbranch_expected(D), dgamma_expected(D), dbias_expected(D);
      for (int64_t j = 0; j < D; ++j) {
        dbranch_expected[j] = static_cast<double>(dout[j]) * (layer_scale ? gamma[j] : 1.0f) * keep;
        dgamma_expected[j] = dgamma[j] + static_cast<double>(dout[j]) * keep * branch[j];
        dbias_expected[j] = dbias[j] + dbranch_expected[j];
      }
      std::vector<float> dbranch(D);
      kernels().branch_backward_row(dout.data(), branch.data(), layer_scale ? gamma.data() : nullptr, keep, D,
                                    dbranch.data(), layer_scale ? dgamma.data() : nullptr, dbias.data());
      keep_largest(diff, max_diff(dbranch.data(), dbranch_expected));
      keep_largest(diff, max_diff(dbias.data(), dbias_expected));
      if (layer_scale) keep_largest(diff, max_diff(dgamma.data(), dgamma_expected));
    }
  }
  report("branch_backward_row dbranch, dgamma, dbias", diff, 2e-6);
}

TEST_P(RowKernelsTest, AddRow) {
  double diff = 0.0;
  for (const int64_t n : kLengths) {
    const auto src = uniform(n, -2.0f, 2.0f, 25);
    auto acc = uniform(n, -2.0f, 2.0f, 26);
    std::vector<double> expected(n);
    for (int64_t j = 0; j < n; ++j) expected[j] = static_cast<double>(acc[j]) + src[j];
    kernels().add_row(src.data(), n, acc.data());
    keep_largest(diff, max_diff(acc.data(), expected));
  }
  report("add_row", diff, 1e-6);
}

// ---- softmax and attention ----

// Softmax over each row of a (rows, cols) matrix, in double.
std::vector<double> softmax_reference(const std::vector<float>& s, int64_t rows, int64_t cols) {
  std::vector<double> p(s.begin(), s.end());
  for (int64_t i = 0; i < rows; ++i) {
    double max = p[i * cols], sum = 0.0;
    for (int64_t j = 0; j < cols; ++j) max = std::max(max, p[i * cols + j]);
    for (int64_t j = 0; j < cols; ++j) sum += p[i * cols + j] = std::exp(p[i * cols + j] - max);
    for (int64_t j = 0; j < cols; ++j) p[i * cols + j] /= sum;
  }
  return p;
}

TEST_P(RowKernelsTest, SoftmaxRows) {
  double diff = 0.0;
  for (const int64_t cols : kLengths) {
    const int64_t rows = 3;
    auto s = uniform(rows * cols, -5.0f, 5.0f, 27);
    for (int64_t j = 0; j < cols; ++j) s[cols + j] += 80.0f;      // large scores: e^x overflows without the max
    for (int64_t j = 0; j < cols; ++j) s[2 * cols + j] *= 30.0f;  // down to -150: e^(x - max) below float's range
    const auto expected = softmax_reference(s, rows, cols);
    kernels().softmax_rows(s.data(), rows, cols);
    keep_largest(diff, max_diff(s.data(), expected));
  }
  report("softmax_rows", diff, 1e-6);
}

TEST_P(RowKernelsTest, SoftmaxBackwardRows) {
  double diff = 0.0;
  for (const int64_t cols : kLengths) {
    const int64_t rows = 3;
    const auto p_double = softmax_reference(uniform(rows * cols, -3.0f, 3.0f, 28), rows, cols);
    const std::vector<float> p(p_double.begin(), p_double.end());
    auto dp = uniform(rows * cols, -1.0f, 1.0f, 29);
    std::vector<double> expected(rows * cols);
    for (int64_t i = 0; i < rows; ++i) {
      double dot = 0.0;
      for (int64_t j = 0; j < cols; ++j) dot += static_cast<double>(dp[i * cols + j]) * p[i * cols + j];
      for (int64_t j = 0; j < cols; ++j) expected[i * cols + j] = p[i * cols + j] * (dp[i * cols + j] - dot);
    }
    kernels().softmax_backward_rows(p.data(), dp.data(), rows, cols);
    keep_largest(diff, max_diff(dp.data(), expected));
  }
  report("softmax_backward_rows", diff, 1e-6);
}

// One head of a two-head qkv as the fused block reads it: rows of (3, heads, hd) floats, this head's q, k and v at
// offsets hd, D + hd and 2 D + hd (D = 2 hd); its output and gradient columns inside rows of D or 3 D, the other
// head's columns left alone.
struct AttentionCase {
  int64_t N, hd, D, row;
  float scale;
  std::vector<float> qkv;
  const float* q() const { return qkv.data() + hd; }
  const float* k() const { return qkv.data() + D + hd; }
  const float* v() const { return qkv.data() + 2 * D + hd; }
  // P (N, N) = softmax(scale q k^T) in double.
  std::vector<double> probabilities() const {
    std::vector<float> s(N * N);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(q()[i * row + d]) * k()[j * row + d];
        s[i * N + j] = static_cast<float>(scale * dot);
      }
    }
    return softmax_reference(s, N, N);
  }
};

AttentionCase attention_case(int64_t N, int64_t hd, uint32_t seed) {
  const int64_t D = 2 * hd;
  return {N, hd, D, 3 * D, 1.0f / std::sqrt(static_cast<float>(hd)), uniform(N * 3 * D, -2.0f, 2.0f, seed)};
}

constexpr float kUntouched = -12345.0f;

// The number of floats of `buffer` outside columns [first, first + width) of its rows of `row` that lost kUntouched.
int64_t written_outside(const std::vector<float>& buffer, int64_t row, int64_t first, int64_t width) {
  int64_t written = 0;
  for (size_t i = 0; i < buffer.size(); ++i) {
    const int64_t column = static_cast<int64_t>(i) % row;
    written += (column < first || column >= first + width) && buffer[i] != kUntouched;
  }
  return written;
}

TEST_P(RowKernelsTest, ShortAttention) {
  double p_diff = 0.0, out_diff = 0.0;
  for (const int64_t N : {1, 5, 16, 17, 33, 50, 64}) {
    for (const int64_t hd : {16, 32, 64}) {
      ASSERT_TRUE(short_attention_applies(N, hd));
      const auto c = attention_case(N, hd, static_cast<uint32_t>(N * 100 + hd));
      const auto P = c.probabilities();
      std::vector<double> expected_out(N * hd);
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          for (int64_t d = 0; d < hd; ++d) expected_out[i * hd + d] += P[i * N + j] * c.v()[j * c.row + d];
        }
      }
      // In two blocks of query rows, as batch-1 inference splits them; out inside rows of D at this head's columns.
      std::vector<float> p(N * N), out(N * c.D, kUntouched), kT(hd * 64);
      const int64_t first = N / 2;
      for (const auto& [start, count] : {std::pair<int64_t, int64_t>{0, first}, {first, N - first}}) {
        if (count == 0) continue;
        kernels().short_attention(c.q() + start * c.row, c.k(), c.v(), c.row, N, hd, c.scale, count,
                                  p.data() + start * N, out.data() + start * c.D + hd, c.D, kT.data());
      }
      std::vector<float> out_head(N * hd);
      for (int64_t i = 0; i < N; ++i) std::copy_n(out.data() + i * c.D + hd, hd, out_head.data() + i * hd);
      keep_largest(p_diff, max_diff(p.data(), P));
      keep_largest(out_diff, max_diff(out_head.data(), expected_out));
      EXPECT_EQ(written_outside(out, c.D, hd, hd), 0) << kernels().isa << " N " << N << " hd " << hd;
    }
  }
  report("short_attention p", p_diff, 1e-5);
  report("short_attention out", out_diff, 1e-5);
}

TEST_P(RowKernelsTest, ShortAttentionBackward) {
  double diff = 0.0;
  for (const int64_t N : {1, 5, 16, 17, 33, 50, 64}) {
    for (const int64_t hd : {16, 32, 64}) {
      const auto c = attention_case(N, hd, static_cast<uint32_t>(N * 100 + hd + 1));
      const auto P_double = c.probabilities();
      const std::vector<float> P(P_double.begin(), P_double.end());
      const auto dO = uniform(N * c.D, -1.0f, 1.0f, static_cast<uint32_t>(N + hd));  // (N, D): this head at hd
      const float* dO_head = dO.data() + hd;
      // dv_j = sum_i P_ij dO_i; dS_ij = P_ij (dP_ij - P_i . dP_i) with dP_ij = dO_i . v_j;
      // dq_i = scale sum_j dS_ij k_j; dk_j = scale sum_i dS_ij q_i.
      std::vector<double> dq(N * hd), dk(N * hd), dv(N * hd), dS(N * N);
      for (int64_t i = 0; i < N; ++i) {
        double dot = 0.0;
        for (int64_t j = 0; j < N; ++j) {
          double dP = 0.0;
          for (int64_t d = 0; d < hd; ++d) dP += static_cast<double>(dO_head[i * c.D + d]) * c.v()[j * c.row + d];
          dS[i * N + j] = dP;
          dot += P[i * N + j] * dP;
        }
        for (int64_t j = 0; j < N; ++j) dS[i * N + j] = P[i * N + j] * (dS[i * N + j] - dot);
      }
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          for (int64_t d = 0; d < hd; ++d) {
            dv[j * hd + d] += static_cast<double>(P[i * N + j]) * dO_head[i * c.D + d];
            dq[i * hd + d] += c.scale * dS[i * N + j] * c.k()[j * c.row + d];
            dk[j * hd + d] += c.scale * dS[i * N + j] * c.q()[i * c.row + d];
          }
        }
      }
      // Into a dqkv laid out as qkv, this head's columns only.
      std::vector<float> dqkv(N * c.row, kUntouched), vT(hd * 64), ds(N * 64);
      float* d = dqkv.data();
      kernels().short_attention_backward(P.data(), dO_head, c.D, c.q(), c.k(), c.v(), c.row, N, hd, c.scale, d + hd,
                                         d + c.D + hd, d + 2 * c.D + hd, vT.data(), ds.data());
      for (const auto& [offset, expected] :
           {std::pair<int64_t, const std::vector<double>*>{hd, &dq}, {c.D + hd, &dk}, {2 * c.D + hd, &dv}}) {
        std::vector<float> got(N * hd);
        for (int64_t i = 0; i < N; ++i) std::copy_n(d + i * c.row + offset, hd, got.data() + i * hd);
        keep_largest(diff, max_diff(got.data(), *expected));
      }
      int64_t others = 0;  // the other head's columns of q, k and v: (i mod row) mod D < hd
      for (int64_t i = 0; i < N * c.row; ++i) others += i % c.row % c.D < hd && dqkv[i] != kUntouched;
      EXPECT_EQ(others, 0) << kernels().isa << " N " << N << " hd " << hd;
    }
  }
  report("short_attention_backward dq, dk, dv", diff, 1e-5);
}

// ---- int8 and bfloat16 ----

// Whether v / scale, computed in float as v * (1 / scale), may round the other way than exact: within 1e-4 of a tie.
bool near_tie(double exact) { return std::fabs(std::fabs(exact - std::floor(exact)) - 0.5) < 1e-4; }

// Symmetric int8: scale = max|x| / max_level in float, q the nearest integer to x / scale, ties to even (as torch
// rounds), for both levels the products use (127, and 63 where int8_linear sums pairs in 16 bits).
TEST_P(RowKernelsTest, QuantizeRow) {
  double diff = 0.0;
  int64_t wrong = 0;
  for (const int max_level : {127, 63}) {
    for (const int64_t n : kLengths) {
      auto x = uniform(n, -3.0f, 3.0f, 30);
      x[n / 2] = -3.5f;  // the largest magnitude, negative: -max_level
      std::vector<int8_t> q(n);
      const float scale = kernels().quantize_row(x.data(), n, max_level, q.data());
      EXPECT_EQ(scale, 3.5f / static_cast<float>(max_level)) << kernels().isa << " n " << n;
      EXPECT_EQ(q[n / 2], -max_level) << kernels().isa << " n " << n;
      for (int64_t j = 0; j < n; ++j) {
        const double exact = static_cast<double>(x[j]) / scale;
        keep_largest(diff, std::fabs(q[j] - exact));
        wrong += q[j] != static_cast<int8_t>(std::nearbyint(exact)) && !near_tie(exact);
      }
    }
    // Exact ties at scale 1 go to even; an all-zero row (and an empty one) has scale 1.
    const float top = static_cast<float>(max_level);
    const std::vector<float> ties = {top, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, top - 0.5f, 0.5f - top};
    std::vector<int8_t> q(ties.size());
    EXPECT_EQ(kernels().quantize_row(ties.data(), static_cast<int64_t>(ties.size()), max_level, q.data()), 1.0f);
    const auto even = static_cast<int8_t>(max_level - 1);  // 126 or 62
    EXPECT_EQ(
        q, (std::vector<int8_t>{static_cast<int8_t>(max_level), 0, 2, 2, 0, -2, -2, even, static_cast<int8_t>(-even)}))
        << kernels().isa << " max_level " << max_level;
    const std::vector<float> zeros(19, 0.0f);
    std::vector<int8_t> q_zeros(19, 1);
    EXPECT_EQ(kernels().quantize_row(zeros.data(), 19, max_level, q_zeros.data()), 1.0f);
    EXPECT_EQ(q_zeros, std::vector<int8_t>(19, 0)) << kernels().isa;
    EXPECT_EQ(kernels().quantize_row(zeros.data(), 0, max_level, q_zeros.data()), 1.0f);
  }
  report("quantize_row |q - x / scale|", diff, 0.5 + 1e-4);
  EXPECT_EQ(wrong, 0) << kernels().isa << ": values not rounded to the nearest integer";
}

// Asymmetric uint8 over [min(x, 0), max(x, 0)]: scale = (hi - lo) / 255 in float, zero_point = round(-lo / scale),
// q = clamp(round(x / scale) + zero_point, 0, 255); zero maps to zero_point exactly. Rows of both signs, of one sign
// (zero point 0 or 255), all zero and empty.
TEST_P(RowKernelsTest, QuantizeRowU8) {
  double diff = 0.0;
  int64_t wrong = 0;
  for (const auto& [low, high] : {std::pair<float, float>{-1.0f, 3.0f}, {0.5f, 2.0f}, {-2.0f, -0.25f}}) {
    for (const int64_t n : kLengths) {
      auto x = uniform(n, low, high, 37);
      if (n > 2) x[1] = 0.0f;
      std::vector<uint8_t> q(n);
      int32_t zero_point = -1;
      const float scale = kernels().quantize_row_u8(x.data(), n, q.data(), &zero_point);
      const float lo = std::min(*std::min_element(x.begin(), x.end()), 0.0f),
                  hi = std::max(*std::max_element(x.begin(), x.end()), 0.0f);
      EXPECT_EQ(scale, (hi - lo) / 255.0f) << kernels().isa << " n " << n;
      const double zero_exact = -static_cast<double>(lo) / scale;
      const bool zero_near_tie = near_tie(zero_exact);
      EXPECT_TRUE(zero_point == std::nearbyint(zero_exact) || zero_near_tie) << kernels().isa << " n " << n;
      if (lo == 0.0f) {
        EXPECT_EQ(zero_point, 0) << kernels().isa << " n " << n;
      }
      if (hi == 0.0f) {
        EXPECT_EQ(zero_point, 255) << kernels().isa << " n " << n;
      }
      for (int64_t j = 0; j < n; ++j) {
        const double exact = static_cast<double>(x[j]) / scale;
        keep_largest(diff, std::fabs(q[j] - zero_point - exact));
        const double expected = std::clamp(std::nearbyint(exact) + zero_point, 0.0, 255.0);
        wrong += q[j] != expected && !near_tie(exact) && !zero_near_tie;
        if (x[j] == 0.0f) {
          EXPECT_EQ(q[j], zero_point) << kernels().isa << " n " << n;
        }
      }
    }
  }
  report("quantize_row_u8 |q - zero_point - x / scale|", diff, 0.5 + 1e-3);
  EXPECT_EQ(wrong, 0) << kernels().isa << ": values not rounded to the nearest level";
  const std::vector<float> zeros(19, 0.0f);
  std::vector<uint8_t> q(19, 1);
  int32_t zero_point = -1;
  EXPECT_EQ(kernels().quantize_row_u8(zeros.data(), 19, q.data(), &zero_point), 1.0f);
  EXPECT_EQ(zero_point, 0);
  EXPECT_EQ(q, std::vector<uint8_t>(19, 0)) << kernels().isa;
  EXPECT_EQ(kernels().quantize_row_u8(zeros.data(), 0, q.data(), &zero_point), 1.0f);
}

TEST_P(RowKernelsTest, Int8DequantizeRow) {
  double diff = 0.0;
  std::mt19937 rng(38);
  for (const int64_t n : kLengths) {
    std::vector<int32_t> acc(n), colsum(n);
    for (auto& value : acc) value = static_cast<int32_t>(rng() % 2000001) - 1000000;
    for (auto& value : colsum) value = static_cast<int32_t>(rng() % 8001) - 4000;
    const auto col_scale = uniform(n, 0.001f, 0.02f, 39), bias = uniform(n, -1.0f, 1.0f, 40);
    const int32_t zero_point = 117;
    const float row_scale = 0.013f;
    for (const bool with_bias : {true, false}) {
      std::vector<double> expected(n);
      for (int64_t j = 0; j < n; ++j) {
        expected[j] = static_cast<double>(acc[j] - zero_point * colsum[j]) * row_scale * col_scale[j] +
                      (with_bias ? bias[j] : 0.0f);
      }
      std::vector<float> y(n);
      kernels().int8_dequantize_row(acc.data(), n, zero_point, colsum.data(), row_scale, col_scale.data(),
                                    with_bias ? bias.data() : nullptr, y.data());
      for (int64_t j = 0; j < n; ++j) {
        keep_largest(diff, std::fabs(y[j] - expected[j]) / std::max(1.0, std::fabs(expected[j])));
      }
    }
  }
  report("int8_dequantize_row (relative)", diff, 1e-6);
}

// vit's int8 product against the same quantized operands multiplied out in integers: weights quantized by quantize_row
// (at 63 where the kernel sums pairs in 16 bits) and packed by pack_int8_weight, rows by quantize_row_u8 with K4 - K
// zero padding bytes. Off by one integer product anywhere shows as a difference of row_scale col_scale: the
// difference is printed in those units. Row counts around the 4-row tile, widths around the 16-channel panel, the
// panels in two calls, y wider than its rows (columns past N left alone).
TEST_P(RowKernelsTest, Int8Linear) {
  double diff = 0.0;
  const int max_level = kernels().int8_pairs_in_16_bits ? 63 : 127;
  for (const int64_t M : {1, 2, 3, 4, 5, 11}) {
    for (const auto& [K, N] : {std::pair<int64_t, int64_t>{5, 1}, {16, 16}, {67, 17}, {64, 40}, {130, 33}}) {
      const uint32_t seed = static_cast<uint32_t>(M * 1000 + K * 10 + N);
      const int64_t K4 = int8_k4(K), panels_count = int8_panels(N), lda = K4 + 8, ldy = N + 3;
      const auto weight = uniform(N * K, -0.5f, 0.5f, seed), bias = uniform(N, -1.0f, 1.0f, seed + 1),
                 x = uniform(M * K, -2.0f, 3.0f, seed + 2);
      std::vector<int8_t> w_q(N * K), panels(panels_count * K4 * kInt8PanelWidth);
      std::vector<int32_t> colsum(N), zero_point(M);
      std::vector<float> w_scale(N), x_scale(M);
      for (int64_t n = 0; n < N; ++n) {
        w_scale[n] = kernels().quantize_row(weight.data() + n * K, K, max_level, w_q.data() + n * K);
      }
      pack_int8_weight(w_q.data(), N, K, panels.data(), colsum.data());
      std::vector<uint8_t> x_q(M * lda, 0);
      for (int64_t i = 0; i < M; ++i) {
        x_scale[i] = kernels().quantize_row_u8(x.data() + i * K, K, x_q.data() + i * lda, &zero_point[i]);
      }
      const Int8Rows a{x_q.data(), lda, M, zero_point.data(), x_scale.data()};
      const Int8Weight w{panels.data(), N, K4, colsum.data(), w_scale.data(), bias.data()};
      std::vector<float> y(M * ldy, kUntouched);
      kernels().int8_linear(a, w, 0, 1, y.data(), ldy);
      kernels().int8_linear(a, w, 1, panels_count, y.data(), ldy);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t n = 0; n < N; ++n) {
          int64_t acc = 0, sum = 0;
          for (int64_t k = 0; k < K; ++k) acc += int64_t{x_q[i * lda + k]} * w_q[n * K + k], sum += w_q[n * K + k];
          EXPECT_EQ(colsum[n], sum) << "pack_int8_weight's column sum, n " << n;
          const double step = static_cast<double>(x_scale[i]) * w_scale[n];
          const double expected = static_cast<double>(acc - int64_t{zero_point[i]} * sum) * step + bias[n];
          keep_largest(diff, std::fabs(y[i * ldy + n] - expected) / step);
        }
      }
      EXPECT_EQ(written_outside(y, ldy, 0, N), 0) << kernels().isa << " M " << M << " K " << K << " N " << N;
    }
  }
  report("int8_linear, in integer products", diff, 0.5);
}

// bfloat16 to nearest, ties to even, from the two candidates around |x| compared in double: the 16 upper bits
// truncated and the next pattern up (past the largest finite one: infinity, taken as 2^128 to compare). NaN: 0x7fc0.
uint16_t bf16_reference(float x) {
  if (std::isnan(x)) return 0x7fc0;
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>(bits >> 16 & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  const auto below = static_cast<uint16_t>(magnitude >> 16), above = static_cast<uint16_t>(below + 1);
  if ((magnitude & 0xffffu) == 0) return sign | below;  // exact, infinity included
  const auto value = [](uint16_t upper) {
    if (upper >= 0x7f80) return std::ldexp(1.0, 128);
    const uint32_t widened = static_cast<uint32_t>(upper) << 16;
    float f;
    std::memcpy(&f, &widened, sizeof f);
    return static_cast<double>(f);
  };
  const double m = std::fabs(static_cast<double>(x)), to_below = m - value(below), to_above = value(above) - m;
  const uint16_t nearest = to_below < to_above ? below : to_above < to_below ? above : (below & 1) ? above : below;
  return sign | nearest;
}

TEST_P(RowKernelsTest, RoundBf16Row) {
  std::vector<uint32_t> patterns = {
      0x00000000, 0x80000000, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001, 0xbf818000,  // zeros, ties both ways
      0x00008000, 0x00018000, 0x00000001, 0x807fffff,                                      // denormals, ties there
      0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff, 0x7f7f0000,  // the largest finite: past the last tie, infinity
      0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff, 0xffffffff};  // infinities, NaNs
  std::mt19937 rng(33);
  for (int i = 0; i < 4000; ++i) patterns.push_back(static_cast<uint32_t>(rng()));  // every exponent, NaNs among them
  for (const float value : uniform(1000, -1e3f, 1e3f, 34)) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    patterns.push_back(bits);
  }
  std::vector<float> x(patterns.size());
  std::memcpy(x.data(), patterns.data(), patterns.size() * sizeof(float));
  const auto n = static_cast<int64_t>(x.size());
  int64_t wrong = 0;
  // The whole row, then each offset and short tail on its own (the vector body and its remainder).
  std::vector<uint16_t> out(n);
  kernels().round_bf16_row(x.data(), n, out.data());
  for (int64_t i = 0; i < n; ++i) wrong += out[i] != bf16_reference(x[i]);
  for (int64_t length = 1; length <= 40; ++length) {
    kernels().round_bf16_row(x.data() + length, length, out.data());
    for (int64_t i = 0; i < length; ++i) wrong += out[i] != bf16_reference(x[length + i]);
  }
  std::printf("%s round_bf16_row: %lld of %lld values differ from round-to-nearest-even\n", kernels().isa,
              static_cast<long long>(wrong), static_cast<long long>(n + 40 * 41 / 2));
  EXPECT_EQ(wrong, 0) << kernels().isa;
}

// ---- GELU ----

TEST_P(RowKernelsTest, GeluWithDerivative) {
  double g_diff = 0.0, derivative_diff = 0.0, tail = 0.0;
  for (const int64_t n : kLengths) {
    auto x = uniform(n, -8.0f, 8.0f, 35);
    x[0] = 0.0f;
    const auto x0 = x;
    std::vector<float> g(n);
    kernels().gelu_with_derivative(x.data(), g.data(), n);
    std::vector<double> g_expected(n), derivative_expected(n);
    for (int64_t j = 0; j < n; ++j) {
      const double v = x0[j], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
      g_expected[j] = v * cdf;
      derivative_expected[j] = cdf + v * std::exp(-0.5 * v * v) * 0.39894228040143268;  // 1 / sqrt(2 pi)
    }
    keep_largest(g_diff, max_diff(g.data(), g_expected));
    keep_largest(derivative_diff, max_diff(x.data(), derivative_expected));
  }
  // Far below zero x Phi(x) is tiny, and keeps the approximation's own relative accuracy (3.1% at -12) rather than
  // rounding to zero.
  auto x = uniform(37, -12.0f, -4.0f, 36);
  std::vector<float> g(x.size());
  const auto x0 = x;
  kernels().gelu_with_derivative(x.data(), g.data(), static_cast<int64_t>(x.size()));
  for (size_t j = 0; j < x.size(); ++j) {
    const double expected = x0[j] * 0.5 * std::erfc(-x0[j] / std::sqrt(2.0));
    keep_largest(tail, std::fabs(g[j] - expected) / std::fabs(expected));
  }
  report("gelu_with_derivative g", g_diff, 2e-6);
  report("gelu_with_derivative derivative", derivative_diff, 2e-6);
  report("gelu_with_derivative g below -4 (relative)", tail, 0.035);
}

INSTANTIATE_TEST_SUITE_P(Isa, RowKernelsTest, ::testing::ValuesIn(available_row_kernels()),
                         [](const ::testing::TestParamInfo<RowKernels>& info) { return std::string(info.param.isa); });

// ---- AdamW ----

// x rounded to float on its own: no fused multiply-add may join it to what follows (Arm's compilers fuse by default).
float rounded(float x) {
  volatile float stored = x;
  return stored;
}

// adamw_update against its formula (train/adamw_update.h): in float, in its order and roundings (exactly: the unit is
// built without fused multiply-adds, so that they stay torch.optim.AdamW's), and in double (within float's rounding).
TEST(AdamWUpdate, MatchesItsFormulaInFloatExactlyAndInDouble) {
  const double lr = 1e-3, weight_decay = 0.05;
  const int step_count = 3;
  AdamWScalars s;
  s.beta1 = 0.9f;
  s.beta2 = 0.999f;
  s.eps = 1e-8f;
  s.denom_scale = static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, step_count)));
  s.step = static_cast<float>(lr / (1.0 - std::pow(s.beta1, step_count)));
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  const double beta1 = s.beta1, beta2 = s.beta2;  // the same scalars in double: only the arithmetic differs
  double p_diff = 0.0, moment_diff = 0.0;
  int64_t inexact = 0;
  for (const int64_t n : {1, 3, 4, 7, 8, 16, 17, 100, 1001}) {
    for (const bool decayed : {true, false}) {
      const auto p0 = uniform(n, -1.0f, 1.0f, 40), g = uniform(n, -1.0f, 1.0f, 41), m0 = uniform(n, -0.1f, 0.1f, 42),
                 v0 = uniform(n, 0.0f, 0.01f, 43);
      auto p = p0, m = m0, v = v0;
      adamw_update(p.data(), g.data(), m.data(), v.data(), n, s, decayed);
      for (int64_t i = 0; i < n; ++i) {
        // float, the unit's order
        float pf = rounded(p0[i] * (decayed ? s.decay : 1.0f));
        const float mf = rounded(rounded(m0[i] * s.beta1) + rounded((1.0f - s.beta1) * g[i]));
        const float vf = rounded(rounded(v0[i] * s.beta2) + rounded(rounded((1.0f - s.beta2) * g[i]) * g[i]));
        pf = pf - rounded(s.step * (mf / (std::sqrt(vf) / s.denom_scale + s.eps)));
        inexact += p[i] != pf || m[i] != mf || v[i] != vf;
        // double
        const double md = beta1 * m0[i] + (1.0 - beta1) * g[i], vd = beta2 * v0[i] + (1.0 - beta2) * g[i] * g[i];
        const double pd = p0[i] * (decayed ? static_cast<double>(s.decay) : 1.0) -
                          s.step * (md / (std::sqrt(vd) / s.denom_scale + s.eps));
        keep_largest(p_diff, std::fabs(p[i] - pd));
        keep_largest(moment_diff, std::max(std::fabs(m[i] - md), std::fabs(v[i] - vd) / 0.01));
      }
    }
  }
  std::printf(
      "adamw_update: %lld elements differ from the float formula; max |d| from double: p %.2e, m and v "
      "(relative to 0.01) %.2e\n",
      static_cast<long long>(inexact), p_diff, moment_diff);
  EXPECT_EQ(inexact, 0);
  EXPECT_LE(p_diff, 2e-7);
  EXPECT_LE(moment_diff, 1e-7);
}

// ---- the other torch-free units ----

// Seeded draws are our own arithmetic on mt19937_64 (data/seeded.h): these exact values on every platform, or a run
// resumed on another machine would draw other batches.
TEST(Seeded, DrawsAreTheSameOnEveryPlatform) {
  EXPECT_EQ(seeded_permutation(10, 42), (std::vector<int64_t>{3, 4, 1, 2, 9, 8, 0, 6, 5, 7}));
  EXPECT_EQ(mix_seed({1, 2}), 0x8059eb3418e61d41ull);
  std::mt19937_64 rng(5);
  EXPECT_EQ(uniform_int(rng, 1000), 673);
  EXPECT_EQ(uniform01(rng), 0.038494610807679019);
}

// Bytes above 0x7f (a signed char on x86-64, unsigned on Arm) pass as UTF-8 or are escaped, the same on both.
TEST(Printable, HighBytesAreTheSameOnEveryPlatform) {
  const std::string utf8 = "caf\xc3\xa9 \xf0\x9f\x98\x80";  // é 😀
  EXPECT_EQ(printable(utf8), utf8);
  EXPECT_EQ(printable("\xff\xc3\x80\xc0\xaf\x1b"), "\\xff\xc3\x80\\xc0\\xaf\\x1b");
}

// The default config parses, writes and parses back to itself; ViT-B/16's forward is timm's 17.6 GMACs; the default
// schedule warms up, then decays to its floor.
TEST(Config, DefaultsRoundTripAndFlopsAndScheduleFollow) {
  const Config defaults = parse_config(nlohmann::json::object(), "defaults");
  const nlohmann::json written = to_json(defaults);
  EXPECT_EQ(to_json(parse_config(written, "written defaults")), written);
  EXPECT_NEAR(static_cast<double>(forward_macs(model_preset("vit_base_patch16_224"))) / 1e9, 17.57, 0.01);
  TrainConfig train;
  train.lr = 1e-3, train.min_lr = 1e-5, train.warmup_lr = 1e-6, train.warmup_steps = 10, train.epochs = 2;
  const Schedule schedule = make_schedule(train, 55);
  EXPECT_EQ(schedule.total_steps, 110);
  EXPECT_NEAR(schedule.lr_at(5), 1e-6 + (1e-3 - 1e-6) * 0.5, 1e-15);
  EXPECT_NEAR(schedule.lr_at(60), (1e-3 + 1e-5) / 2, 1e-12);  // halfway down the cosine
  EXPECT_DOUBLE_EQ(schedule.lr_at(110), 1e-5);
}

// Prometheus' text: counts and sums of the requests and batches recorded.
TEST(ServeMetrics, CountsAndSumsAppearInPrometheusText) {
  ServeMetrics metrics;
  metrics.request("/predict", 200, 0.25);
  metrics.request("/predict", 200, 0.5);
  metrics.batch(8, 0.125);
  const std::string text = metrics.prometheus(3, true);
  for (const std::string line : {"vit_requests_total{endpoint=\"/predict\",status=\"200\"} 2\n",
                                 "vit_request_duration_seconds_bucket{endpoint=\"/predict\",le=\"0.25\"} 1\n",
                                 "vit_request_duration_seconds_sum{endpoint=\"/predict\"} 0.75\n",
                                 "vit_batch_seconds_sum 0.125\n", "vit_images_total 8\n", "vit_queue_depth 3\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "not in:\n" << text;
  }
}

}  // namespace
}  // namespace vit
