#pragma once
// Which part of a transformer a tensor belongs to, from its name (Hugging Face, GPT-2 and pulse
// naming): the rows of pulse-measure's per-kind breakdown.
#include <string>
#include <vector>

namespace pulse::measure {

enum class TensorKind { attention, mlp, embeddings, norms, other };

const std::vector<TensorKind>& all_tensor_kinds();
const char* tensor_kind_name(TensorKind kind);
// Norms first ("post_attention_layernorm" is a norm), then embeddings (input and output: embed,
// wte, wpe, lm_head), attention (attn, attention, q/k/v/o_proj, qkv), MLP (mlp, ffn, feed_forward,
// gate/up/down_proj, fc1/fc2, experts, c_fc); everything else is "other".
TensorKind classify_tensor(const std::string& name);

}  // namespace pulse::measure
