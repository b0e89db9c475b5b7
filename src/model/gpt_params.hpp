#pragma once
// Named views into a flat parameter buffer laid out by gpt_tensor_table (llm.c's
// ParameterTensors): shared by the training model (GPT) and the inference decoder (GPTDecoder),
// which point the same names into their weight and gradient buffers.
#include <vector>

#include "core/tensor_table.hpp"
#include "kernels/types.hpp"

namespace pulse {

struct GPTConfig;

struct GPTBlockParams {
  using Span = FloatSpan<DefaultExec>;
  Span ln1_w, ln1_b, qkv_w, qkv_b, attn_proj_w, attn_proj_b;  // [C], [C], [3C,C], [3C], [C,C], [C]
  Span ln2_w, ln2_b, fc_w, fc_b, mlp_proj_w, mlp_proj_b;      // [C], [C], [4C,C], [4C], [C,4C], [C]
};

struct GPTParams {
  using Span = FloatSpan<DefaultExec>;
  Span wte, wpe;  // [V,C], [max_seq_len,C]
  std::vector<GPTBlockParams> blocks;
  Span lnf_w, lnf_b, lm_head;  // [C], [C], [V,C]; lm_head aliases wte when tied
};

// flat holds table.num_elements() values in the order of table = gpt_tensor_table(config).
GPTParams point_gpt_params(const GPTConfig& config, const TensorTable& table, const Kokkos::View<float*>& flat);

}  // namespace pulse
