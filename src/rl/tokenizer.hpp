#pragma once
// Character-level tokenizer: token id = position of the character in a fixed alphabet. The
// end-of-sequence character ends completions and pads sequences to a fixed length.
#include <string>
#include <vector>

namespace pulse {

class CharTokenizer {
 public:
  // alphabet: distinct characters; eos must be one of them.
  CharTokenizer(std::string alphabet, char eos);

  int vocab_size() const { return static_cast<int>(alphabet_.size()); }
  int eos() const { return eos_; }
  // Throws pulse::Error naming the first character outside the alphabet.
  std::vector<int> encode(const std::string& text) const;
  // Throws pulse::Error on an id outside the vocabulary.
  std::string decode(const std::vector<int>& ids) const;

 private:
  std::string alphabet_;
  int eos_;
  int id_of_[256];  // -1 for characters outside the alphabet
};

// Digits, '+', '=' and '$' (end of sequence): the alphabet of the addition task.
CharTokenizer arithmetic_tokenizer();

}  // namespace pulse
