/* host_dnnl.c — the host backend's whole convolutions (backend.h's conv2d entries) through
 * oneDNN's CPU engine: the shape's primitives come from dnnl_conv.c (shared with the OpenCL
 * backend's oneDNN path), run on the host's pointers and work buffers (host_dnnl_core.c).
 * Results are the same bits run to run at a given thread count (tests/test_host_dnnl.c). */
#include <stdlib.h>

#include "dnnl_conv.h"
#include "host/host_dnnl.h"
#include "host/host_dnnl_core.h"

static void *at(clpar_bref r) {
  return (float *)r.buf + r.off;
}

clpar_status clpar_host_dnnl_conv2d(void *dev, clpar_conv2d_shape s, clpar_bref x,
                                    clpar_bref weight, clpar_bref bias, clpar_bref y) {
  (void)dev;
  hd_lock();
  hd_io io;
  clpar_status st = hd_host_io(&io);
  if (st == CLPAR_OK)
    st = hd_conv_forward(&io, &s, at(x), at(weight), bias.buf ? at(bias) : NULL, at(y));
  hd_unlock();
  return st;
}

clpar_status clpar_host_dnnl_conv2d_backward(void *dev, clpar_conv2d_shape s, clpar_bref x,
                                             clpar_bref weight, clpar_bref gy, clpar_bref dx,
                                             clpar_bref dw, clpar_bref db) {
  (void)dev;
  hd_lock();
  hd_io io;
  clpar_status st = hd_host_io(&io);
  if (st == CLPAR_OK)
    st = hd_conv_backward(&io, &s, at(x), at(weight), at(gy), dx.buf ? at(dx) : NULL,
                          dw.buf ? at(dw) : NULL, db.buf ? at(db) : NULL);
  hd_unlock();
  return st;
}
