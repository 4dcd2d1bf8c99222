// config.json fields that transformers' model types (granitemoehybrid,
// qwen3_next) read alike, each refused by name when it is out of range.
#ifndef LINATTN_CORE_MODEL_TYPES_TRANSFORMERS_FIELDS_H_
#define LINATTN_CORE_MODEL_TYPES_TRANSFORMERS_FIELDS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "core/model/config.h"
#include "core/model/config_json.h"
#include "core/model/model_types.h"

namespace linattn {

// A finite number within fp32's range (positive, with its reciprocal in
// range too, with `positive`), `fallback` when absent or null.
absl::Status Multiplier(const json& j, const char* field, double fallback,
                        bool positive, double* out);

// A count in [0, kMaxModelDim] (0 allowed), `fallback` when absent.
absl::Status Count(const json& j, const char* field, uint32_t fallback,
                   uint32_t* out);

// A mixture-of-experts' sizes into c.num_experts (`count`, 0 for none, at
// most kMaxExperts), and with experts c.expert_size (`size`) and
// c.experts_per_token (`per_token`, at most the count); each field's
// default beside its name.
struct ExpertFields {
  const char* count;
  uint32_t count_default;
  const char* size;
  uint32_t size_default;
  const char* per_token;
  uint32_t per_token_default;
};
absl::Status ReadExpertSizes(const json& j, const ExpertFields& f,
                             ModelConfig& c);

// The default rotary embedding's base and the fraction of each head it
// turns: the dictionary transformers reads them from — the legacy
// `rope_scaling` when it is given and not empty, else `rope_parameters`
// (transformers from v5) — where it gives them, else the top-level
// rope_theta and partial_rotary_factor, else `theta` / `factor` as passed
// in (`factor` may be null: the type has no partial rotary). A rope_type
// other than "default" (scaled, YaRN …) is refused, and so is a
// dictionary per layer type (its values dictionaries).
absl::Status ReadRope(const json& j, double* theta, double* factor);

// transformers' decoder names: model.embed_tokens, model.layers.N.{
// input_layernorm, self_attn, post_attention_layernorm}, model.norm; the
// caller names the MLP and experts.
ModelTypeDef::TensorNames TransformersTensorNames();

// Refuses a null in any of `fields`: transformers' typed configs
// (huggingface_hub's @strict) take none where a number or a Boolean is
// declared, so a null has no meaning to stand for.
absl::Status RefuseNulls(const json& j,
                         std::initializer_list<const char*> fields);

// Multi-token-prediction heads (a checkpoint's extra layers for
// speculative decoding) configured in num_nextn_predict_layers or
// mtp_layers are refused by name rather than ignored.
absl::Status RefuseMultiTokenPrediction(const json& j);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_TYPES_TRANSFORMERS_FIELDS_H_
