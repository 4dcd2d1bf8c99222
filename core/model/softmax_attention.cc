#include "core/model/softmax_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/forward.h"
#include "core/model/row_ops.h"
#include "core/model/tensor_reader.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {

absl::Status LoadSoftmaxAttention(TensorReader& r, const ModelConfig& c,
                                  const ModelConfig::SoftmaxAttention& a,
                                  const std::string& layer, WeightType weights,
                                  Model::Layer& L) {
  const int64_t H = c.hidden_size;
  const int64_t kv = int64_t{a.num_kv_heads} * a.head_dim;
  const std::string p = layer + "attn.";
  LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w,
                           r.Stacked({{p + "q_proj.weight", H},
                                      {p + "k_proj.weight", kv},
                                      {p + "v_proj.weight", kv}},
                                     H));
  LINATTN_ASSIGN_OR_RETURN(
      L.qkv, PackedLinear::Create(w.data(), H + 2 * kv, H, false, weights));
  if (a.qkv_bias) {
    for (const auto& [name, n] : {std::pair<const char*, int64_t>{"q_proj", H},
                                  {"k_proj", kv},
                                  {"v_proj", kv}}) {
      LINATTN_ASSIGN_OR_RETURN(std::vector<float> b,
                               r.Vector(p + name + ".bias", n));
      L.in_bias.insert(L.in_bias.end(), b.begin(), b.end());
    }
  }
  LINATTN_ASSIGN_OR_RETURN(AlignedBuffer o,
                           r.Matrix(p + "o_proj.weight", H, H));
  LINATTN_ASSIGN_OR_RETURN(L.o,
                           PackedLinear::Create(o.data(), H, H, true, weights));
  // fla's RotaryEmbedding: inv_freq = 1 / base^(2i/d) in fp32, as torch
  // computes it.
  const float base = static_cast<float>(a.rope_theta);
  for (uint32_t i = 0; i < a.head_dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(a.head_dim);
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
  const uint64_t kv = uint64_t{nkv} * d, width = H + 2 * kv;
  const uint32_t half = d / 2;

  LINATTN_RETURN_IF_ERROR(L.qkv->Apply(ws.xn.data(), rows, ws.attn_qkv.data()));
  const RowView<float> qkv(ws.attn_qkv.data(), rows, width);
  // Biases, and rotary at each row's position.
  for (const ForwardPiece& p : pass.pieces) {
    ParallelFor(p.rows, uint64_t{p.rows} * width >= kParallelFloats,
                [&](uint64_t i) {
                  float* row = qkv.row(p.row0 + i);
                  for (uint64_t j = 0; j < L.in_bias.size(); ++j)
                    row[j] += L.in_bias[j];
                  const uint64_t position = p.position + i;
                  for (uint32_t h = 0; h < nh; ++h) {
                    RotateHalves(L.rotary_inv_freq.data(), half, position,
                                 row + uint64_t{h} * d);
                  }
                  for (uint32_t h = 0; h < nkv; ++h) {
                    RotateHalves(L.rotary_inv_freq.data(), half, position,
                                 row + H + uint64_t{h} * d);
                  }
                });
  }
  // Each (piece, query head): its rows against the keys they see.
  const RowView<float> out(ws.attn_o.data(), rows, H);
  const uint64_t tasks = uint64_t{pass.pieces.size()} * nh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  uint64_t work = 0;
  for (const ForwardPiece& p : pass.pieces) {
    work += uint64_t{p.rows} * nh * d *
            (a.window == 0 ? p.position + p.rows
                           : std::min<uint64_t>(a.window, p.position + p.rows));
  }
  ParallelFor(tasks, work >= kParallelFloats, [&](uint64_t task) {
    const ForwardPiece& p = pass.pieces[task / nh];
    const uint32_t h = static_cast<uint32_t>(task % nh), g = h / group;
    const KvCache& cache = pass.items[p.item].state->kv()[pass.layer];
    const uint64_t first = p.position;  // the piece's first position
    std::vector<float> scores;
    for (uint32_t i = 0; i < p.rows; ++i) {
      const uint64_t pos = first + i;
      const uint64_t lo =
          a.window == 0 || pos + 1 < a.window ? 0 : pos + 1 - a.window;
      const float* q = qkv.row(p.row0 + i) + uint64_t{h} * d;
      auto key = [&](uint64_t j) -> const float* {
        return j < first ? cache.key(j) + uint64_t{g} * d
                         : qkv.row(p.row0 + (j - first)) + H + uint64_t{g} * d;
      };
      auto value = [&](uint64_t j) -> const float* {
        return j < first
                   ? cache.value(j) + uint64_t{g} * d
                   : qkv.row(p.row0 + (j - first)) + H + kv + uint64_t{g} * d;
      };
      scores.resize(pos - lo + 1);
      float most = -std::numeric_limits<float>::infinity();
      for (uint64_t j = lo; j <= pos; ++j) {
        const float* k = key(j);
        float s = 0;
        for (uint32_t e = 0; e < d; ++e) s += q[e] * k[e];
        s *= scale;
        scores[j - lo] = s;
        most = std::max(most, s);
      }
      float sum = 0;
      for (float& s : scores) {
        s = std::exp(s - most);
        sum += s;
      }
      float* o = out.row(p.row0 + i) + uint64_t{h} * d;
      std::fill(o, o + d, 0.0f);
      for (uint64_t j = lo; j <= pos; ++j) {
        const float w = scores[j - lo];
        const float* v = value(j);
        for (uint32_t e = 0; e < d; ++e) o[e] += w * v[e];
      }
      const float inv = 1.0f / sum;
      for (uint32_t e = 0; e < d; ++e) o[e] *= inv;
    }
  });
  for (float x : std::span<const float>(ws.attn_o.data(), uint64_t{rows} * H)) {
    if (!std::isfinite(x)) {
      return absl::InternalError(absl::StrCat(
          "layer ", pass.layer,
          ": the model's activations are not finite (softmax attention)"));
    }
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
      cache.Write(j, row + H, row + H + kv);
    }
    target.layers()[pass.layer].set_position(end);
  }
  return L.o->Apply(ws.attn_o.data(), rows, ws.x.data());
}

}  // namespace linattn
