// The checkpoint-folder filter against hand-derived cases: the Hugging Face Trainer's files left
// out by default (at the top and in subfolders), an --include naming one keeps it, --include
// keeps only its matches, --exclude wins over both, '*' does not cross '/', and the one line that
// names what was left out.
#include <gtest/gtest.h>

#include "cli/folder_filter.hpp"

using pulse::cli::FolderFilter;

TEST(FolderFilter, LeavesOutTrainerFilesByDefault) {
  const FolderFilter f;
  for (const char* name : {"optimizer.pt", "scheduler.pt", "rng_state.pth", "rng_state_3.pth", "trainer_state.json",
                           "training_args.bin", "scaler.pt", "sub/optimizer.pt"})
    EXPECT_FALSE(f.keeps(name)) << name;
  for (const char* name : {"config.json", "model-00001-of-00002.safetensors", "tokenizer.json", "generation_config.json",
                           "my_optimizer.pt", "rng_state.pth.txt"})
    EXPECT_TRUE(f.keeps(name)) << name;
}

TEST(FolderFilter, IncludeAndExclude) {
  const FolderFilter keep_optimizer({"optimizer.pt", "*.safetensors", "*.json"}, {});
  EXPECT_TRUE(keep_optimizer.keeps("optimizer.pt"));
  EXPECT_TRUE(keep_optimizer.keeps("model.safetensors"));
  EXPECT_FALSE(keep_optimizer.keeps("rng_state.pth"));  // not included
  EXPECT_FALSE(keep_optimizer.keeps("merges.txt"));
  EXPECT_TRUE(keep_optimizer.keeps("trainer_state.json"));  // "*.json" includes it: any include match keeps
  const FolderFilter exclude({}, {"*.json", "sub/*"});
  EXPECT_FALSE(exclude.keeps("config.json"));
  EXPECT_FALSE(exclude.keeps("sub/x.bin"));
  EXPECT_TRUE(exclude.keeps("sub/deeper/x.bin"));  // '*' does not cross '/'
  EXPECT_FALSE(exclude.keeps("sub/deeper/config.json"));  // a glob without '/' matches file names anywhere
  EXPECT_TRUE(exclude.keeps("model.safetensors"));
  const FolderFilter both({"*.safetensors"}, {"model-00002*"});
  EXPECT_TRUE(both.keeps("model-00001-of-00002.safetensors"));
  EXPECT_FALSE(both.keeps("model-00002-of-00002.safetensors"));
}

TEST(FolderFilter, NamesWhatItLeftOut) {
  const FolderFilter f({}, {"tokenizer.json"});
  EXPECT_EQ(f.left_out_line({"config.json", "optimizer.pt", "rng_state.pth", "tokenizer.json"}),
            "left out optimizer.pt, rng_state.pth (Hugging Face Trainer files; --include NAME keeps one); "
            "tokenizer.json (by --include/--exclude)");
  EXPECT_EQ(FolderFilter().left_out_line({"config.json", "model.safetensors"}), "");
}
