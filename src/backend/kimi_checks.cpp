#include "backend/kimi_checks.hpp"

#include "core/error.hpp"

#include <initializer_list>
#include <utility>

namespace ep::backend {

namespace {

void all_f32(std::initializer_list<std::pair<const Tensor *, const char *>> ts, const char *op, Device device) {
  for (const auto &[t, what] : ts) check_f32(*t, op, what, device);
}

/// Tokens of a [a, b, T(, 1)] activation: ne[2]·ne[3].
int64_t tokens3(const Tensor &t) { return t.ne[2] * t.ne[3]; }

}  // namespace

ShortConvDims check_short_conv_silu(const Tensor &x, const Tensor &w, const Tensor &state, const Tensor &y, Device device) {
  const char *op = "short_conv_silu";
  all_f32({{&x, "x"}, {&w, "w"}, {&state, "state"}, {&y, "y"}}, op, device);
  check_same_shape(x, y, op);
  ShortConvDims d;
  d.channels = x.ne[0];
  d.n_tokens = x.n_rows();
  d.kernel = w.ne[0];
  if (d.kernel < 2 || d.kernel > kShortConvMaxKernel)
    fail(Status::unsupported, "{}: kernel width {} (2..{} supported)", op, d.kernel, kShortConvMaxKernel);
  if (w.n_rows() != d.channels || state.ne[0] != d.channels || state.n_rows() != d.kernel - 1)
    fail(Status::shape, "{}: x [{}, {}], w [{}, {}], state [{}, {}] do not fit (expected w [K, C], state [C, K - 1])", op,
         d.channels, d.n_tokens, w.ne[0], w.n_rows(), state.ne[0], state.n_rows());
  if (x.data == y.data && d.channels * d.n_tokens > 0) fail(Status::invalid_argument, "{}: y may not alias x", op);
  return d;
}

void check_kimi_elementwise(const Tensor &x, const Tensor &y, const char *op, Device device) {
  check_f32(x, op, "x", device);
  check_f32(y, op, "y", device);
  check_same_shape(x, y, op);
}

KdaDims check_kda_gate(const Tensor &x, const Tensor &bias, const Tensor &a, const Tensor &g, Device device) {
  const char *op = "kda_gate";
  all_f32({{&x, "x"}, {&bias, "bias"}, {&a, "a"}, {&g, "g"}}, op, device);
  check_same_shape(x, g, op);
  KdaDims d;
  d.dk = x.ne[0];
  d.n_heads = x.ne[1];
  d.n_tokens = tokens3(x);
  if (bias.n_elems() != d.dk * d.n_heads || a.n_elems() != d.n_heads)
    fail(Status::shape, "{}: x [{}, {}, {}], bias [{}], a [{}] do not fit (expected bias [dk·H], a [H])", op, d.dk,
         d.n_heads, d.n_tokens, bias.n_elems(), a.n_elems());
  return d;
}

KdaDims check_kda_recurrence(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g, const Tensor &beta,
                             const Tensor &state, const Tensor &out, Device device) {
  const char *op = "kda_recurrence";
  all_f32({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&g, "g"}, {&beta, "beta"}, {&state, "state"}, {&out, "out"}}, op, device);
  check_same_shape(q, k, op);
  check_same_shape(q, g, op);
  check_same_shape(v, out, op);
  KdaDims d;
  d.dk = q.ne[0];
  d.n_heads = q.ne[1];
  d.n_tokens = tokens3(q);
  d.dv = v.ne[0];
  if (v.ne[1] != d.n_heads || tokens3(v) != d.n_tokens || beta.ne[0] != d.n_heads || beta.n_rows() != d.n_tokens ||
      state.ne[0] != d.dv || state.ne[1] != d.dk || state.ne[2] * state.ne[3] != d.n_heads)
    fail(Status::shape, "{}: q [{}, {}, {}], v [{}, {}, {}], beta [{}, {}], state [{}, {}, {}] do not fit (expected "
         "q, k, g [dk, H, T], v, out [dv, H, T], beta [H, T], state [dv, dk, H])", op, d.dk, d.n_heads, d.n_tokens,
         v.ne[0], v.ne[1], tokens3(v), beta.ne[0], beta.n_rows(), state.ne[0], state.ne[1], state.ne[2] * state.ne[3]);
  for (const Tensor *in : {&q, &k, &v, &g, &beta, &state})
    if (in->data == out.data && out.n_elems() > 0) fail(Status::invalid_argument, "{}: out may not alias an input", op);
  return d;
}

void check_gated_rms_norm(const Tensor &x, const Tensor &w, const Tensor &gate, const Tensor &y, Device device) {
  const char *op = "gated_rms_norm";
  all_f32({{&x, "x"}, {&w, "w"}, {&gate, "gate"}, {&y, "y"}}, op, device);
  check_same_shape(x, y, op);
  check_same_shape(x, gate, op);
  if (w.n_elems() != x.ne[0])
    fail(Status::shape, "{}: x rows of {} values, w has {} (expected the same)", op, x.ne[0], w.n_elems());
}

CausalAttentionDims check_causal_attention(const Tensor &q, const Tensor &keys, const Tensor &values, int64_t n_past,
                                           const Tensor &out, Device device) {
  const char *op = "causal_attention";
  all_f32({{&q, "q"}, {&keys, "keys"}, {&values, "values"}, {&out, "out"}}, op, device);
  CausalAttentionDims d;
  d.dqk = q.ne[0];
  d.n_heads = q.ne[1];
  d.n_tokens = tokens3(q);
  d.dv = values.ne[0];
  d.n_keys = tokens3(keys);
  if (keys.ne[0] != d.dqk || keys.ne[1] != d.n_heads || values.ne[1] != d.n_heads || tokens3(values) != d.n_keys ||
      out.ne[0] != d.dv || out.ne[1] != d.n_heads || tokens3(out) != d.n_tokens)
    fail(Status::shape, "{}: q [{}, {}, {}], keys [{}, {}, {}], values [{}, {}, {}], out [{}, {}, {}] do not fit (expected "
         "q [dqk, H, T], keys [dqk, H, n], values [dv, H, n], out [dv, H, T])", op, d.dqk, d.n_heads, d.n_tokens,
         keys.ne[0], keys.ne[1], tokens3(keys), values.ne[0], values.ne[1], tokens3(values), out.ne[0], out.ne[1],
         tokens3(out));
  if (n_past < 0 || n_past + d.n_tokens > d.n_keys)
    fail(Status::shape, "{}: {} past + {} new tokens need that many keys, {} given", op, n_past, d.n_tokens, d.n_keys);
  if (q.data == out.data && out.n_elems() > 0) fail(Status::invalid_argument, "{}: out may not alias q", op);
  return d;
}

AttnResDims check_attn_res_mix(const Tensor *banked, const Tensor &cur, const Tensor &w, const Tensor &out, Device device) {
  const char *op = "attn_res_mix";
  all_f32({{&cur, "cur"}, {&w, "w"}, {&out, "out"}}, op, device);
  check_same_shape(cur, out, op);
  AttnResDims d;
  d.d = cur.ne[0];
  d.n_tokens = cur.n_rows();
  if (w.n_elems() != d.d) fail(Status::shape, "{}: rows of {} values, w has {}", op, d.d, w.n_elems());
  if (banked) {
    check_f32(*banked, op, "banked", device);
    d.n_banked = banked->ne[2] * banked->ne[3];
    if (banked->ne[0] != d.d || banked->ne[1] != d.n_tokens)
      fail(Status::shape, "{}: banked [{}, {}, {}] does not fit cur [{}, {}] (expected [D, T, nb])", op, banked->ne[0],
           banked->ne[1], d.n_banked, d.d, d.n_tokens);
    if (banked->data == out.data && out.n_elems() > 0) fail(Status::invalid_argument, "{}: out may not alias banked", op);
  }
  if (cur.data == out.data && out.n_elems() > 0) fail(Status::invalid_argument, "{}: out may not alias cur", op);
  return d;
}

}  // namespace ep::backend
