#include "core/model/softmax_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/model/forward.h"
#include "core/model/model_types.h"
#include "core/model/row_ops.h"
#include "core/model/tensor_reader.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

// The most query heads one task of the attention keeps scores for.
constexpr uint32_t kMaxHeadsPerTask = 16;
// The query vectors (rows × a task's heads) that go over the keys together:
// their 1 KiB each at head size 256 stay in the L1 cache.
constexpr uint32_t kVectorsPerTile = 32;

}  // namespace

absl::Status LoadSoftmaxAttention(TensorReader& r, const ModelConfig& c,
                                  const ModelConfig::SoftmaxAttention& a,
                                  const std::string& p, WeightType weights,
                                  Model::Layer& L) {
  const int64_t H = c.hidden_size, d = a.head_dim;
  const int64_t qw = a.q_width(), kv = int64_t{a.num_kv_heads} * d;
  // q_proj holds each head's query rows then, with an output gate, its gate
  // rows (qwen3_next's view(…, heads, 2·d).chunk(2)); linattn keeps every
  // query row first and the gates' after v: q | k | v | gate.
  const int64_t q_rows = a.output_gate ? 2 * qw : qw;
  const int64_t width = q_rows + 2 * kv;
  LINATTN_RETURN_IF_ERROR(r.Check(p + "q_proj.weight", {q_rows, H}));
  LINATTN_RETURN_IF_ERROR(r.Check(p + "k_proj.weight", {kv, H}));
  LINATTN_RETURN_IF_ERROR(r.Check(p + "v_proj.weight", {kv, H}));
  // Where q_proj's row i goes in q | k | v | gate.
  auto q_row = [&](int64_t i) -> int64_t {
    if (!a.output_gate) return i;
    const int64_t head = i / (2 * d), j = i % (2 * d);
    return j < d ? head * d + j : qw + 2 * kv + head * d + (j - d);
  };
  {
    AlignedBuffer w(width * H);
    {
      std::vector<float> q(q_rows * H);
      LINATTN_RETURN_IF_ERROR(
          r.Read(p + "q_proj.weight", {q_rows, H}, q.data()));
      for (int64_t i = 0; i < q_rows; ++i) {
        std::memcpy(w.data() + q_row(i) * H, q.data() + i * H,
                    H * sizeof(float));
      }
    }
    LINATTN_RETURN_IF_ERROR(
        r.Read(p + "k_proj.weight", {kv, H}, w.data() + qw * H));
    LINATTN_RETURN_IF_ERROR(
        r.Read(p + "v_proj.weight", {kv, H}, w.data() + (qw + kv) * H));
    LINATTN_ASSIGN_OR_RETURN(
        L.qkv, PackedLinear::Create(w.data(), width, H, false, weights));
  }
  if (a.qkv_bias) {
    L.in_bias.assign(width, 0.0f);
    LINATTN_ASSIGN_OR_RETURN(std::vector<float> q,
                             r.Vector(p + "q_proj.bias", q_rows));
    for (int64_t i = 0; i < q_rows; ++i) L.in_bias[q_row(i)] = q[i];
    LINATTN_ASSIGN_OR_RETURN(std::vector<float> k,
                             r.Vector(p + "k_proj.bias", kv));
    LINATTN_ASSIGN_OR_RETURN(std::vector<float> v,
                             r.Vector(p + "v_proj.bias", kv));
    std::copy(k.begin(), k.end(), L.in_bias.begin() + qw);
    std::copy(v.begin(), v.end(), L.in_bias.begin() + qw + kv);
  }
  if (a.qk_norm) {
    LINATTN_ASSIGN_OR_RETURN(L.q_norm, r.Vector(p + "q_norm.weight", d));
    LINATTN_ASSIGN_OR_RETURN(L.k_norm, r.Vector(p + "k_norm.weight", d));
    for (std::vector<float>* w : {&L.q_norm, &L.k_norm}) {
      for (float& x : *w) x += c.norm_weight_offset;
    }
  }
  LINATTN_ASSIGN_OR_RETURN(AlignedBuffer o,
                           r.Matrix(p + "o_proj.weight", H, qw));
  if (a.o_bias) {
    LINATTN_ASSIGN_OR_RETURN(L.out_bias, r.Vector(p + "o_proj.bias", H));
  }
  ScaleResidualBranch(c, o, L.out_bias);
  LINATTN_ASSIGN_OR_RETURN(
      L.o, PackedLinear::Create(o.data(), H, qw, true, weights));
  if (!a.rope) return absl::OkStatus();
  // fla's and transformers' rotary: inv_freq = 1 / base^(2i/r) in fp32, as
  // torch computes it, r the channels it turns (all of the head's but for
  // a partial rotary).
  const float base = static_cast<float>(a.rope_theta);
  const uint32_t rotated = a.rotated();
  for (uint32_t i = 0; i < rotated / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rotated);
    L.rotary_inv_freq.push_back(1.0f / std::pow(base, e));
  }
  return absl::OkStatus();
}

absl::Status RunSoftmaxAttention(ForwardRunner& runner, const LayerPass& pass) {
  const Model& m = runner.model();
  const ModelConfig& c = m.config();
  const Model::Layer& L = m.layers()[pass.layer];
  const ModelConfig::SoftmaxAttention& a = *c.attention_layer(pass.layer);
  ForwardWorkspace& ws = runner.workspace();
  const uint32_t rows = pass.rows, H = c.hidden_size, d = a.head_dim;
  const uint32_t nh = a.num_heads, nkv = a.num_kv_heads, group = nh / nkv;
  // Each row of the product: q (qw) | k | v | the output gate (qw, with
  // one).
  const uint64_t qw = a.q_width(), kv = uint64_t{nkv} * d;
  const uint64_t width = qw * (a.output_gate ? 2 : 1) + 2 * kv;
  const uint32_t half = a.rotated() / 2;

  LINATTN_RETURN_IF_ERROR(L.qkv->Apply(ws.xn.data(), rows, ws.attn_qkv.data()));
  const RowView<float> qkv(ws.attn_qkv.data(), rows, width);
  // Biases, q and k norms per head, and rotary at each row's position.
  for (const ForwardPiece& p : pass.pieces) {
    ParallelFor(p.rows, uint64_t{p.rows} * width >= kParallelFloats,
                [&](uint64_t i) {
                  float* row = qkv.row(p.row0 + i);
                  for (uint64_t j = 0; j < L.in_bias.size(); ++j)
                    row[j] += L.in_bias[j];
                  if (a.qk_norm) {
                    RmsNormRows(row, nh, d, L.q_norm.data(), c.norm_eps, row);
                    RmsNormRows(row + qw, nkv, d, L.k_norm.data(), c.norm_eps,
                                row + qw);
                  }
                  if (!a.rope) return;
                  const uint64_t position = p.position + i;
                  for (uint32_t h = 0; h < nh; ++h) {
                    RotateHalves(L.rotary_inv_freq.data(), half, position,
                                 row + uint64_t{h} * d);
                  }
                  for (uint32_t h = 0; h < nkv; ++h) {
                    RotateHalves(L.rotary_inv_freq.data(), half, position,
                                 row + qw + uint64_t{h} * d);
                  }
                });
  }
  // Each task: one piece's rows for `per` query heads of one key/value
  // head, reading each key and value once for all of them (the group's
  // heads in halves while there are too few tasks to share the cores).
  const RowView<float> out(ws.attn_o.data(), rows, qw);
  uint32_t per = group;
  while (per % 2 == 0 && (per > kMaxHeadsPerTask ||
                          uint64_t{pass.pieces.size()} * nh / per < 4))
    per /= 2;
  if (per > kMaxHeadsPerTask) per = 1;
  const uint32_t splits = group / per;
  const uint64_t tasks = uint64_t{pass.pieces.size()} * nkv * splits;
  const float scale = a.scale != 0 ? static_cast<float>(a.scale)
                                   : 1.0f / std::sqrt(static_cast<float>(d));
  uint64_t work = 0;
  for (const ForwardPiece& p : pass.pieces) {
    work += uint64_t{p.rows} * nh * d *
            (a.window == 0 ? p.position + p.rows
                           : std::min<uint64_t>(a.window, p.position + p.rows));
  }
  const VectorKernels& kernels = ActiveKernels();
  ParallelFor(tasks, work >= kParallelFloats, [&](uint64_t task) {
    const ForwardPiece& p = pass.pieces[task / (uint64_t{nkv} * splits)];
    const uint32_t g = static_cast<uint32_t>(task / splits % nkv);
    const uint32_t h0 = g * group + static_cast<uint32_t>(task % splits) * per;
    const KvCache& cache = pass.items[p.item].state->kv()[pass.layer];
    const uint64_t first = p.position;  // the piece's first position
    auto key = [&](uint64_t j) -> const float* {
      return j < first ? cache.key(j) + uint64_t{g} * d
                       : qkv.row(p.row0 + (j - first)) + qw + uint64_t{g} * d;
    };
    auto value = [&](uint64_t j) -> const float* {
      return j < first
                 ? cache.value(j) + uint64_t{g} * d
                 : qkv.row(p.row0 + (j - first)) + qw + kv + uint64_t{g} * d;
    };
    // The row's first key (a window's), and its count.
    auto lowest = [&](uint64_t pos) -> uint64_t {
      return a.window == 0 || pos + 1 < a.window ? 0 : pos + 1 - a.window;
    };
    // Rows in tiles of t, each row with its `per` query heads: the tile's
    // nv = t·per query vectors (vector v: row i0 + v / per, head
    // h0 + v % per) go over the keys together, each key and value read
    // once for all of them. A vector's scores are the vector kernels' dot
    // and its output the kernels' axpy over its own keys in order, the same
    // operations whatever the tile: a row gives the same bits decoded alone
    // or inside a prompt piece. (Vectors also take dots of keys outside
    // their range, within the tile's; those are never read.)
    const uint32_t t = std::max<uint32_t>(1, kVectorsPerTile / per);
    thread_local std::vector<float> scores;
    const float* qs[kVectorsPerTile];
    float dots[kVectorsPerTile];
    float inv[kVectorsPerTile];
    uint64_t lo[kVectorsPerTile], hi[kVectorsPerTile];
    for (uint32_t i0 = 0; i0 < p.rows; i0 += t) {
      const uint32_t rows_here = std::min(t, p.rows - i0);
      const uint32_t nv = rows_here * per;
      const uint64_t from = lowest(first + i0), to = first + i0 + rows_here - 1;
      const uint64_t span = to - from + 1;
      for (uint32_t v = 0; v < nv; ++v) {
        const uint64_t pos = first + i0 + v / per;
        qs[v] = qkv.row(p.row0 + i0 + v / per) + uint64_t{h0 + v % per} * d;
        lo[v] = lowest(pos);
        hi[v] = pos;
      }
      scores.resize(nv * span);
      for (uint64_t j = from; j <= to; ++j) {
        kernels.dot_rows(d, nv, qs, key(j), dots);
        for (uint32_t v = 0; v < nv; ++v) {
          scores[v * span + (j - from)] = dots[v] * scale;
        }
      }
      for (uint32_t v = 0; v < nv; ++v) {
        float* sv = scores.data() + v * span + (lo[v] - from);
        const uint64_t n = hi[v] - lo[v] + 1;
        if (!kernels.all_finite(n, sv)) {
          // Made NaN, for the check below to refuse.
          inv[v] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        const float most = *std::max_element(sv, sv + n);
        kernels.exp_shifted(static_cast<uint32_t>(n), most, 1.0f, sv);
        float sum = 0;
        for (uint64_t j = 0; j < n; ++j) sum += sv[j];
        inv[v] = 1.0f / sum;
      }
      for (uint32_t r = 0; r < rows_here; ++r) {
        float* o = out.row(p.row0 + i0 + r) + uint64_t{h0} * d;
        std::fill(o, o + uint64_t{per} * d, 0.0f);
      }
      float* os[kVectorsPerTile];
      for (uint32_t v = 0; v < nv; ++v) {
        os[v] = out.row(p.row0 + i0 + v / per) + uint64_t{h0 + v % per} * d;
      }
      // Each value into the vectors whose range holds it (all of them but
      // at a tile's edges).
      float* into[kVectorsPerTile];
      for (uint64_t j = from; j <= to; ++j) {
        uint32_t held = 0;
        for (uint32_t v = 0; v < nv; ++v) {
          if (j < lo[v] || j > hi[v]) continue;
          dots[held] = scores[v * span + (j - from)];
          into[held++] = os[v];
        }
        kernels.axpy_rows(d, held, dots, value(j), into);
      }
      for (uint32_t v = 0; v < nv; ++v) kernels.scale(d, inv[v], os[v]);
    }
  });
  for (float x : std::span<const float>(ws.attn_o.data(), rows * qw)) {
    if (!std::isfinite(x)) {
      return absl::InternalError(absl::StrCat(
          "layer ", pass.layer,
          ": the model's activations are not finite (softmax attention)"));
    }
  }
  if (a.output_gate) {
    // o · σ(gate), the gate's columns after v.
    // (σ in place: the gate's columns are read nowhere else.)
    ParallelFor(rows, rows * qw >= kParallelFloats, [&](uint64_t i) {
      float* gate = qkv.row(i) + qw + 2 * kv;
      float* o = out.row(i);
      kernels.sigmoid(static_cast<uint32_t>(qw), gate, gate);
      for (uint64_t e = 0; e < qw; ++e) o[e] *= gate[e];
    });
  }
  // The pieces' keys and values into their caches (a window's ring keeps
  // the last of them), and their positions; a one-token item with `into`
  // leaves its state as it was and writes a copy-on-write copy of its
  // cache into `into` instead.
  for (const ForwardPiece& p : pass.pieces) {
    const ForwardItem& item = pass.items[p.item];
    ModelState& target = item.into != nullptr ? *item.into : *item.state;
    KvCache& cache = target.kv()[pass.layer];
    if (item.into != nullptr) cache = item.state->kv()[pass.layer].Copy();
    const uint64_t end = p.position + p.rows;
    cache.Reserve(end);
    for (uint64_t j = std::max(p.position, cache.FirstHeld(end)); j < end;
         ++j) {
      const float* row = qkv.row(p.row0 + (j - p.position));
      cache.Write(j, row + qw, row + qw + kv);
    }
    target.layers()[pass.layer].set_position(end);
  }
  LINATTN_RETURN_IF_ERROR(L.o->Apply(ws.attn_o.data(), rows, ws.x.data()));
  if (!L.out_bias.empty()) {
    const RowView<float> x(ws.x.data(), rows, H);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < H; ++i) x.row(r)[i] += L.out_bias[i];
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
