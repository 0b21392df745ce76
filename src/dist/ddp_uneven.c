/* ddp_uneven.c — DistributedDataParallel's uneven inputs: a flag per rank all-reduced before
 * every forward (uneven_inputs) and by clpar_ddp_join, so that every rank learns at the same
 * step that one has run out of inputs. */
#include <stdio.h>
#include <stdlib.h>

#include "dist/ddp_internal.h"

/* ---- uneven inputs ---- */

/* "1, 3 and 4" for the ranks whose flag is (has != 0) equal to has; at most 16 named. */
static void list_ranks(const int *flags, int world, int has, char *out, size_t size) {
  size_t len = 0;
  int total = 0;
  for (int r = 0; r < world; r++) total += (flags[r] != 0) == has;
  out[0] = '\0';
  for (int r = 0, k = 0; r < world && len < size; r++) {
    if ((flags[r] != 0) != has) continue;
    k++;
    if (k > 16) {
      snprintf(out + len, size - len, " ... (%d ranks in all)", total);
      break;
    }
    const char *sep = k == 1 ? "" : k == total ? " and " : ", ";
    len += (size_t)snprintf(out + len, size - len, "%s%d", sep, r);
  }
}

/* With uneven_inputs, the first collective of every forward (has = 1) and of clpar_ddp_join
 * (has = 0): every rank learns which ranks still have inputs. When one has not, every rank
 * fails alike naming them (a join on every rank at once is the even end: CLPAR_OK), and every
 * later forward fails at once, without a collective. */
clpar_status clpar_ddp_inputs_check(ddp_state *st, int has) {
  if (st->ended) return clpar_set_error(st->ended_status, "%s", st->ended_msg);
  uint64_t step = ++st->forwards;
  int rank = clpar_dist_rank();
  int *flags = calloc((size_t)st->world, sizeof *flags);
  if (!flags)
    return clpar_ddp_oom(); /* the others then time out naming this rank: nothing better */
  flags[rank] = has;
  clpar_status s = clpar_dist_allreduce(
      flags, st->world, MPI_INT, MPI_SUM, st->comm,
      "DistributedDataParallel: the uneven-inputs check (does every rank still have inputs?)",
      ++st->seq);
  int out = 0;
  for (int r = 0; s == CLPAR_OK && r < st->world; r++) out += flags[r] == 0;
  if (s != CLPAR_OK || out == 0) {
    free(flags);
    return s;
  }
  char done[160], going[160];
  list_ranks(flags, st->world, 0, done, sizeof done);
  list_ranks(flags, st->world, 1, going, sizeof going);
  free(flags);
  st->ended = 1;
  if (out == st->world) {
    st->ended_status = CLPAR_ERROR_INVALID_ARGUMENT;
    snprintf(st->ended_msg, sizeof st->ended_msg,
             "DistributedDataParallel: every rank has joined (clpar_ddp_join, step %llu); the "
             "module takes no more forwards",
             (unsigned long long)step);
    return CLPAR_OK;
  }
  st->ended_status = CLPAR_ERROR_UNEVEN_INPUTS;
  snprintf(st->ended_msg, sizeof st->ended_msg,
           "DistributedDataParallel: uneven inputs: rank%s %s ran out of inputs (clpar_ddp_join) "
           "at step %llu while rank%s %s still had some; every rank stops here",
           out > 1 ? "s" : "", done, (unsigned long long)step, st->world - out > 1 ? "s" : "",
           going);
  return clpar_set_error(st->ended_status, "%s", st->ended_msg);
}
