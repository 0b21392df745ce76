/* ddp_buffers.c — the broadcast of a DistributedDataParallel module's buffers (BatchNorm's
 * running statistics) from rank 0 before a forward, PyTorch's broadcast_buffers=True: the
 * collective itself, which the eager forward (ddp.c) and a captured step share, and the
 * captured step's hand-off of it.
 *
 * All buffers travel in the module's host block (st->block, made at creation): a header with
 * rank 0's status and message, then each buffer's bytes, whatever its dtype (the int64
 * num_batches_tracked as well), 8-aligned. Inside a capture the forward posts, on the device
 * that holds the parameters: on rank 0 the reads of the buffers into the block, then a host
 * call that hands "the buffers" to the communication thread (through ddp_graph.c's queue,
 * ahead of the step's buckets: the same order on every rank), then a gate and, on the other
 * ranks, the writes of the broadcast values into the buffers. The thread broadcasts the block
 * with the deadline and the "where are you?" questions of every collective (clpar_dist_wait)
 * and opens the gate, with the broadcast's error when it failed (a peer that stopped
 * replaying: CLPAR_ERROR_TIMEOUT naming it), which the device's next call returns. A replay
 * allocates nothing: the block is the module's, the host call and the gate are ddp_graph.c's
 * records (under ZeRO stage 3 a job of zero3_graph.c, queued with the gathers). */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "dist/ddp_internal.h"

/* One piece of the block from rank 0, straight into the block (no staging copy): after a
 * timeout MPI may still write it, and the module then leaves it allocated (st->abandoned). */
static clpar_status bcast_piece(ddp_state *st, unsigned char *buf, int bytes, const char *what) {
  uint64_t seq = ++st->seq;
  clpar_status s = clpar_dist_check_broken() ? CLPAR_ERROR_TIMEOUT
                                             : clpar_dist_debug_check(st->comm, what, seq, bytes);
  if (s == CLPAR_OK) {
    MPI_Request req = MPI_REQUEST_NULL;
    clpar_mpi_lock();
    int rc = MPI_Ibcast(buf, bytes, MPI_BYTE, 0, st->comm, &req);
    clpar_mpi_unlock();
    s = rc == MPI_SUCCESS ? clpar_dist_wait(&req, what, seq) : clpar_mpi_error(rc, what);
  }
  if (s == CLPAR_ERROR_TIMEOUT) st->abandoned = 1;
  return s;
}

clpar_status clpar_ddp_bcast_block(ddp_state *st, clpar_status status, const char *what) {
  unsigned char *block = st->block;
  int32_t code = status;
  memset(block, 0, BUFFER_HEADER);
  if (clpar_dist_rank() == 0) {
    if (code != CLPAR_OK) snprintf((char *)block + 8, MESSAGE_SIZE, "%s", clpar_last_error());
    memcpy(block, &code, sizeof code);
  }
  clpar_status s = CLPAR_OK;
  for (size_t at = 0; s == CLPAR_OK && at < st->block_bytes;) {
    size_t piece = st->block_bytes - at < (size_t)INT_MAX ? st->block_bytes - at : INT_MAX;
    s = bcast_piece(st, block + at, (int)piece, what);
    at += piece;
  }
  if (s != CLPAR_OK) return s;
  memcpy(&code, block, sizeof code);
  if (code == CLPAR_OK) return CLPAR_OK;
  block[8 + MESSAGE_SIZE - 1] = '\0';
  return clpar_set_error((clpar_status)code, "%s: rank 0 could not read its buffers: %s", what,
                         (const char *)block + 8);
}

const char *clpar_ddp_buffers_refusal(const ddp_state *st) {
  for (int i = 0; i < st->n_buffers; i++)
    if (st->buffers[i]->storage->dev != st->buckets[0].dev)
      return "a buffer on another device than the parameters (the broadcast's copies are "
             "posted on the parameters' device)";
  return NULL;
}

clpar_status clpar_ddp_buffers_post(ddp_state *st, clpar_host_call *call, clpar_gate *gate) {
  clpar_device *dev = st->buckets[0].dev;
  int root = clpar_dist_rank() == 0;
  clpar_status s = CLPAR_OK;
  clpar_capture_allow(1);
  for (int i = 0; root && s == CLPAR_OK && i < st->n_buffers; i++) {
    clpar_tensor *t = st->buffers[i];
    s = clpar_dev_read(dev, t->storage->buf, t->offset * CLPAR_WORD_BYTES,
                       st->block + st->buffer_at[i], clpar_tensor_bytes(t));
  }
  clpar_capture_allow(0);
  if (s == CLPAR_OK) s = clpar_dev_host_call(dev, call);
  if (s == CLPAR_OK) s = clpar_dev_gate_wait(dev, gate);
  /* The writes move no storage version: BatchNorm2d's counter stays the one it last counted,
   * so its captured count (from the count it keeps) follows the broadcast value, which it
   * equals (every rank counts the same batches, and the eager step before the capture took
   * rank 0's). */
  clpar_capture_allow(1);
  for (int i = 0; !root && s == CLPAR_OK && i < st->n_buffers; i++) {
    clpar_tensor *t = st->buffers[i];
    s = clpar_dev_write(dev, t->storage->buf, t->offset * CLPAR_WORD_BYTES,
                        st->block + st->buffer_at[i], clpar_tensor_bytes(t));
  }
  clpar_capture_allow(0);
  return s;
}

void clpar_ddp_buffers_broadcast(ddp_state *st, clpar_status read_status, clpar_gate *gate) {
  const char *what = "DistributedDataParallel: broadcasting buffers from rank 0";
  if (read_status != CLPAR_OK) { /* rank 0's header carries it: every rank fails alike */
    clpar_set_error(read_status, "%s: the read of the buffers failed",
                    st->buckets[0].dev->bd.info.id);
    clpar_ddp_record_error(st, read_status, "copying the buffers to host memory");
  }
  clpar_status s = clpar_ddp_bcast_block(st, read_status, what);
  char message[MESSAGE_SIZE] = "";
  if (s != CLPAR_OK) {
    snprintf(message, sizeof message, "%s", clpar_last_error());
    clpar_ddp_record_error(st, s, "broadcasting buffers from rank 0");
  }
  clpar_gate_open(gate, s, message); /* the queue writes the buffers */
}
