// Token sampling, one row per request. A row's draw is a pure function of (logits row, its
// SamplingRow): the uniform comes from a counter-based generator keyed by (seed, step), so batch
// composition and thread count never change a request's tokens.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace k3::cpu {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits, fixed by (seed, step).
double uniform01(uint64_t seed, uint64_t step) {
  const uint64_t bits = splitmix64(seed ^ splitmix64(step ^ 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t argmax_lowest(const float* x, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (x[i] > x[best]) best = i;  // strict: ties keep the lower id
  return static_cast<int32_t>(best);
}

// The row's logits with its biases and penalties applied (ops::SamplingRow), into `scratch`; `logits`
// itself when none apply. The biases in their order, then each generated token's count and one
// subtraction per distinct token, in fp32.
const float* adjust(const float* logits, int64_t V, const ops::SamplingRow& row, std::vector<float>& scratch,
                    std::vector<int32_t>& counts) {
  if (!ops::adjusted(row)) return logits;
  scratch.assign(logits, logits + V);
  for (const ops::LogitBias& b : row.logit_bias) scratch[static_cast<size_t>(b.token)] += b.bias;
  if (row.presence_penalty == 0.f && row.frequency_penalty == 0.f) return scratch.data();
  counts.assign(static_cast<size_t>(V), 0);
  for (int32_t t : row.generated)
    if (t >= 0 && t < V) ++counts[static_cast<size_t>(t)];
  for (int32_t t : row.generated) {
    if (t < 0 || t >= V || counts[static_cast<size_t>(t)] == 0) continue;
    scratch[static_cast<size_t>(t)] -= row.frequency_penalty * static_cast<float>(counts[static_cast<size_t>(t)]) +
                                       row.presence_penalty;
    counts[static_cast<size_t>(t)] = 0;  // once per distinct token
  }
  return scratch.data();
}

int32_t sample_row(const float* logits, int64_t V, const ops::SamplingRow& row, std::vector<int32_t>& order,
                   std::vector<double>& prob) {
  if (row.temperature <= 0.f) return argmax_lowest(logits, V);
  // Candidates by descending logit, ties toward the lower id (a strict total order).
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  order.resize(V);
  std::iota(order.begin(), order.end(), 0);
  int64_t kept = V;
  if (row.top_k > 0 && row.top_k < V) {
    kept = row.top_k;
    std::partial_sort(order.begin(), order.begin() + kept, order.end(), before);
  } else {
    std::sort(order.begin(), order.end(), before);
  }
  // Softmax of logits / temperature over the kept candidates, in double.
  prob.resize(kept);
  const double inv_t = 1.0 / row.temperature, top = logits[order[0]];
  double total = 0;
  for (int64_t i = 0; i < kept; ++i) {
    prob[i] = std::exp((static_cast<double>(logits[order[i]]) - top) * inv_t);
    total += prob[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
  if (row.top_p < 1.f) {
    double mass = 0;
    int64_t n = 0;
    while (n < kept) {
      mass += prob[n] / total;
      ++n;
      if (mass >= row.top_p) break;
    }
    kept = n;
    total = 0;
    for (int64_t i = 0; i < kept; ++i) total += prob[i];
  }
  const double target = uniform01(row.seed, row.step) * total;
  double cum = 0;
  for (int64_t i = 0; i < kept; ++i) {
    cum += prob[i];
    if (target < cum) return order[i];
  }
  return order[kept - 1];  // rounding left target at the very top
}

}  // namespace

void sample(ThreadPool& pool, const ops::SampleParams& p) {
  const char* op = "sample";
  check_tensor(op, "logits", p.logits, DType::F32, {kAny, kAny});
  const int64_t B = p.logits.dim(0), V = p.logits.dim(1);
  check_arg(V >= 1, op, "logits: vocabulary must be non-empty");
  check_arg(static_cast<int64_t>(p.rows.size()) == B, op,
            "rows: expected " + std::to_string(B) + " entries (one per logits row), got " + std::to_string(p.rows.size()));
  check_arg(p.out != nullptr, op, "out: must not be null");
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = p.rows[b];
    const std::string at = "rows[" + std::to_string(b) + "].";
    check_arg(std::isfinite(r.temperature) && r.temperature >= 0.f, op, at + "temperature must be finite and >= 0");
    check_arg(r.top_k >= 0, op, at + "top_k must be >= 0");
    check_arg(r.top_p > 0.f && r.top_p <= 1.f, op, at + "top_p must be in (0, 1]");
    check_arg(std::fabs(r.presence_penalty) <= 2.f, op, at + "presence_penalty must be in [-2, 2]");
    check_arg(std::fabs(r.frequency_penalty) <= 2.f, op, at + "frequency_penalty must be in [-2, 2]");
    for (const ops::LogitBias& lb : r.logit_bias)
      check_arg(lb.token >= 0 && lb.token < V && std::fabs(lb.bias) <= 100.f, op,
                at + "logit_bias: token " + std::to_string(lb.token) + " must be in [0, " + std::to_string(V) +
                    ") with a bias in [-100, 100]");
  }
  p.out->assign(B, 0);
  const float* logits = p.logits.f32();
  int32_t* out = p.out->data();
  pool.parallel_for(B, [&](int64_t b0, int64_t b1) {
    std::vector<int32_t> order, counts;
    std::vector<double> prob;
    std::vector<float> scratch;
    for (int64_t b = b0; b < b1; ++b)
      out[b] = sample_row(adjust(logits + b * V, V, p.rows[b], scratch, counts), V, p.rows[b], order, prob);
  });
}

}  // namespace k3::cpu
