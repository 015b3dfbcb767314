#include "oscarkv/pd/engine_codec.h"

#include "absl/strings/str_cat.h"
#include "oscarkv/engine/decode.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::pd {

absl::Status CheckContext(const engine::Model& model, size_t tokens, const char* what) {
  const uint32_t max = model.config().max_positions;
  if (max != 0 && tokens > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " needs ", tokens, " positions; the model's context is ", max, " positions"));
  }
  return absl::OkStatus();
}

absl::StatusOr<EngineCodec> MakeEngineCodec(const engine::ModelConfig& c, const CodecOptions& o) {
  EngineCodec out;
  std::shared_ptr<RotationSet> rot;
  if (o.rotation == "hadamard") {
    rot = std::make_shared<RotationSet>(
        RotationSet::Hadamard(c.num_layers, c.num_kv_heads, c.head_dim));
  } else if (o.rotation == "identity") {
    rot = std::make_shared<RotationSet>(
        RotationSet::Identity(c.num_layers, c.num_kv_heads, c.head_dim));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown rotation '", o.rotation, "' (hadamard or identity)"));
  }
  CodecProfile& p = out.profile;
  p.model_id = c.model_id;
  p.model_revision = "local";
  p.num_layers = c.num_layers;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.page_tokens = o.page_tokens;
  p.group_size = o.group_size;
  p.sink_tokens = o.sink_tokens;
  p.recent_tokens = o.recent_tokens;
  p.rotation_digest = rot->Digest();
  OSCARKV_RETURN_IF_ERROR(p.Validate());
  out.rotations = std::move(rot);
  return out;
}

std::vector<int32_t> BytesToTokens(const std::string& text) {
  std::vector<int32_t> t;
  t.reserve(text.size());
  for (char ch : text) t.push_back(static_cast<uint8_t>(ch));
  return t;
}

std::string TokensToText(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) {
    const char ch = static_cast<char>(t);
    s.push_back((t >= 32 && t < 127) || ch == '\n' || ch == '\t' || t >= 128 ? ch : '.');
  }
  return s;
}

absl::StatusOr<std::vector<int32_t>> ReferenceGenerate(const engine::Model& model,
                                                       const EngineCodec& codec,
                                                       const std::vector<int32_t>& prompt,
                                                       uint32_t tokens) {
  OSCARKV_RETURN_IF_ERROR(
      CheckContext(model, prompt.size() + tokens + 2, "the prompt plus the generated tokens"));
  OSCARKV_ASSIGN_OR_RETURN(
      auto dec, engine::Decoder::Create(model, codec.profile, codec.rotations,
                                        static_cast<uint32_t>(prompt.size() + tokens + 2)));
  OSCARKV_RETURN_IF_ERROR(dec->Prefill(prompt));
  return dec->Generate(tokens + 1);
}

}  // namespace oscarkv::pd
