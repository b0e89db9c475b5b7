#include "rl/task.hpp"

#include "core/error.hpp"

namespace pulse {

AdditionTask::AdditionTask(int max_digits, std::uint64_t seed, char eos)
    : max_digits_(max_digits), eos_(eos), bound_(1), rng_(seed) {
  PULSE_CHECK(max_digits >= 1 && max_digits <= 18,
              "addition task: max_digits must be in 1..18, got " + std::to_string(max_digits));
  for (int i = 0; i < max_digits; ++i) bound_ *= 10;
}

AdditionProblem AdditionTask::sample() {
  // Rejection sampling instead of std::uniform_int_distribution, whose output differs between
  // standard libraries.
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % static_cast<std::uint64_t>(bound_);
  auto draw = [&] {
    std::uint64_t x;
    do x = rng_();
    while (x >= limit);
    return static_cast<std::int64_t>(x % static_cast<std::uint64_t>(bound_));
  };
  AdditionProblem p;
  p.a = draw();
  p.b = draw();
  p.prompt = std::to_string(p.a) + "+" + std::to_string(p.b) + "=";
  p.answer = std::to_string(p.a + p.b);
  return p;
}

double AdditionTask::reward(const AdditionProblem& problem, const std::string& completion) const {
  const std::size_t end = completion.find(eos_);
  return completion.substr(0, end) == problem.answer ? 1.0 : 0.0;
}

std::string AdditionTask::solution_text(const AdditionProblem& problem) const {
  return problem.prompt + problem.answer + eos_;
}

}  // namespace pulse
