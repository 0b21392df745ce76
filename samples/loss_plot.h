/* loss_plot.h — the training samples' --loss-plot FILE.png: the losses a sample reads as it
 * trains are kept, and at the end written as "step loss" lines to FILE.dat (beside the PNG) and
 * drawn into FILE.png with gnuplot when it is installed (Debian: gnuplot-nox, which
 * scripts/deps.sh installs); without gnuplot the sample says so on stderr and keeps the .dat. */
#ifndef CLPAR_SAMPLE_LOSS_PLOT_H
#define CLPAR_SAMPLE_LOSS_PLOT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *png; /* NULL: no plot wanted */
  double *x, *loss;
  int n, cap;
} loss_plot;

/* Keeps one point (x: the step or epoch); says so on stderr and drops it when out of memory. */
static void loss_plot_add(loss_plot *p, double x, double loss) {
  if (!p->png) return;
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 256;
    double *nx = realloc(p->x, (size_t)cap * sizeof *nx);
    if (nx) p->x = nx;
    double *nl = nx ? realloc(p->loss, (size_t)cap * sizeof *nl) : NULL;
    if (!nl) {
      fprintf(stderr, "--loss-plot: out of memory; point %d dropped\n", p->n);
      return;
    }
    p->loss = nl;
    p->cap = cap;
  }
  p->x[p->n] = x;
  p->loss[p->n++] = loss;
}

/* Writes <png without .png>.dat and, with gnuplot, the PNG; what happened goes to stderr.
 * Returns 0 when a file could not be written. */
static int loss_plot_write(loss_plot *p, const char *x_label, const char *title) {
  if (!p->png) return 1;
  size_t len = strlen(p->png);
  if (len < 5 || strcmp(p->png + len - 4, ".png") || strpbrk(p->png, "'\"\n")) {
    fprintf(stderr, "--loss-plot %s: give a FILE.png path without quotes\n", p->png);
    return 0;
  }
  char *dat = malloc(len + 1);
  if (!dat) return 0;
  memcpy(dat, p->png, len - 4);
  strcpy(dat + len - 4, ".dat");
  FILE *f = fopen(dat, "w");
  int ok = f != NULL;
  for (int i = 0; ok && i < p->n; i++) ok = fprintf(f, "%g %.6g\n", p->x[i], p->loss[i]) > 0;
  if (f && fclose(f) != 0) ok = 0;
  if (!ok) fprintf(stderr, "--loss-plot: could not write %s\n", dat);
  if (ok && system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fprintf(stderr,
            "loss curve data in %s; gnuplot is not installed, so no %s (Debian: "
            "apt-get install gnuplot-nox)\n",
            dat, p->png);
  } else if (ok) {
    FILE *g = popen("gnuplot", "w");
    if (g) {
      fprintf(g,
              "set terminal pngcairo size 800,500 noenhanced\nset output '%s'\n"
              "set title '%s'\nset xlabel '%s'\nset ylabel 'loss'\nset grid\nset key off\n"
              "plot '%s' using 1:2 with linespoints pt 7 ps 0.5\n",
              p->png, title, x_label, dat);
    }
    ok = g && pclose(g) == 0;
    fprintf(stderr, ok ? "loss curve: %s (data: %s)\n" : "gnuplot failed to draw %s (data: %s)\n",
            p->png, dat);
  }
  free(dat);
  return ok;
}

static void loss_plot_free(loss_plot *p) {
  free(p->x);
  free(p->loss);
  p->x = p->loss = NULL;
  p->n = p->cap = 0;
}

#endif
