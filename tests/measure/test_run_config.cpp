// pulse-measure's --set/--label: values typed as a reader of the TOML expects (hand-derived),
// strings escaped, and each bad setting refused with the setting named. test_pulse_measure
// reads the attribute back with Python's tomllib.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "measure/run_config.hpp"

using namespace pulse::measure;

TEST(RunConfig, TypesValuesAsWritten) {
  const RunConfig c = parse_run_config(
      {"lr=3e-6", "seed=2", "beta=0.9", "big=1.5E+3", "neg=-4", "on=true", "precision=bf16", "odd=1.", "zeros=007",
       "inf=inf", "hex=0x10", "empty=", "eq=a=b"},
      "lr 3e-6, \"bf16\"");
  EXPECT_EQ(c.values.at("lr"), "3e-6");
  EXPECT_EQ(c.values.at("seed"), "2");
  EXPECT_EQ(c.values.at("beta"), "0.9");
  EXPECT_EQ(c.values.at("big"), "1.5E+3");
  EXPECT_EQ(c.values.at("neg"), "-4");
  EXPECT_EQ(c.values.at("on"), "true");
  EXPECT_EQ(c.values.at("precision"), "\"bf16\"");
  EXPECT_EQ(c.values.at("odd"), "\"1.\"");
  EXPECT_EQ(c.values.at("zeros"), "\"007\"");
  EXPECT_EQ(c.values.at("inf"), "\"inf\"");
  EXPECT_EQ(c.values.at("hex"), "\"0x10\"");
  EXPECT_EQ(c.values.at("empty"), "\"\"");
  EXPECT_EQ(c.values.at("eq"), "\"a=b\"");
  EXPECT_EQ(c.values.at("label"), "\"lr 3e-6, \\\"bf16\\\"\"");
  EXPECT_EQ(c.text("label"), "lr 3e-6, \"bf16\"");
  EXPECT_EQ(c.text("precision"), "bf16");
  EXPECT_EQ(c.text("lr"), "3e-6");
  EXPECT_EQ(c.text("absent"), "");
  EXPECT_EQ(parse_run_config({"b=1", "a=x"}, "").toml(), "a = \"x\"\nb = 1\n");
  EXPECT_EQ(parse_run_config({"tab=a\tb"}, "").values.at("tab"), "\"a\\u0009b\"");
  EXPECT_EQ(parse_run_config({}, "").toml(), "");
}

TEST(RunConfig, RefusesBadSettings) {
  auto message = [](const std::vector<std::string>& settings, const std::string& label) {
    try {
      parse_run_config(settings, label);
    } catch (const pulse::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({"lr"}, "").find("--set lr: not key=value"), std::string::npos);
  EXPECT_NE(message({"=3"}, "").find("no key"), std::string::npos);
  EXPECT_NE(message({"l r=3"}, "").find("letters, digits"), std::string::npos);
  EXPECT_NE(message({"lr=1", "lr=2"}, "").find("lr is set twice"), std::string::npos);
  EXPECT_NE(message({"label=x"}, "").find("--label's"), std::string::npos);
}
