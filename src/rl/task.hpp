#pragma once
// Multi-digit addition, the RL task: the prompt is "a+b=", the policy completes it, and the
// reward is 1 when the completion up to the end-of-sequence character is exactly a+b in
// decimal without leading zeros, else 0. Problems come from a seeded generator, so a run with
// a fixed seed sees the same problems on every machine.
#include <cstdint>
#include <random>
#include <string>

namespace pulse {

struct AdditionProblem {
  std::int64_t a = 0, b = 0;
  std::string prompt;  // "a+b="
  std::string answer;  // decimal a+b, no end-of-sequence character
};

class AdditionTask {
 public:
  // Operands are uniform in [0, 10^max_digits); max_digits in 1..18. eos ends an answer.
  AdditionTask(int max_digits, std::uint64_t seed, char eos = '$');

  AdditionProblem sample();
  // 1 for an exact answer followed by eos (or ending the completion), else 0.
  double reward(const AdditionProblem& problem, const std::string& completion) const;
  // prompt + answer + eos: a supervised example.
  std::string solution_text(const AdditionProblem& problem) const;
  // The longest prompt + answer + eos this task produces, in characters.
  int max_text_length() const { return 2 * max_digits_ + 2 + (max_digits_ + 1) + 1; }

 private:
  int max_digits_;
  char eos_;
  std::int64_t bound_;  // 10^max_digits
  std::mt19937_64 rng_;
};

}  // namespace pulse
