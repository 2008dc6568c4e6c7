//===- tests/strategy/builder.cpp - Sample-model blocks built by hand ------===//
//
// The op sequences of the sample models (gpt2_tiny, llama_tiny / llama3_8b, cnn_small) as
// `apc inspect` prints them, rebuilt without torch for the strategy tests and the benchmark.
//
//===----------------------------------------------------------------------===//
#include "builder.h"

#include <limits>

namespace apc::strategy::testing {

std::vector<std::string> strategyStrings(const std::vector<NodeStrategies>& all, NodeId n) {
  for (const auto& ns : all)
    if (ns.node == n) {
      std::vector<std::string> out;
      for (const auto& s : ns.strategies) out.push_back(s.toString());
      return out;
    }
  return {};
}

std::vector<std::string> strategiesOf(const Graph& g, NodeId n, const std::string& mesh,
                                      const EnumerateOptions& options) {
  auto m = mesh::DeviceMesh::parse(mesh);
  return strategyStrings(enumerate(g, *m, defaultRegistry(), options), n);
}

namespace {

/// A shape op (aten::size.int) producing a known int, as the importer records it.
ValueId sizeOf(Builder& b, ValueId t, int64_t dim, int64_t value) {
  ir::Value v;
  v.type = ValueType::kInt;
  v.debug_name = "s" + std::to_string(b.g.numValues());
  v.constant = value;
  ValueId out = b.g.addValue(v);
  b.addOp("aten::size.int", {t, b.i(dim)}, {out});
  return out;
}

/// prim::ListConstruct of ints (a shape op) with its known value.
ValueId intList(Builder& b, std::vector<ValueId> items, std::vector<int64_t> value) {
  ir::Value v;
  v.type = ValueType::kIntList;
  v.debug_name = "il" + std::to_string(b.g.numValues());
  v.constant = value;
  ValueId out = b.g.addValue(v);
  b.addOp("prim::ListConstruct", std::move(items), {out});
  return out;
}

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

}  // namespace

Graph gpt2Block(int64_t B, int64_t T, int64_t C, int64_t H, int64_t V) {
  Builder b;
  int64_t hd = C / H;
  ValueId idx = b.input("idx", {B, T}, DType::kI64);
  ValueId targets = b.input("targets", {B, T}, DType::kI64);
  ValueId wte = b.param("wte.weight", {V, C});
  ValueId wpe = b.param("wpe.weight", {2 * T, C});
  auto ln = [&](const std::string& n, ValueId x) {
    ValueId w = b.param(n + ".weight", {C}), bias = b.param(n + ".bias", {C});
    ValueId shape = intList(b, {b.i(C)}, {C});
    return b.op("aten::layer_norm", {x, shape, w, bias, b.f(1e-5), b.b(true)}, {B, T, C});
  };
  auto linear = [&](const std::string& n, ValueId x, int64_t in, int64_t out) {
    ValueId w = b.param(n + ".weight", {out, in}), bias = b.param(n + ".bias", {out});
    return b.op("aten::linear", {x, w, bias}, {B, T, out});
  };
  ValueId t = sizeOf(b, idx, 1, T);
  ValueId tt = b.op("prim::NumToTensor.Scalar", {t}, {}, DType::kI64, false);
  ValueId pos = b.op("aten::arange.start", {b.i(0), t, b.i(4), b.none(), b.str("cpu"), b.b(false)},
                     {T}, DType::kI64, false);
  (void)tt;
  ValueId tok = b.op("aten::embedding", {wte, idx, b.i(-1), b.b(false), b.b(false)}, {B, T, C});
  ValueId pe = b.op("aten::embedding", {wpe, pos, b.i(-1), b.b(false), b.b(false)}, {T, C});
  ValueId x = b.op("aten::add.Tensor", {tok, pe, b.i(1)}, {B, T, C});

  ValueId h = ln("ln_1", x);
  ValueId qkv = linear("attn.c_attn", h, C, 3 * C);
  ValueId parts =
      b.listOp("aten::split.Tensor", {qkv, b.i(C), b.i(2)}, {{B, T, C}, {B, T, C}, {B, T, C}});
  std::vector<ValueId> qkv3 =
      b.multiOp("prim::ListUnpack", {parts}, {{B, T, C}, {B, T, C}, {B, T, C}});
  std::vector<ValueId> heads;
  for (ValueId p : qkv3) {
    ValueId v = b.op("aten::view", {p, b.ints({B, T, H, hd})}, {B, T, H, hd});
    heads.push_back(b.op("aten::transpose.int", {v, b.i(1), b.i(2)}, {B, H, T, hd}));
  }
  ValueId kt = b.op("aten::transpose.int", {heads[1], b.i(-2), b.i(-1)}, {B, H, hd, T});
  ValueId att = b.op("aten::matmul", {heads[0], kt}, {B, H, T, T});
  att = b.op("aten::mul.Tensor", {att, b.f(0.2886751345948129)}, {B, H, T, T});
  ValueId ones = b.op("aten::ones", {b.ints({T, T}), b.i(11), b.none(), b.str("cpu"), b.b(false)},
                      {T, T}, DType::kBool, false);
  ValueId mask = b.op("aten::triu", {ones, b.i(1)}, {T, T}, DType::kBool, false);
  att = b.op("aten::masked_fill.Scalar", {att, mask, b.f(-1e300)}, {B, H, T, T});
  att = b.op("aten::softmax.int", {att, b.i(-1), b.none()}, {B, H, T, T});
  ValueId y = b.op("aten::matmul", {att, heads[2]}, {B, H, T, hd});
  y = b.op("aten::transpose.int", {y, b.i(1), b.i(2)}, {B, T, H, hd});
  y = b.op("aten::contiguous", {y, b.i(0)}, {B, T, H, hd});
  y = b.op("aten::view", {y, b.ints({B, T, C})}, {B, T, C});
  y = linear("attn.c_proj", y, C, C);
  x = b.op("aten::add.Tensor", {x, y, b.i(1)}, {B, T, C});
  h = ln("ln_2", x);
  h = linear("mlp.c_fc", h, C, 4 * C);
  h = b.op("aten::gelu", {h, b.str("tanh")}, {B, T, 4 * C});
  h = linear("mlp.c_proj", h, 4 * C, C);
  x = b.op("aten::add.Tensor", {x, h, b.i(1)}, {B, T, C});
  x = ln("ln_f", x);
  ValueId logits = b.op("aten::linear", {x, wte, b.none()}, {B, T, V});
  ValueId flat = b.op("aten::view", {logits, b.ints({-1, V})}, {B * T, V});
  ValueId tflat = b.op("aten::view", {targets, b.ints({-1})}, {B * T}, DType::kI64, false);
  ValueId loss =
      b.op("aten::cross_entropy_loss", {flat, tflat, b.none(), b.i(1), b.i(-100), b.f(0.0)}, {});
  b.g.setOutputs(ir::OutputTree::makeLeaf(loss));
  return std::move(b.g);
}

Graph llamaModel(int64_t layers, int64_t B, int64_t T, int64_t D, int64_t H, int64_t KV, int64_t F,
                 int64_t V) {
  Builder b;
  int64_t hd = D / H, rep = H / KV;
  ValueId tokens = b.input("tokens", {B, T}, DType::kI64);
  ValueId emb = b.param("tok_embeddings.weight", {V, D});
  ValueId fcos = b.buffer("freqs_cos", {2 * T, hd});
  ValueId fsin = b.buffer("freqs_sin", {2 * T, hd});
  ValueId t = sizeOf(b, tokens, 1, T);
  b.op("prim::NumToTensor.Scalar", {t}, {}, DType::kI64, false);
  ValueId h = b.op("aten::embedding", {emb, tokens, b.i(-1), b.b(false), b.b(false)}, {B, T, D});
  ValueId cos =
      b.op("aten::slice.Tensor", {fcos, b.i(0), b.i(0), t, b.i(1)}, {T, hd}, DType::kF32, false);
  ValueId sin =
      b.op("aten::slice.Tensor", {fsin, b.i(0), b.i(0), t, b.i(1)}, {T, hd}, DType::kF32, false);
  ValueId full =
      b.op("aten::full",
           {intList(b, {t, t}, {T, T}), b.f(-1e300), b.none(), b.none(), b.str("cpu"), b.b(false)},
           {T, T}, DType::kF32, false);
  ValueId mask = b.op("aten::triu", {full, b.i(1)}, {T, T}, DType::kF32, false);

  auto rmsnorm = [&](const std::string& n, ValueId x) {
    ValueId w = b.param(n + ".weight", {D});
    ValueId p = b.op("aten::pow.Tensor_Scalar", {x, b.i(2)}, {B, T, D});
    ValueId m =
        b.op("aten::mean.dim", {p, intList(b, {b.i(-1)}, {-1}), b.b(true), b.none()}, {B, T, 1});
    ValueId a = b.op("aten::add.Tensor", {m, b.f(1e-5), b.i(1)}, {B, T, 1});
    ValueId r = b.op("aten::rsqrt", {a}, {B, T, 1});
    ValueId y = b.op("aten::mul.Tensor", {x, r}, {B, T, D});
    return b.op("aten::mul.Tensor", {y, w}, {B, T, D});
  };
  auto linear = [&](const std::string& n, ValueId x, int64_t in, int64_t out) {
    ValueId w = b.param(n + ".weight", {out, in});
    return b.op("aten::linear", {x, w, b.none()}, {B, T, out});
  };
  // Rotary embedding of x [B, T, n, hd].
  auto rotary = [&](ValueId x, int64_t n) {
    ValueId x1 =
        b.op("aten::slice.Tensor", {x, b.i(3), b.i(0), b.i(hd / 2), b.i(1)}, {B, T, n, hd / 2});
    ValueId x2 = b.op("aten::slice.Tensor", {x, b.i(3), b.i(hd / 2), b.i(kMaxInt), b.i(1)},
                      {B, T, n, hd / 2});
    ValueId nx2 = b.op("aten::neg", {x2}, {B, T, n, hd / 2});
    ValueId lst =
        b.listOp("prim::ListConstruct", {nx2, x1}, {{B, T, n, hd / 2}, {B, T, n, hd / 2}});
    ValueId rot = b.op("aten::cat", {lst, b.i(-1)}, {B, T, n, hd});
    auto bcast = [&](ValueId f) {
      ValueId u = b.op("aten::unsqueeze", {f, b.i(0)}, {1, T, hd}, DType::kF32, false);
      u = b.op("aten::slice.Tensor", {u, b.i(1), b.i(0), b.i(kMaxInt), b.i(1)}, {1, T, hd},
               DType::kF32, false);
      u = b.op("aten::unsqueeze", {u, b.i(2)}, {1, T, 1, hd}, DType::kF32, false);
      return b.op("aten::slice.Tensor", {u, b.i(3), b.i(0), b.i(kMaxInt), b.i(1)}, {1, T, 1, hd},
                  DType::kF32, false);
    };
    ValueId a = b.op("aten::mul.Tensor", {x, bcast(cos)}, {B, T, n, hd});
    ValueId c = b.op("aten::mul.Tensor", {rot, bcast(sin)}, {B, T, n, hd});
    return b.op("aten::add.Tensor", {a, c, b.i(1)}, {B, T, n, hd});
  };
  // GQA repeat of x [B, T, KV, hd] to [B, T, H, hd].
  auto repeatKv = [&](ValueId x) {
    for (int64_t d = 0; d < 3; ++d)
      x = b.op("aten::slice.Tensor", {x, b.i(d), b.i(0), b.i(kMaxInt), b.i(1)}, {B, T, KV, hd});
    x = b.op("aten::unsqueeze", {x, b.i(3)}, {B, T, KV, 1, hd});
    x = b.op("aten::slice.Tensor", {x, b.i(4), b.i(0), b.i(kMaxInt), b.i(1)}, {B, T, KV, 1, hd});
    x = b.op("aten::expand", {x, b.ints({B, T, KV, rep, hd}), b.b(false)}, {B, T, KV, rep, hd});
    return b.op("aten::reshape", {x, b.ints({B, T, H, hd})}, {B, T, H, hd});
  };

  for (int64_t l = 0; l < layers; ++l) {
    std::string p = "layers." + std::to_string(l);
    ValueId x = rmsnorm(p + ".attention_norm", h);
    ValueId q =
        b.op("aten::view", {linear(p + ".wq", x, D, H * hd), b.ints({B, T, H, hd})}, {B, T, H, hd});
    ValueId k = b.op("aten::view", {linear(p + ".wk", x, D, KV * hd), b.ints({B, T, KV, hd})},
                     {B, T, KV, hd});
    ValueId v = b.op("aten::view", {linear(p + ".wv", x, D, KV * hd), b.ints({B, T, KV, hd})},
                     {B, T, KV, hd});
    q = rotary(q, H);
    k = repeatKv(rotary(k, KV));
    v = repeatKv(v);
    q = b.op("aten::transpose.int", {q, b.i(1), b.i(2)}, {B, H, T, hd});
    k = b.op("aten::transpose.int", {k, b.i(1), b.i(2)}, {B, H, T, hd});
    v = b.op("aten::transpose.int", {v, b.i(1), b.i(2)}, {B, H, T, hd});
    ValueId kt = b.op("aten::transpose.int", {k, b.i(2), b.i(3)}, {B, H, hd, T});
    ValueId s = b.op("aten::matmul", {q, kt}, {B, H, T, T});
    s = b.op("aten::mul.Tensor", {s, b.f(0.25)}, {B, H, T, T});
    s = b.op("aten::add.Tensor", {s, mask, b.i(1)}, {B, H, T, T});
    s = b.op("aten::to.dtype", {s, b.i(6), b.b(false), b.b(false), b.none()}, {B, H, T, T});
    s = b.op("aten::softmax.int", {s, b.i(-1), b.none()}, {B, H, T, T});
    s = b.op("aten::type_as", {s, q}, {B, H, T, T});
    ValueId o = b.op("aten::matmul", {s, v}, {B, H, T, hd});
    o = b.op("aten::transpose.int", {o, b.i(1), b.i(2)}, {B, T, H, hd});
    o = b.op("aten::contiguous", {o, b.i(0)}, {B, T, H, hd});
    o = b.op("aten::view", {o, b.ints({B, T, D})}, {B, T, D});
    o = linear(p + ".wo", o, H * hd, D);
    h = b.op("aten::add.Tensor", {h, o, b.i(1)}, {B, T, D});
    x = rmsnorm(p + ".ffn_norm", h);
    ValueId g = b.op("aten::silu", {linear(p + ".w1", x, D, F)}, {B, T, F});
    ValueId u = linear(p + ".w3", x, D, F);
    ValueId m = b.op("aten::mul.Tensor", {g, u}, {B, T, F});
    h = b.op("aten::add.Tensor", {h, linear(p + ".w2", m, F, D), b.i(1)}, {B, T, D});
  }
  h = rmsnorm("norm", h);
  ValueId logits = linear("output", h, D, V);
  logits = b.op("aten::to.dtype", {logits, b.i(6), b.b(false), b.b(false), b.none()}, {B, T, V});
  b.g.setOutputs(ir::OutputTree::makeLeaf(logits));
  return std::move(b.g);
}

Graph cnnSmall() {
  Builder b;
  ValueId x = b.input("x", {8, 3, 32, 32});
  auto pair = [&](int64_t v) { return intList(b, {b.i(v), b.i(v)}, {v, v}); };
  int64_t c = 3, s = 32;
  for (int64_t stage = 0; stage < 3; ++stage) {
    int64_t co = 16 << stage;
    std::string p = "features." + std::to_string(stage);
    ValueId w = b.param(p + ".conv.weight", {co, c, 3, 3});
    ValueId bias = stage == 2 ? b.param(p + ".conv.bias", {co}) : b.none();
    x = b.op("aten::_convolution",
             {x, w, bias, pair(1), pair(1), pair(1), b.b(false), pair(0), b.i(1), b.b(false),
              b.b(false), b.b(true), b.b(true)},
             {8, co, s, s});
    ValueId bw = b.param(p + ".bn.weight", {co}), bb = b.param(p + ".bn.bias", {co});
    ValueId rm = b.buffer(p + ".bn.running_mean", {co}), rv = b.buffer(p + ".bn.running_var", {co});
    x = b.op("aten::batch_norm", {x, bw, bb, rm, rv, b.b(false), b.f(0.1), b.f(1e-5), b.b(true)},
             {8, co, s, s});
    x = b.op("aten::relu", {x}, {8, co, s, s});
    if (stage < 2) {
      s /= 2;
      x = b.op("aten::max_pool2d", {x, pair(2), pair(2), pair(0), pair(1), b.b(false)},
               {8, co, s, s});
    }
    c = co;
  }
  x = b.op("aten::adaptive_avg_pool2d", {x, pair(1)}, {8, c, 1, 1});
  x = b.op("aten::flatten.using_ints", {x, b.i(1), b.i(-1)}, {8, c});
  ValueId w = b.param("classifier.weight", {10, c}), bias = b.param("classifier.bias", {10});
  x = b.op("aten::linear", {x, w, bias}, {8, 10});
  b.g.setOutputs(ir::OutputTree::makeLeaf(x));
  return std::move(b.g);
}

}  // namespace apc::strategy::testing
