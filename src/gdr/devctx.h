/*
 * One GPU as the device executor uses it: the retained primary context
 * (the one the CUDA runtime uses), an internal non-blocking stream, two
 * pinned staging buffers, and the reduction kernels. Callers' streams
 * wait on events and gates (gate.h), never on work submitted after them.
 *
 * Every function pushes the context itself where it needs it, so that
 * hcoll's threads and the caller's (whose current context is the
 * application's) may call them alike. Failures are recorded once, here,
 * through the hc_gdr_report_t given at open.
 */
#ifndef HC_GDR_DEVCTX_H
#define HC_GDR_DEVCTX_H

#include <stddef.h>
#include <stdint.h>

#include "gdr/event.h"
#include "gdr/gdr.h"
#include "hcoll.h"

/* Fields are read-only outside devctx.c. */
typedef struct hc_gdr_dev {
    const hc_cu_api_t *cu;
    hc_gdr_report_t rp;
    int ordinal;
    int cudev;       /* its CUdevice */
    void *ctx;       /* retained primary context */
    void *istream;   /* internal, non-blocking */
    size_t stage_bytes; /* each of the two buffers; 0: none */
    void *stage[2];
    void *ev_fence;  /* istream past its last work, recorded at each enqueue */
    int fence_lost;  /* a record of it failed: close cannot tell */
    hc_gdr_kern_t *kern; /* NULL: not loaded, kern_why says why */
    char kern_why[200];
} hc_gdr_dev_t;

/* Open GPU `ordinal`: retain its primary context, make the stream and,
 * with stage_bytes > 0, the staging buffers; load
 * the kernels when possible (optional). Nothing collective. */
hcoll_status_t hc_gdr_dev_open(const hc_cu_api_t *cu, int ordinal, size_t stage_bytes,
                               const hc_gdr_report_t *rp, hc_gdr_dev_t **out);

/* Free everything open made and release the context (never waiting for
 * the application's streams). NULL is a no-op. */
void hc_gdr_dev_close(hc_gdr_dev_t *g);

/* Make g's context current on this thread / restore the previous one. */
void hc_gdr_dev_push(hc_gdr_dev_t *g);
/* hc_gdr_dev_push that reports a failure (then nothing is pushed). */
hcoll_status_t hc_gdr_dev_enter(hc_gdr_dev_t *g);
void hc_gdr_dev_pop(hc_gdr_dev_t *g);

/* ---- Callers' streams (context pushed by the caller) ---- */

/* HCOLL_ERR_UNSUPPORTED when stream is being captured into a CUDA graph
 * (asked with the calling thread's context; a driver that cannot tell
 * passes). No device needed: also asked before the first set-up. */
hcoll_status_t hc_gdr_stream_refuse_capture(const hc_cu_api_t *cu, void *stream,
                                            const hc_gdr_report_t *rp);

/* The stream is valid, not being captured, and of g's context. */
hcoll_status_t hc_gdr_dev_stream_check(hc_gdr_dev_t *g, void *stream);

/* A new event (no timing) / one recorded on stream now. */
hcoll_status_t hc_gdr_dev_event_new(hc_gdr_dev_t *g, void **ev_out);
hcoll_status_t hc_gdr_dev_event_mark(hc_gdr_dev_t *g, void *stream, void **ev_out);
/* Destroy ev; NULL is a no-op. */
void hc_gdr_dev_event_free(hc_gdr_dev_t *g, void *ev);

/* Record ev on stream and keep it in l (hc_gdr_evlist_add); ev is
 * destroyed when it cannot be recorded. */
void hc_gdr_dev_event_track(hc_gdr_dev_t *g, void *ev, void *stream, hc_gdr_evlist_t *l,
                            int timeout_ms);

/* Device-to-device copy / AVG division kernel, on stream. */
hcoll_status_t hc_gdr_dev_copy_async(hc_gdr_dev_t *g, void *dst, const void *src, size_t bytes,
                                     void *stream);
hcoll_status_t hc_gdr_dev_avg_async(hc_gdr_dev_t *g, void *buf, size_t count,
                                    hcoll_dtype_t dtype, int div, void *stream);
/* dst = scalar * src on stream (hc_gdr_kern_scale): dev_scalar, one
 * element of dtype in device memory, or else kbits. Needs the kernels. */
hcoll_status_t hc_gdr_dev_scale_async(hc_gdr_dev_t *g, void *dst, const void *src, size_t count,
                                      hcoll_dtype_t dtype, const void *dev_scalar, uint64_t kbits,
                                      void *stream);

/* ---- More on callers' streams (context pushed by the caller) ---- */

/* Free device memory of hc_gdr_dev_alloc behind stream's work. */
void hc_gdr_dev_free_async(hc_gdr_dev_t *g, void *p, void *stream);
/* Make stream wait for ev's latest record (cuStreamWaitEvent). */
hcoll_status_t hc_gdr_dev_stream_wait_event(hc_gdr_dev_t *g, void *stream, void *ev);
/* Record ev on stream now (an event of hc_gdr_dev_event_new). */
hcoll_status_t hc_gdr_dev_event_record(hc_gdr_dev_t *g, void *ev, void *stream);

/* ---- Device memory operations for a GPUDirect ring ----
 * On the internal stream, each complete on return, pushing the context
 * itself (they run on hcoll's threads). */
hcoll_status_t hc_gdr_dev_alloc(hc_gdr_dev_t *g, size_t bytes, void **out);
void hc_gdr_dev_free(hc_gdr_dev_t *g, void *p);
hcoll_status_t hc_gdr_dev_reduce(hc_gdr_dev_t *g, void *dst, const void *a, const void *b,
                                 size_t count, hcoll_dtype_t dtype, hcoll_op_t op);
hcoll_status_t hc_gdr_dev_avg(hc_gdr_dev_t *g, void *buf, size_t count, hcoll_dtype_t dtype,
                              int div);
hcoll_status_t hc_gdr_dev_copy(hc_gdr_dev_t *g, void *dst, const void *src, size_t bytes);

#endif
