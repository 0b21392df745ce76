/* test_checkpoint_crash.c — a process killed (SIGKILL) in the middle of a save leaves the
 * previous checkpoint intact and loadable. For each point of the crash-safe write (the
 * temporary file made, half written, written, synced, renamed) a child process saves a
 * checkpoint, starts saving another one, stops at that point (the test-only hook
 * clpar_atomic_write_hook), and the parent kills it there; a second child then loads the file
 * and checks that it is the first checkpoint, or the second one once the rename was done.
 * The parent never initializes clpar, so that every child starts from a clean fork. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

static char dir[64], path[128];
static int hook_fd = -1;
static clpar_write_stage hook_at;

static void stop_here(clpar_write_stage stage) {
  if (stage != hook_at) return;
  char c = (char)stage;
  if (write(hook_fd, &c, 1) != 1) _exit(3);
  for (;;) pause(); /* until the parent's SIGKILL */
}

/* A model of 256 x 1024 + 256 + 1024 x 256 + 1024 weights (about 2 MB) from seed. */
static clpar_module *make_model(uint64_t seed) {
  clpar_module *l1, *l2, *seq;
  clpar_manual_seed(seed);
  if (clpar_linear_create(1024, 256, 1, clpar_device_get(0), &l1) != CLPAR_OK ||
      clpar_linear_create(256, 1024, 1, clpar_device_get(0), &l2) != CLPAR_OK ||
      clpar_sequential_create((clpar_module *[]){l1, l2}, 2, &seq) != CLPAR_OK)
    _exit(4);
  return seq;
}

/* The child that saves (exit codes: the stage was never reached, or an error). */
static void saver(clpar_write_stage stage, int fd) {
  if (clpar_init() != CLPAR_OK) _exit(5);
  clpar_module *a = make_model(1), *b = make_model(2);
  if (clpar_checkpoint_save(path, a, NULL, 1, 1) != CLPAR_OK) _exit(6);
  hook_fd = fd;
  hook_at = stage;
  clpar_atomic_write_hook = stop_here;
  clpar_checkpoint_save(path, b, NULL, 2, 2);
  _exit(7); /* the hook never returned: not reached */
}

/* The child that checks: exit 0 when the file loads and holds the model of want_seed. */
static void checker(uint64_t want_seed, int64_t want_step) {
  if (clpar_init() != CLPAR_OK) _exit(10);
  clpar_module *want = make_model(want_seed), *got = make_model(99);
  int64_t step = 0;
  if (clpar_checkpoint_load(path, got, NULL, &step, NULL) != CLPAR_OK) {
    fprintf(stderr, "load after the kill: %s\n", clpar_last_error());
    _exit(11);
  }
  if (step != want_step) _exit(12);
  for (int j = 0; j < clpar_module_parameter_count(want); j++) {
    clpar_tensor *pw, *pg;
    clpar_module_parameter_at(want, j, NULL, &pw);
    clpar_module_parameter_at(got, j, NULL, &pg);
    size_t n = (size_t)clpar_tensor_numel(pw);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    if (clpar_tensor_read(pw, a, n) != CLPAR_OK || clpar_tensor_read(pg, b, n) != CLPAR_OK ||
        memcmp(a, b, n * sizeof *a) != 0)
      _exit(13);
    free(a);
    free(b);
  }
  clpar_module_free(want);
  clpar_module_free(got);
  clpar_shutdown();
  _exit(0);
}

static int wait_for(pid_t pid) {
  int st;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_kill_during_save(void **state) {
  (void)state;
  for (int stage = 0; stage < CLPAR_WRITE_STAGE_COUNT; stage++) {
    unlink(path);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      saver((clpar_write_stage)stage, fds[1]);
    }
    close(fds[1]);
    char c;
    ssize_t got = read(fds[0], &c, 1);
    close(fds[0]);
    if (got != 1)
      fail_msg("stage %d: the saver exited (%d) before the stage", stage, wait_for(pid));
    assert_int_equal(c, stage);
    kill(pid, SIGKILL);
    assert_int_equal(wait_for(pid), 128 + SIGKILL);

    int renamed = stage >= CLPAR_WRITE_RENAMED;
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) checker(renamed ? 2 : 1, renamed ? 2 : 1);
    int rc = wait_for(pid);
    if (rc != 0)
      fail_msg("stage %d: the file after the kill is not the %s checkpoint (checker exit %d)",
               stage, renamed ? "new" : "previous", rc);
  }
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/clpar-crash-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill_during_save)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return rc;
}
