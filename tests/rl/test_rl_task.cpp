// The character tokenizer and the seeded addition task.
#include <gtest/gtest.h>

#include <set>

#include "core/error.hpp"
#include "rl/task.hpp"
#include "rl/tokenizer.hpp"

TEST(Tokenizer, RoundTripAndIds) {
  const pulse::CharTokenizer tok = pulse::arithmetic_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 13);
  EXPECT_EQ(tok.encode("09+="), (std::vector<int>{0, 9, 10, 11}));
  EXPECT_EQ(tok.eos(), 12);
  EXPECT_EQ(tok.decode(tok.encode("123+4567=4690$")), "123+4567=4690$");
}

TEST(Tokenizer, RejectsUnknownInput) {
  const pulse::CharTokenizer tok = pulse::arithmetic_tokenizer();
  EXPECT_THROW(tok.encode("12-3"), pulse::Error);
  EXPECT_THROW(tok.decode({0, 13}), pulse::Error);
  EXPECT_THROW(tok.decode({-1}), pulse::Error);
  EXPECT_THROW(pulse::CharTokenizer("abca", 'a'), pulse::Error);  // duplicate
  EXPECT_THROW(pulse::CharTokenizer("abc", '$'), pulse::Error);   // eos not in the alphabet
}

TEST(AdditionTask, SeededProblemsWithCorrectAnswers) {
  pulse::AdditionTask t1(3, 42), t2(3, 42), t3(3, 43);
  std::set<std::int64_t> operands;
  bool differs = false;
  for (int i = 0; i < 500; ++i) {
    const auto p = t1.sample(), q = t2.sample(), r = t3.sample();
    EXPECT_EQ(p.prompt, q.prompt);
    differs |= p.prompt != r.prompt;
    ASSERT_TRUE(p.a >= 0 && p.a < 1000 && p.b >= 0 && p.b < 1000) << p.prompt;
    EXPECT_EQ(p.prompt, std::to_string(p.a) + "+" + std::to_string(p.b) + "=");
    EXPECT_EQ(std::stoll(p.answer), p.a + p.b);
    EXPECT_LE(int(t1.solution_text(p).size()), t1.max_text_length());
    operands.insert(p.a);
  }
  EXPECT_TRUE(differs);
  EXPECT_GT(operands.size(), 300u);  // spread over the range, not stuck
  EXPECT_THROW(pulse::AdditionTask(0, 1), pulse::Error);
  EXPECT_THROW(pulse::AdditionTask(19, 1), pulse::Error);
}

TEST(AdditionTask, RewardIsExactMatchUpToEos) {
  pulse::AdditionTask task(2, 1);
  pulse::AdditionProblem p;
  p.a = 47, p.b = 58, p.prompt = "47+58=", p.answer = "105";
  EXPECT_EQ(task.reward(p, "105$"), 1.0);
  EXPECT_EQ(task.reward(p, "105$99"), 1.0);  // what follows the end is ignored
  EXPECT_EQ(task.reward(p, "105"), 1.0);     // ran out of length right after the answer
  EXPECT_EQ(task.reward(p, "1050$"), 0.0);
  EXPECT_EQ(task.reward(p, "0105$"), 0.0);   // leading zero
  EXPECT_EQ(task.reward(p, "10$"), 0.0);
  EXPECT_EQ(task.reward(p, "$"), 0.0);
  EXPECT_EQ(task.solution_text(p), "47+58=105$");
}
