// The RL tasks: deterministic problems, a content-based split, and exact checkers.
#include <gtest/gtest.h>

#include <set>

#include "agora/core/error.h"
#include "agora/rl/arithmetic.h"
#include "agora/rl/task.h"

namespace agora {
namespace {

std::unique_ptr<Task> task(const std::string& name, uint64_t seed = 1) {
  TaskOptions options;
  options.seed = seed;
  return make_task(name, options);
}

TEST(RlTasks, TheSameSeedAndIdGiveTheSameProblem) {
  for (const std::string& name : task_names()) {
    const auto a = task(name, 5), b = task(name, 5), other = task(name, 6);
    int differ = 0;
    for (uint64_t id = 0; id < 50; ++id) {
      EXPECT_EQ(a->make(id).prompt, b->make(id).prompt) << name;
      EXPECT_EQ(a->make(id).solution, b->make(id).solution) << name;
      differ += a->make(id).prompt != other->make(id).prompt;
    }
    EXPECT_GT(differ, 40) << name << ": another seed should give other problems";
  }
}

TEST(RlTasks, PinnedProblemsDoNotChangeUnnoticed) {
  // Changing generation changes every corpus and held-out set: this pins it.
  const Problem a = task("arithmetic")->make(3);
  const Problem c = task("countdown")->make(3);
  EXPECT_EQ(a.prompt + a.solution, "944-913=31");
  EXPECT_EQ(c.prompt + c.solution, "21 23 24 24 -> 92:21+24=45,45+23=68,68+24=92");
}

TEST(RlTasks, EverySolutionIsRightAndTheSplitFollowsTheFraction) {
  for (const std::string& name : task_names()) {
    const auto t = task(name);
    int held = 0;
    for (uint64_t id = 0; id < 4000; ++id) {
      const Problem p = t->make(id);
      ASSERT_EQ(t->reward(p, p.solution), 1.0) << name << " " << p.prompt << p.solution;
      held += t->held_out(p);
    }
    EXPECT_NEAR(held / 4000.0, 0.1, 0.02) << name;
  }
}

TEST(RlTasks, TheSplitsNeverShareAPrompt) {
  const auto t = task("arithmetic");
  std::set<std::string> train, held;
  uint64_t a = 0, b = 0;
  for (int i = 0; i < 3000; ++i) train.insert(t->next(a, false).prompt);
  for (int i = 0; i < 300; ++i) held.insert(t->next(b, true).prompt);
  for (const auto& p : held) EXPECT_FALSE(train.count(p)) << p;
}

TEST(RlTasks, ArithmeticAcceptsOnlyTheCanonicalAnswer) {
  const auto t = task("arithmetic");
  Problem p;
  p.prompt = "372+49=";
  p.numbers = {372, 49};
  p.target = 421;
  EXPECT_EQ(t->reward(p, "421"), 1.0);
  EXPECT_EQ(t->reward(p, "421 \n"), 1.0);  // a trailing space or newline is no answer
  for (const char* wrong :
       {"420", "0421", "+421", "421x", " 421", "42 1", "", "421,421", "99999999999999999999999"}) {
    EXPECT_EQ(t->reward(p, wrong), 0.0) << wrong;
  }
}

TEST(RlTasks, WorkedArithmeticWritesEveryColumnLeastSignificantFirst) {
  EXPECT_EQ(ArithmeticTask::worked_answer(372, 49, false), "2+9+0=11,7+4+1=12,3+0+1=4;421");
  EXPECT_EQ(ArithmeticTask::worked_answer(999, 1, false), "9+1+0=10,9+0+1=10,9+0+1=10;1000");
  EXPECT_EQ(ArithmeticTask::worked_answer(512, 87, true), "12-7-0=5,11-8-1=2,5-0-1=4;425");
  EXPECT_EQ(ArithmeticTask::worked_answer(512, 507, true), "12-7-0=5,1-0-1=0,5-5-0=0;5");
  EXPECT_EQ(ArithmeticTask::worked_answer(0, 0, false), "0+0+0=0;0");
  EXPECT_EQ(ArithmeticTask::worked_answer(7, 7, true), "7-7-0=0;0");
  // The same problems as the plain task, so the same held-out split.
  const auto plain = task("arithmetic"), worked = task("arithmetic-worked");
  for (uint64_t id = 0; id < 200; ++id) {
    const Problem a = plain->make(id), b = worked->make(id);
    EXPECT_EQ(a.prompt, b.prompt);
    EXPECT_EQ(b.solution.substr(b.solution.rfind(';') + 1), a.solution);
    EXPECT_EQ(plain->held_out(a), worked->held_out(b));
  }
}

TEST(RlTasks, CarelessWorkingForgetsEveryCarryAndBorrow) {
  EXPECT_EQ(ArithmeticTask::worked_answer(372, 49, false, true), "2+9+0=11,7+4+0=11,3+0+0=3;311");
  EXPECT_EQ(ArithmeticTask::worked_answer(512, 87, true, true), "12-7-0=5,11-8-0=3,5-0-0=5;535");
  EXPECT_EQ(ArithmeticTask::worked_answer(999, 1, false, true), "9+1+0=10,9+0+0=9,9+0+0=9;990");
  EXPECT_EQ(ArithmeticTask::worked_answer(10, 1, true, true), "10-1-0=9,1-0-0=1;19");
  // Without a carry or a borrow the careless student is right.
  EXPECT_EQ(ArithmeticTask::worked_answer(123, 456, false, true),
            ArithmeticTask::worked_answer(123, 456, false, false));
  EXPECT_EQ(ArithmeticTask::worked_answer(987, 654, true, true),
            ArithmeticTask::worked_answer(987, 654, true, false));
}

TEST(RlTasks, TheCorpusMixesInTheAskedShareOfCarelessWorking) {
  TaskOptions options;
  const ArithmeticTask worked(options, /*worked=*/true);
  int differ = 0, careless = 0;
  for (uint64_t id = 0; id < 4000; ++id) {
    const Problem p = worked.make(id);
    EXPECT_EQ(worked.corpus_solution(p, 0.0), p.solution);
    const std::string wrong = ArithmeticTask::worked_answer(
        p.numbers[0], p.numbers[1], p.prompt.find('-') != std::string::npos, true);
    EXPECT_EQ(worked.corpus_solution(p, 1.0), wrong);
    if (wrong == p.solution) continue;
    ++differ;
    const std::string line = worked.corpus_solution(p, 0.6);
    EXPECT_EQ(line, worked.corpus_solution(p, 0.6)) << "the draw is deterministic";
    careless += line == wrong;
  }
  ASSERT_GT(differ, 1000);
  EXPECT_NEAR(static_cast<double>(careless) / differ, 0.6, 0.05);
  EXPECT_THROW(worked.corpus_solution(worked.make(0), 1.5), Error);
  EXPECT_THROW(worked.corpus_solution(worked.make(0), -0.1), Error);
  const ArithmeticTask plain(options, /*worked=*/false);
  EXPECT_THROW(plain.corpus_solution(plain.make(0), 0.5), Error);
}

TEST(RlTasks, WorkedArithmeticScoresOnlyTheAnswerAfterItsSemicolon) {
  const auto t = task("arithmetic-worked");
  Problem p;
  p.prompt = "372+49=";
  p.numbers = {372, 49};
  p.target = 421;
  EXPECT_EQ(t->reward(p, "2+9+0=11,7+4+1=12,3+0+1=4;421"), 1.0);
  EXPECT_EQ(t->reward(p, "2+9+0=11,7+4+1=12,3+0+1=4;421\n"), 1.0);
  EXPECT_EQ(t->reward(p, "anything;421"), 1.0);  // the working is not graded
  EXPECT_EQ(t->reward(p, ";421"), 1.0);
  for (const char* wrong :
       {"421", "2+9+0=11;420", "x;421;", "x;0421", "x;421x", "x;421;421", "x; 421", ""}) {
    EXPECT_EQ(t->reward(p, wrong), 0.0) << wrong;
  }
}

TEST(RlTasks, SubtractionNeverGoesNegative) {
  const auto t = task("arithmetic");
  for (uint64_t id = 0; id < 2000; ++id) EXPECT_GE(t->make(id).target, 0);
}

TEST(RlTasks, CountdownChecksEveryStepAgainstThePool) {
  const auto t = task("countdown");
  Problem p;
  p.numbers = {3, 7, 12, 5};
  p.target = 21;
  EXPECT_EQ(t->reward(p, "12-5=7,7*3=21"), 1.0);
  EXPECT_EQ(t->reward(p, "7*3=21"), 1.0);  // not every number must be used
  EXPECT_EQ(t->reward(p, "12-5=7,7*3=21\n"), 1.0);
  const char* wrong[] = {
      "7*3=22",                           // wrong arithmetic
      "7*7=49,49-28=21",                  // 7 used twice (the pool has one 7)
      "12-5=7,7*3=21,",                   // a dangling comma
      "21",                               // no step
      "",                                 // nothing
      "3-7=-4",                           // negative intermediate
      "7/3=2",                            // inexact division
      "12/0=0",                           // division by zero
      "12+5=17",                          // valid but misses the target
      "12-5=7,7*3=21,21+0=21",            // 0 is not in the pool
      "12 - 5 = 7",                       // spaces are not the format
      "12-5=7;7*3=21",                    // wrong separator
      "99999999999999*99999999999999=1",  // past the digits a number may have
      "9999999999*9999999999=1",          // a product past int64 (found by the fuzzer)
  };
  for (const char* w : wrong) EXPECT_EQ(t->reward(p, w), 0.0) << w;
  // The intermediate 7 joins the pool: 12-5=7 then 7+7=14 uses both sevens legitimately.
  p.target = 14;
  EXPECT_EQ(t->reward(p, "12-5=7,7+7=14"), 1.0);
  EXPECT_EQ(t->reward(p, "12-5=7,7+7=14,14-7=7"), 0.0);  // only one 7 was left
}

TEST(RlTasks, CountdownTargetsAreNotAmongTheNumbersUsually) {
  const auto t = task("countdown");
  int trivial = 0;
  for (uint64_t id = 0; id < 2000; ++id) {
    const Problem p = t->make(id);
    EXPECT_EQ(p.numbers.size(), 4u);
    for (auto n : p.numbers) EXPECT_TRUE(n >= 1 && n <= 25);
    trivial += std::find(p.numbers.begin(), p.numbers.end(), p.target) != p.numbers.end();
  }
  EXPECT_LT(trivial, 5);
}

TEST(RlTasks, BadOptionsAreErrors) {
  EXPECT_THROW(make_task("chess", TaskOptions{}), Error);
  TaskOptions o;
  o.max_digits = 0;
  EXPECT_THROW(make_task("arithmetic", o), Error);
  o = TaskOptions{};
  o.numbers = 7;
  EXPECT_THROW(make_task("countdown", o), Error);
  o = TaskOptions{};
  o.held_out_fraction = 1.0;
  EXPECT_THROW(make_task("arithmetic", o), Error);
}

}  // namespace
}  // namespace agora
