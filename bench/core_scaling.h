/* core_scaling.h — the machine's own two-core scaling, as bench/ddp.sh measures it: the bench
 * runs itself as a child process in "solo" mode (one device, bound to one core, printing its
 * samples/s on stdout), first one child alone (on core 0, then 1, by turns), then two at
 * once on cores 0 and 1.
 * The ratio of the two children's summed samples/s to the lone child's is what two cores give
 * on this machine right now, without any communication: a DataParallel speedup taken while
 * other work runs can then be told from a regression. Linux only (sched_setaffinity,
 * /proc/self/exe); elsewhere the figures are reported as missing. */
#ifndef CLPAR_BENCH_CORE_SCALING_H
#define CLPAR_BENCH_CORE_SCALING_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Binds the calling process to one core; 1 on success. */
static inline int core_bind(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

/* Starts "/proc/self/exe --solo CORE STEPS MODEL" with its stdout into a pipe; the child's
 * pid, or -1. *fd is the pipe's read end. */
static inline pid_t solo_start(int core, int steps, const char *model, int *fd) {
  int p[2];
  if (pipe(p) != 0) return -1;
  char c[16], s[16];
  snprintf(c, sizeof c, "%d", core);
  snprintf(s, sizeof s, "%d", steps);
  char *argv[] = {"bench_data_parallel", "--solo", c, s, (char *)model, NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_addclose(&fa, p[0]);
  pid_t pid;
  int err = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(p[1]);
  if (err != 0) {
    close(p[0]);
    return -1;
  }
  *fd = p[0];
  return pid;
}

/* The samples/s a solo child printed, once it has exited; -1 if it failed. */
static inline double solo_finish(pid_t pid, int fd) {
  char buf[256] = "";
  size_t n = 0;
  ssize_t r;
  while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
  buf[n] = '\0';
  close(fd);
  int st = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
  double sps = -1;
  return sscanf(buf, "%lf", &sps) == 1 ? sps : -1;
}

/* Best of rounds: one solo child alone (*one), and the sum of two at once (*two). 1 if every
 * child ran. Under other load, the best rounds need not be alike: a ratio above 2 says the
 * lone child ran while the machine was busier than during the pair. */
static inline int core_scaling(int steps, const char *model, int rounds, double *one, double *two) {
  *one = *two = -1;
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) return 0;
  for (int r = 0; r < rounds; r++) {
    int fa, fb;
    pid_t a = solo_start(r % 2, steps, model, &fa); /* alone on each core in turn */
    double alone = a > 0 ? solo_finish(a, fa) : -1;
    a = solo_start(0, steps, model, &fa);
    pid_t b = a > 0 ? solo_start(1, steps, model, &fb) : -1;
    double sa = a > 0 ? (b > 0 ? solo_finish(a, fa) : (solo_finish(a, fa), -1)) : -1;
    double sb = b > 0 ? solo_finish(b, fb) : -1;
    if (alone < 0 || sa < 0 || sb < 0) return 0;
    if (alone > *one) *one = alone;
    if (sa + sb > *two) *two = sa + sb;
  }
  return 1;
}
#else
static inline int core_bind(int core) {
  return (void)core, 0;
}
static inline int core_scaling(int steps, const char *model, int rounds, double *one, double *two) {
  (void)steps, (void)model, (void)rounds;
  *one = *two = -1;
  return 0;
}
#endif

#endif
