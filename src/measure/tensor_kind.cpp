#include "measure/tensor_kind.hpp"

#include <cctype>

namespace pulse::measure {
namespace {

bool contains_any(const std::string& s, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (s.find(p) != std::string::npos) return true;
  return false;
}

}  // namespace

const std::vector<TensorKind>& all_tensor_kinds() {
  static const std::vector<TensorKind> kinds = {TensorKind::attention, TensorKind::mlp, TensorKind::embeddings,
                                                TensorKind::norms, TensorKind::other};
  return kinds;
}

const char* tensor_kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::attention: return "attention";
    case TensorKind::mlp: return "mlp";
    case TensorKind::embeddings: return "embeddings";
    case TensorKind::norms: return "norms";
    case TensorKind::other: return "other";
  }
  return "other";
}

TensorKind classify_tensor(const std::string& name) {
  std::string s;
  for (const char c : name) s += char(std::tolower(static_cast<unsigned char>(c)));
  if (contains_any(s, {"norm", "ln_", ".ln", "ln.", "ln1", "ln2", "ln_f"})) return TensorKind::norms;
  if (contains_any(s, {"embed", "wte", "wpe", "lm_head", "tok_emb", "pos_emb"})) return TensorKind::embeddings;
  if (contains_any(s, {"attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "qkv"}))
    return TensorKind::attention;
  if (contains_any(s, {"mlp", "ffn", "feed_forward", "gate_proj", "up_proj", "down_proj", "fc1", "fc2", "experts",
                       "c_fc"}))
    return TensorKind::mlp;
  return TensorKind::other;
}

}  // namespace pulse::measure
