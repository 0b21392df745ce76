/* clpar_checkpoint.c — the clpar-checkpoint program: works on clpar's checkpoint files.
 *
 *   clpar-checkpoint consolidate DIR OUT.safetensors
 *
 * consolidate: the sharded training checkpoint in DIR (clpar_checkpoint_save_sharded: the
 * shards and model.safetensors.index.json) as one training checkpoint, the file
 * clpar_checkpoint_save writes, loadable with clpar_checkpoint_load or PyTorch's safetensors.
 * Exit status 0 on success, 1 on a failed command (the error on stderr), 2 on bad usage. */
#include <clpar/clpar.h>
#include <stdio.h>
#include <string.h>

static const char usage_text[] = "usage: clpar-checkpoint consolidate DIR OUT.safetensors\n";

int main(int argc, char **argv) {
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(usage_text, stdout);
    fputs(
        "\nconsolidate: writes the sharded training checkpoint in DIR (its\n"
        "model.safetensors.index.json and shards) as one checkpoint file, checked whole\n"
        "(checksums included) and written crash-safe.\n",
        stdout);
    return 0;
  }
  if (argc != 4 || strcmp(argv[1], "consolidate") != 0) {
    fputs(usage_text, stderr);
    return 2;
  }
  clpar_status s = clpar_checkpoint_consolidate(argv[2], argv[3]);
  if (s != CLPAR_OK) {
    fprintf(stderr, "clpar-checkpoint: %s: %s\n", clpar_status_name(s), clpar_last_error());
    return 1;
  }
  return 0;
}
