/* dnnl_conv.h — whole convolutions through oneDNN on a backend's engine (dnnl_conv.c): the
 * shape's descriptors and primitives, cached in the backend's cache, run on its memory (an
 * hd_io, dnnl_prim.h). Built with CLPAR_HAVE_DNNL. */
#ifndef CLPAR_DNNL_CONV_H
#define CLPAR_DNNL_CONV_H

#include "backend.h"
#include "dnnl_prim.h"

/* y = conv(x, w) + b (b NULL: no bias), as backend.h's conv2d; handles as io takes them. */
clpar_status hd_conv_forward(hd_io *io, const clpar_conv2d_shape *s, void *x, void *w, void *b,
                             void *y);
/* dx, dw and db (each NULL when not wanted; db only with dw) of backend.h's conv2d_backward,
 * each written whole. */
clpar_status hd_conv_backward(hd_io *io, const clpar_conv2d_shape *s, void *x, void *w, void *gy,
                              void *dx, void *dw, void *db);

#endif
