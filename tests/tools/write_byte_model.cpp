// write_byte_model OUT_DIR: writes a random tiny DeepSeek-V4 checkpoint with the byte vocabulary
// (260 ids, <bos> = 256; SWA, CSA and HCA layers; max_position_embeddings 4096) for the CLI tests
// of `sparrow needle` (tests/cli/needle_cli_test.sh).
#include <cstdio>
#include <filesystem>

#include "model/test_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  using sparrow::AttentionKind;
  sparrow::ModelConfig c =
      sparrow::testing::tiny_config({AttentionKind::kSliding, AttentionKind::kCsa, AttentionKind::kHca}, 1);
  c.vocab_size = 260;
  std::filesystem::create_directories(argv[1]);
  sparrow::testing::write_test_model(argv[1], c, 11);
  return 0;
}
