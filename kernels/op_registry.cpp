#include "kernels/op_registry.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>

namespace k3 {
namespace {

using K = OpFieldKind;

// One invocation: uploads inputs on demand, allocates outputs, remembers what to download.
class OpRun {
 public:
  OpRun(Backend& be, const OpInfo& info, const std::map<std::string, Tensor>& inputs,
        const std::map<std::string, std::string>& attrs)
      : be_(be), info_(info), inputs_(inputs), attrs_(attrs) {}

  bool has(const std::string& name) const { return inputs_.count(name) != 0; }

  const Tensor& host(const std::string& name) const {
    auto it = inputs_.find(name);
    if (it == inputs_.end()) throw Error("missing input tensor '" + name + "'");
    return it->second;
  }

  // Size of dimension i of input `name` (negative i counts from the end), with a named error.
  int64_t dim(const std::string& name, int i) const {
    const Tensor& t = host(name);
    const int idx = i < 0 ? t.ndim() + i : i;
    if (idx < 0 || idx >= t.ndim())
      throw Error("input '" + name + "' needs at least " + std::to_string((i < 0 ? -i : i + 1)) +
                  " dimensions, got shape " + shape_str(t.shape()));
    return t.dim(idx);
  }

  // The input on the backend (empty Tensor when an optional input is absent).
  Tensor in(const std::string& name) {
    if (!has(name)) return Tensor();
    return upload(name, kind_of(name));
  }

  // An in/out tensor: uploaded from the input, downloaded afterwards under the same name.
  Tensor inout(const std::string& name) {
    Tensor t = upload(name, kind_of(name));
    results_.push_back({name, t});
    return t;
  }

  Tensor out(const std::string& name, const Shape& shape) {
    for (int64_t d : shape)
      if (d < 0) throw Error("output '" + name + "' would have a negative dimension " + shape_str(shape));
    Tensor t = be_.alloc(shape, dtype_for(kind_of(name)));
    results_.push_back({name, t});
    return t;
  }

  std::string attr(const std::string& name) const {
    auto it = attrs_.find(name);
    if (it != attrs_.end()) return it->second;
    for (const auto& a : info_.attrs)
      if (a.name == name) {
        if (a.default_value.empty()) throw Error("missing required attribute '" + name + "'");
        return a.default_value;
      }
    throw Error("internal: attribute '" + name + "' is not declared");
  }
  bool has_attr(const std::string& name) const { return attrs_.count(name) != 0; }

  float attr_f(const std::string& name) const {
    const std::string v = attr(name);
    errno = 0;
    char* end = nullptr;
    const float f = std::strtof(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno == ERANGE || std::isnan(f))
      throw Error("attribute '" + name + "' = '" + v + "' is not a number");
    return f;
  }

  int64_t attr_i(const std::string& name) const {
    const std::string v = attr(name);
    errno = 0;
    char* end = nullptr;
    const long long i = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno == ERANGE)
      throw Error("attribute '" + name + "' = '" + v + "' is not an integer");
    return i;
  }

  uint64_t attr_u64(const std::string& name) const {
    const std::string v = attr(name);
    errno = 0;
    char* end = nullptr;
    const unsigned long long u = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || v[0] == '-' || *end != '\0' || errno == ERANGE)
      throw Error("attribute '" + name + "' = '" + v + "' is not a non-negative integer");
    return u;
  }

  int attr_int(const std::string& name) const {
    const int64_t v = attr_i(name);
    if (v < INT32_MIN || v > INT32_MAX) throw Error("attribute '" + name + "' = " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
  }

  Backend& backend() { return be_; }

  void download(std::map<std::string, Tensor>* outputs) {
    be_.synchronize();
    for (auto& [name, t] : results_) {
      Tensor h = be_.to_host(t);
      if (h.dtype() == DType::BF16 || h.dtype() == DType::F16) h = h.to_f32();
      (*outputs)[name] = h;
    }
  }

 private:
  K kind_of(const std::string& name) const {
    const std::string key = name.rfind("candidates.", 0) == 0 ? "candidates.N" : name;
    for (const auto& f : info_.inputs)
      if (f.name == key) return f.kind;
    for (const auto& f : info_.outputs)
      if (f.name == key) return f.kind;
    throw Error("internal: field '" + name + "' is not declared");
  }
  DType dtype_for(K kind) const {
    return kind == K::I32 ? DType::I32 : kind == K::F32 ? DType::F32 : be_.compute_dtype();
  }
  Tensor upload(const std::string& name, K kind) {
    const Tensor& h = host(name);
    const bool is_float = h.dtype() == DType::F32 || h.dtype() == DType::BF16 || h.dtype() == DType::F16;
    if (kind == K::I32 && h.dtype() != DType::I32)
      throw Error("input '" + name + "' must be I32, got " + dtype_name(h.dtype()));
    if (kind != K::I32 && !is_float)
      throw Error("input '" + name + "' must be a float tensor (F32, BF16 or F16), got " + dtype_name(h.dtype()));
    const DType want = dtype_for(kind);
    // Convert on the host first so every backend sees exactly the requested dtype.
    Tensor src = (want == DType::F32 && h.dtype() != DType::F32) ? h.to_f32() : h;
    return be_.from_host(src, want);
  }

  Backend& be_;
  const OpInfo& info_;
  const std::map<std::string, Tensor>& inputs_;
  const std::map<std::string, std::string>& attrs_;
  std::vector<std::pair<std::string, Tensor>> results_;
};

struct OpEntry {
  OpInfo info;
  std::function<void(OpRun&)> run;
};

OpFieldInfo in(std::string n, K k = K::Act) { return {std::move(n), k, false, false}; }
OpFieldInfo opt(std::string n, K k = K::Act) { return {std::move(n), k, true, false}; }
OpFieldInfo io(std::string n, K k = K::Act) { return {std::move(n), k, false, true}; }
OpFieldInfo out(std::string n, K k = K::Act) { return {std::move(n), k, false, false}; }

std::vector<OpEntry> make_entries() {
  std::vector<OpEntry> e;
  e.push_back({{"gemm", "y = alpha * x @ w^T + beta * y", {in("x"), in("w"), opt("y")}, {out("y")},
                {{"alpha", "1"}, {"beta", "0", "beta != 0 reads the optional input y"}}},
               [](OpRun& r) {
                 const float beta = r.attr_f("beta");
                 const Shape shape = {r.dim("x", 0), r.dim("w", 0)};
                 Tensor y = r.has("y") ? r.inout("y") : r.out("y", shape);
                 if (beta != 0.f && !r.has("y")) throw Error("beta != 0 needs the input tensor 'y'");
                 r.backend().gemm({.x = r.in("x"), .w = r.in("w"), .y = y, .alpha = r.attr_f("alpha"), .beta = beta});
               }});
  e.push_back({{"rmsnorm", "y = w * x / sqrt(mean(x^2) + eps) per row", {in("x"), opt("w")}, {out("y")},
                {{"eps", "1e-5"}}},
               [](OpRun& r) {
                 r.backend().rmsnorm({.x = r.in("x"), .w = r.in("w"), .y = r.out("y", r.host("x").shape()),
                                      .eps = r.attr_f("eps")});
               }});
  e.push_back({{"l2norm", "y = scale * x / sqrt(sum(x^2) + eps) per row", {in("x")}, {out("y")},
                {{"eps", "1e-6"}, {"scale", "1"}}},
               [](OpRun& r) {
                 r.backend().l2norm({.x = r.in("x"), .y = r.out("y", r.host("x").shape()), .eps = r.attr_f("eps"),
                                     .scale = r.attr_f("scale")});
               }});
  e.push_back({{"short_conv", "depthwise causal conv + SiLU per sequence; cache <- last W-1 pre-conv rows",
                {in("x"), in("w"), io("cache"), in("slots", K::I32), in("cu_seqlens", K::I32)},
                {out("y"), out("cache")}, {}},
               [](OpRun& r) {
                 Tensor cache = r.inout("cache");
                 r.backend().short_conv({.x = r.in("x"), .w = r.in("w"), .cache = cache, .slots = r.in("slots"),
                                         .cu_seqlens = r.in("cu_seqlens"), .y = r.out("y", r.host("x").shape())});
               }});
  e.push_back({{"kda_gate", "g = g_min * sigmoid(exp(a_log[h]) * (f + dt_bias))",
                {in("f"), in("a_log", K::F32), in("dt_bias", K::F32)}, {out("g", K::F32)},
                {{"heads", "", "required"}, {"g_min", "-5"}}},
               [](OpRun& r) {
                 const int heads = r.attr_int("heads");
                 if (heads < 1) throw Error("attribute 'heads' must be >= 1");
                 Tensor g = r.out("g", {r.dim("f", 0), heads, r.dim("f", 1) / heads});
                 r.backend().kda_gate({.f = r.in("f"), .a_log = r.in("a_log"), .dt_bias = r.in("dt_bias"), .g = g,
                                       .heads = heads, .g_min = r.attr_f("g_min")});
               }});
  for (bool chunked : {true, false}) {
    OpInfo info{chunked ? "kda_chunk" : "kda_recurrent",
                chunked ? "KDA delta rule, chunkwise WY form (chunk_size tokens per chunk)"
                        : "KDA delta rule, token recurrence (the oracle)",
                {in("q"), in("k"), in("v"), in("g", K::F32), in("beta", K::F32), io("state", K::F32),
                 in("slots", K::I32), in("cu_seqlens", K::I32)},
                {out("o"), out("state", K::F32)},
                {}};
    if (chunked) info.attrs.push_back({"chunk_size", "64"});
    e.push_back({info, [chunked](OpRun& r) {
                   Tensor state = r.inout("state");
                   ops::KdaParams p{.q = r.in("q"), .k = r.in("k"), .v = r.in("v"), .g = r.in("g"),
                                    .beta = r.in("beta"), .state = state, .slots = r.in("slots"),
                                    .cu_seqlens = r.in("cu_seqlens"),
                                    .o = r.out("o", {r.dim("q", 0), r.dim("q", 1), r.dim("v", 2)})};
                   if (chunked) {
                     p.chunk_size = r.attr_int("chunk_size");
                     r.backend().kda_chunk(p);
                   } else {
                     r.backend().kda_recurrent(p);
                   }
                 }});
  }
  e.push_back({{"kda_decode", "one decode token per request: conv, L2 norm, gate, sigmoid(b), one delta-rule step",
                {in("qkv"), in("conv_w"), io("conv_cache"), in("f"), in("a_log", K::F32), in("dt_bias", K::F32),
                 in("b"), io("state", K::F32), in("slots", K::I32)},
                {out("o"), out("conv_cache"), out("state", K::F32)},
                {{"heads", "", "required"}, {"g_min", "-5"}}},
               [](OpRun& r) {
                 const int heads = r.attr_int("heads");
                 if (heads < 1) throw Error("attribute 'heads' must be >= 1");
                 Tensor cache = r.inout("conv_cache"), state = r.inout("state");
                 Tensor o = r.out("o", {r.dim("qkv", 0), heads, r.dim("qkv", 1) / (3 * heads)});
                 r.backend().kda_decode({.qkv = r.in("qkv"), .conv_w = r.in("conv_w"), .conv_cache = cache,
                                         .f = r.in("f"), .a_log = r.in("a_log"), .dt_bias = r.in("dt_bias"),
                                         .b = r.in("b"), .state = state, .slots = r.in("slots"), .o = o,
                                         .heads = heads, .g_min = r.attr_f("g_min")});
               }});
  e.push_back({{"mla_prefill", "causal softmax attention, queries at positions [past, past+T), lse natural log",
                {in("q"), in("k"), in("v")}, {out("o"), out("lse", K::F32)},
                {{"past", "", "default: rows of k - rows of q"}, {"scale", "", "default: (q width)^-1/2"}}},
               [](OpRun& r) {
                 const int64_t T = r.dim("q", 0), H = r.dim("q", 1);
                 const int64_t past = r.has_attr("past") ? r.attr_i("past") : r.dim("k", 0) - T;
                 const float scale =
                     r.has_attr("scale") ? r.attr_f("scale") : 1.f / std::sqrt(static_cast<float>(r.dim("q", 2)));
                 r.backend().mla_prefill({.q = r.in("q"), .k = r.in("k"), .v = r.in("v"),
                                          .o = r.out("o", {T, H, r.dim("v", 2)}), .lse = r.out("lse", {T, H}),
                                          .past = past, .scale = scale});
               }});
  e.push_back({{"mla_decode", "absorbed MQA decode over a paged latent cache; seq_len 0 gives o = 0, lse = -inf",
                {in("q_lat"), in("q_rope"), in("kv_cache"), in("block_table", K::I32), in("seq_lens", K::I32)},
                {out("o"), out("lse", K::F32)},
                {{"scale", "", "required: (d_n + d_r)^-1/2"}}},
               [](OpRun& r) {
                 const int64_t B = r.dim("q_lat", 0), H = r.dim("q_lat", 1);
                 r.backend().mla_decode({.q_lat = r.in("q_lat"), .q_rope = r.in("q_rope"), .kv_cache = r.in("kv_cache"),
                                         .block_table = r.in("block_table"), .seq_lens = r.in("seq_lens"),
                                         .o = r.out("o", {B, H, r.dim("q_lat", 2)}), .lse = r.out("lse", {B, H}),
                                         .scale = r.attr_f("scale")});
               }});
  e.push_back({{"lse_merge", "merge partial attention: lse = log sum exp lse_n, o = sum exp(lse_n - lse) o_n",
                {in("o_parts"), in("lse_parts", K::F32)}, {out("o"), out("lse", K::F32)}, {}},
               [](OpRun& r) {
                 const int64_t B = r.dim("o_parts", 1), H = r.dim("o_parts", 2);
                 r.backend().lse_merge({.o_parts = r.in("o_parts"), .lse_parts = r.in("lse_parts"),
                                        .o = r.out("o", {B, H, r.dim("o_parts", 3)}), .lse = r.out("lse", {B, H})});
               }});
  e.push_back({{"attnres_mix", "y = sum_j softmax_j(query . V_j / rms(V_j)) V_j over candidates.0..N-1",
                {in("candidates.N"), in("query", K::F32)}, {out("y")}, {{"eps", "1e-5"}}},
               [](OpRun& r) {
                 std::vector<Tensor> cands;
                 for (int j = 0; r.has("candidates." + std::to_string(j)); ++j)
                   cands.push_back(r.in("candidates." + std::to_string(j)));
                 if (cands.empty()) throw Error("missing input tensor 'candidates.0'");
                 r.backend().attnres_mix({.candidates = cands, .query = r.in("query"),
                                          .y = r.out("y", r.host("candidates.0").shape()), .eps = r.attr_f("eps")});
               }});
  e.push_back({{"situ", "y = beta tanh(g/beta) sigmoid(g) * beta_linear tanh(u/beta_linear)", {in("g"), in("u")},
                {out("y")}, {{"beta", "4"}, {"beta_linear", "25"}}},
               [](OpRun& r) {
                 r.backend().situ({.g = r.in("g"), .u = r.in("u"), .y = r.out("y", r.host("g").shape()),
                                   .beta = r.attr_f("beta"), .beta_linear = r.attr_f("beta_linear")});
               }});
  e.push_back({{"router_topk", "s = sigmoid(logits); top-k of s + bias (ties: lower id); w = scale * s / sum(s_sel)",
                {in("logits", K::F32), in("bias", K::F32)}, {out("ids", K::I32), out("weights", K::F32)},
                {{"k", "", "required"}, {"scale", "1"}}},
               [](OpRun& r) {
                 const int k = r.attr_int("k");
                 if (k < 1) throw Error("attribute 'k' must be >= 1");
                 const int64_t M = r.dim("logits", 0);
                 r.backend().router_topk({.logits = r.in("logits"), .bias = r.in("bias"), .ids = r.out("ids", {M, k}),
                                          .weights = r.out("weights", {M, k}), .k = k, .scale = r.attr_f("scale")});
               }});
  e.push_back({{"moe_experts", "y[m] = sum_j weights[m,j] * W2_e SiTU(W1_e z[m], W3_e z[m]), e = ids[m,j]",
                {in("z"), in("ids", K::I32), in("weights", K::F32), in("w1"), in("w3"), in("w2")}, {out("y")},
                {{"beta", "4"}, {"beta_linear", "25"}}},
               [](OpRun& r) {
                 r.backend().moe_experts({.z = r.in("z"), .ids = r.in("ids"), .weights = r.in("weights"),
                                          .w1 = r.in("w1"), .w3 = r.in("w3"), .w2 = r.in("w2"),
                                          .y = r.out("y", r.host("z").shape()), .beta = r.attr_f("beta"),
                                          .beta_linear = r.attr_f("beta_linear")});
               }});
  e.push_back({{"add", "y = a + b", {in("a"), in("b")}, {out("y")}, {}}, [](OpRun& r) {
                 r.backend().add({.a = r.in("a"), .b = r.in("b"), .y = r.out("y", r.host("a").shape())});
               }});
  e.push_back({{"sigmoid_mul", "y = x * sigmoid(gate)", {in("x"), in("gate")}, {out("y")}, {}}, [](OpRun& r) {
                 r.backend().sigmoid_mul({.x = r.in("x"), .gate = r.in("gate"), .y = r.out("y", r.host("x").shape())});
               }});
  e.push_back({{"sigmoid", "y = sigmoid(x), any shape", {in("x")}, {out("y")}, {}}, [](OpRun& r) {
                 Tensor y = r.out("y", r.host("x").shape());
                 r.backend().sigmoid(r.in("x"), y);
               }});
  e.push_back({{"embedding", "y[m] = table[ids[m]]", {in("table"), in("ids", K::I32)}, {out("y")}, {}},
               [](OpRun& r) {
                 r.backend().embedding({.table = r.in("table"), .ids = r.in("ids"),
                                        .y = r.out("y", {r.dim("ids", 0), r.dim("table", 1)})});
               }});
  e.push_back({{"sample", "greedy (temperature 0) or temperature -> top_k -> top_p -> draw keyed by (seed, step)",
                {in("logits", K::F32)}, {out("ids", K::I32)},
                {{"temperature", "0"}, {"top_k", "0"}, {"top_p", "1"}, {"seed", "0"},
                 {"step", "0", "row b uses step + b"}}},
               [](OpRun& r) {
                 const int64_t B = r.dim("logits", 0);
                 std::vector<ops::SamplingRow> rows(B);
                 for (int64_t b = 0; b < B; ++b)
                   rows[b] = {.temperature = r.attr_f("temperature"), .top_k = r.attr_int("top_k"),
                              .top_p = r.attr_f("top_p"), .seed = r.attr_u64("seed"),
                              .step = r.attr_u64("step") + static_cast<uint64_t>(b)};
                 // The CPU backend samples host logits; other backends get them downloaded.
                 Tensor logits = r.in("logits");
                 if (logits.device() != Device::Cpu) logits = r.backend().to_host(logits);
                 std::vector<int32_t> tokens;
                 r.backend().sample({.logits = logits, .rows = rows, .out = &tokens});
                 Tensor ids = r.out("ids", {B});
                 Tensor host_ids = Tensor::from_i32({B}, tokens);
                 Tensor dev_ids = r.backend().from_host(host_ids, DType::I32);
                 r.backend().copy(dev_ids, ids);
               }});
  return e;
}

const std::vector<OpEntry>& entries() {
  static const std::vector<OpEntry> kEntries = make_entries();
  return kEntries;
}

const OpEntry* find_entry(const std::string& name) {
  for (const auto& e : entries())
    if (e.info.name == name) return &e;
  return nullptr;
}

std::string join_names(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Names and attributes are checked before anything runs, so a typo never silently uses a default.
Status check_names(const OpInfo& info, const std::map<std::string, Tensor>& inputs,
                   const std::map<std::string, std::string>& attrs) {
  std::vector<std::string> input_names, attr_names;
  for (const auto& f : info.inputs) input_names.push_back(f.name);
  for (const auto& a : info.attrs) attr_names.push_back(a.name);
  for (const auto& [name, t] : inputs) {
    bool known = false;
    for (const auto& f : info.inputs) {
      if (f.name == name) known = true;
      if (f.name == "candidates.N" && name.rfind("candidates.", 0) == 0) {
        const std::string idx = name.substr(11);
        known = !idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos;
      }
    }
    if (!known)
      return invalid_argument("op " + info.name + ": unknown input tensor '" + name + "' (inputs: " +
                              join_names(input_names) + ")");
  }
  for (const auto& f : info.inputs) {
    if (f.optional) continue;
    const std::string name = f.name == "candidates.N" ? "candidates.0" : f.name;
    if (!inputs.count(name)) return invalid_argument("op " + info.name + ": missing input tensor '" + name + "'");
  }
  for (const auto& [name, value] : attrs) {
    if (name == "format") continue;  // written by common safetensors producers, not an op attribute
    bool known = false;
    for (const auto& a : info.attrs) known |= a.name == name;
    if (!known)
      return invalid_argument("op " + info.name + ": unknown attribute '" + name + "' (attributes: " +
                              (attr_names.empty() ? std::string("none") : join_names(attr_names)) + ")");
  }
  return Status::ok();
}

}  // namespace

const std::vector<OpInfo>& op_infos() {
  static const std::vector<OpInfo> kInfos = [] {
    std::vector<OpInfo> v;
    for (const auto& e : entries()) v.push_back(e.info);
    return v;
  }();
  return kInfos;
}

const OpInfo* find_op(const std::string& name) {
  const OpEntry* e = find_entry(name);
  return e ? &e->info : nullptr;
}

Status run_named_op(Backend& backend, const std::string& op, const std::map<std::string, Tensor>& inputs,
                    const std::map<std::string, std::string>& attrs, std::map<std::string, Tensor>* outputs) {
  const OpEntry* entry = find_entry(op);
  if (!entry) {
    std::vector<std::string> names;
    for (const auto& e : entries()) names.push_back(e.info.name);
    return invalid_argument("unknown op '" + op + "' (ops: " + join_names(names) + ")");
  }
  if (!outputs) return invalid_argument("op " + op + ": outputs must not be null");
  K3_TRY(check_names(entry->info, inputs, attrs));
  try {
    OpRun run(backend, entry->info, inputs, attrs);
    entry->run(run);
    std::map<std::string, Tensor> result;
    run.download(&result);
    for (auto& [name, t] : result) (*outputs)[name] = std::move(t);
  } catch (const std::exception& e) {
    return invalid_argument("op " + op + ": " + e.what());
  }
  return Status::ok();
}

}  // namespace k3
