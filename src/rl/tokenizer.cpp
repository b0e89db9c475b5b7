#include "rl/tokenizer.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace pulse {

namespace {
std::string printable(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u >= 32 && u < 127) ? std::string("'") + c + "'" : "byte " + std::to_string(u);
}
}  // namespace

CharTokenizer::CharTokenizer(std::string alphabet, char eos) : alphabet_(std::move(alphabet)) {
  PULSE_CHECK(!alphabet_.empty(), "tokenizer: the alphabet is empty");
  std::fill(std::begin(id_of_), std::end(id_of_), -1);
  for (std::size_t i = 0; i < alphabet_.size(); ++i) {
    int& id = id_of_[static_cast<unsigned char>(alphabet_[i])];
    PULSE_CHECK(id < 0, "tokenizer: " + printable(alphabet_[i]) + " appears twice in the alphabet");
    id = static_cast<int>(i);
  }
  eos_ = id_of_[static_cast<unsigned char>(eos)];
  PULSE_CHECK(eos_ >= 0, "tokenizer: the end-of-sequence " + printable(eos) + " is not in the alphabet");
}

std::vector<int> CharTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  ids.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const int id = id_of_[static_cast<unsigned char>(text[i])];
    PULSE_CHECK(id >= 0, "tokenizer: " + printable(text[i]) + " at position " + std::to_string(i) +
                             " is not in the alphabet \"" + alphabet_ + "\"");
    ids.push_back(id);
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int id : ids) {
    PULSE_CHECK(id >= 0 && id < vocab_size(),
                "tokenizer: id " + std::to_string(id) + " is outside 0.." + std::to_string(vocab_size() - 1));
    text.push_back(alphabet_[id]);
  }
  return text;
}

CharTokenizer arithmetic_tokenizer() { return CharTokenizer("0123456789+=$", '$'); }

}  // namespace pulse
