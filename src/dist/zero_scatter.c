/* zero_scatter.c — the reduce-scatter of ZeRO stages 1 and 2's buckets (zero_comm.c) as
 * point-to-point messages, so that every rank does an equal part of the work.
 *
 * The bucket's host memory holds world blocks back to back, block q of counts[q] floats being
 * the part of the bucket in rank q's shard. Each rank sends block q to rank q (world - 1
 * MPI_Isends, posted at once, reading the bucket's memory in place) and receives its own block
 * from every other rank, two receives in flight, into memory kept from one step to the next;
 * it sums the blocks in rank order (rank 0's + rank 1's + ...), its own taking its place, so
 * the sum is the same bits whatever the MPI library or the timing. Each rank thus copies and
 * adds (world - 1) / world of the bucket. Open MPI's MPI_Ireduce_scatter (libnbc) reduces the
 * whole bucket to rank 0 instead, through temporary buffers it maps anew for each call, and
 * then scatters: rank 0 does twice the bucket's additions and page faults while the other
 * ranks wait. */
#include <string.h>

#include "internal.h"

#ifdef CLPAR_HAVE_MPI

#include "dist/ddp_internal.h"

enum { SCATTER_TAG = 0x5a52 }; /* only the communication thread sends on the module's comm */

typedef struct {
  MPI_Comm comm;
  int world, rank;
  const float *buf;  /* the bucket: world blocks */
  const int *counts; /* world: each block's floats */
  float *sum;        /* counts[rank] floats: the sum so far */
  float *slots[2];   /* two receive buffers of counts[rank] floats */
  MPI_Request *recv; /* 2: the receives in flight, into slots */
  MPI_Request *send; /* world - 1 */
  int next;          /* the next rank whose block joins the sum; world when all have */
} scatter_op;

static int next_peer(const scatter_op *x, int from) { /* the peer after from, or -1 */
  for (int q = from + 1; q < x->world; q++)
    if (q != x->rank) return q;
  return -1;
}

/* The receive of peer q's block into slot (q's place among the peers) % 2. */
static int post_recv(scatter_op *x, int q) {
  int place = q < x->rank ? q : q - 1;
  return MPI_Irecv(x->slots[place % 2], x->counts[x->rank], MPI_FLOAT, q, SCATTER_TAG, x->comm,
                   &x->recv[place % 2]);
}

static void add_block(scatter_op *x, const float *block, int first) {
  int n = x->counts[x->rank];
  if (first)
    memcpy(x->sum, block, (size_t)n * sizeof(float));
  else
    for (int k = 0; k < n; k++) x->sum[k] += block[k];
}

/* Adds the blocks that have arrived, in rank order; 1 when the sum is whole and every send
 * done (or on an error, in *status). */
static int poll_scatter(void *user, clpar_status *status, const char *what) {
  scatter_op *x = user;
  int64_t own = 0;
  for (int q = 0; q < x->rank; q++) own += x->counts[q];
  *status = CLPAR_OK;
  while (x->next < x->world) {
    int q = x->next, done = 1, rc = MPI_SUCCESS;
    const float *block = x->buf + own;
    if (q != x->rank) {
      int place = q < x->rank ? q : q - 1;
      clpar_mpi_lock();
      rc = MPI_Test(&x->recv[place % 2], &done, MPI_STATUS_IGNORE);
      clpar_mpi_unlock();
      block = x->slots[place % 2];
    }
    if (rc != MPI_SUCCESS) *status = clpar_mpi_error(rc, what);
    if (rc != MPI_SUCCESS || !done) return rc != MPI_SUCCESS;
    add_block(x, block, q == 0);
    x->next++;
    /* the slot is free again: the receive two peers on */
    int after = q == x->rank ? -1 : next_peer(x, q);
    int later = after < 0 ? -1 : next_peer(x, after);
    if (later >= 0) {
      clpar_mpi_lock();
      rc = post_recv(x, later);
      clpar_mpi_unlock();
      if (rc != MPI_SUCCESS) {
        *status = clpar_mpi_error(rc, what);
        return 1;
      }
    }
  }
  int all = 0;
  clpar_mpi_lock();
  int rc = MPI_Testall(x->world - 1, x->send, &all, MPI_STATUSES_IGNORE);
  clpar_mpi_unlock();
  if (rc != MPI_SUCCESS) *status = clpar_mpi_error(rc, what);
  return rc != MPI_SUCCESS || all;
}

clpar_status clpar_zero_reduce_scatter(MPI_Comm comm, const float *buf, const int *counts,
                                       float *sum, float *scratch, MPI_Request *reqs,
                                       const char *what, uint64_t seq) {
  scatter_op x = {.comm = comm, .buf = buf, .counts = counts, .sum = sum, .next = 0};
  clpar_mpi_lock();
  int rc = MPI_Comm_size(comm, &x.world), peers = 0;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &x.rank);
  x.slots[0] = scratch;
  x.slots[1] = scratch + (rc == MPI_SUCCESS ? counts[x.rank] : 0);
  x.recv = reqs;
  x.send = reqs + 2;
  x.recv[0] = x.recv[1] = MPI_REQUEST_NULL;
  int64_t at = 0;
  for (int q = 0; rc == MPI_SUCCESS && q < x.world; q++) {
    if (q != x.rank)
      rc = MPI_Isend(buf + at, counts[q], MPI_FLOAT, q, SCATTER_TAG, comm, &x.send[peers++]);
    at += counts[q];
  }
  for (int q = next_peer(&x, -1), k = 0; rc == MPI_SUCCESS && q >= 0 && k < 2; k++) {
    rc = post_recv(&x, q);
    q = next_peer(&x, q);
  }
  clpar_mpi_unlock();
  if (rc != MPI_SUCCESS) return clpar_mpi_error(rc, what);
  return clpar_dist_wait_for(poll_scatter, &x, what, seq);
}

#endif
