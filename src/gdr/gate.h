/*
 * Gates: where hcoll's own stream waits for its host threads, so that the
 * caller's stream never has to.
 *
 *   caller's thread, at call time             worker, later
 *   gstream: ... wait(word >= t) H2D ... ev   ring done → word = t
 *   caller's stream: wait(ev) AG ...
 *
 * The word is pinned host memory mapped into the device (the CPU writes it
 * with a plain store, the stream polls it with cuStreamWaitValue32 at the
 * device address cuMemHostGetDevicePointer gives), and
 * the stream that waits on it, gstream, is hcoll's: every piece of work
 * that the word's release depends on was submitted before the wait, so
 * the wait cannot block a hardware queue that hcoll's own later work
 * needs (a queue runs all its streams' work in submission order; with
 * CUDA_DEVICE_MAX_CONNECTIONS=1 there is one). The caller's stream waits
 * only on events (cuStreamWaitEvent), which CUDA's scheduler sees.
 *
 * Tickets are 32-bit, issued in order at call time and released in the
 * same order by the worker: writing t releases t and every ticket before
 * it (cyclic compare, as CU_STREAM_WAIT_VALUE_GEQ evaluates).
 */
#ifndef HC_GDR_GATE_H
#define HC_GDR_GATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gdr/event.h"
#include "gdr/gdr.h"
#include "hcoll.h"

typedef struct hc_gdr_gate {
    const hc_cu_api_t *cu;
    hc_gdr_report_t rp;
    void *stream;            /* gstream: hcoll's, non-blocking */
    uint32_t *word;          /* pinned, device-mapped; the CPU writes it */
    hc_cu_dptr_t dword;      /* its device address (cuMemHostGetDevicePointer) */
    uint32_t *done;          /* its own cache line; gstream writes it */
    uint32_t signaled;       /* the last value a signal writes to done */
    void *ev_drain;          /* gstream past every call's work (mark) */
    int cudev;               /* the word's GPU, for its pinned pool */
    pthread_mutex_t lock;    /* issued, released */
    uint32_t issued, released;
} hc_gdr_gate_t;

/* Make the stream and the word (0), in the calling thread's current
 * context. Failures are recorded through rp. */
hcoll_status_t hc_gdr_gate_open(const hc_cu_api_t *cu, const hc_gdr_report_t *rp,
                                hc_gdr_gate_t **out);

/* Release every ticket, wait up to timeout_ms for gstream to pass its last
 * mark, then free it all (context current; nothing that synchronises the
 * device: the word goes back to the GPU's pinned pool). A stream still inside keeps the word
 * allocated rather than freed under it. NULL is a no-op. */
void hc_gdr_gate_close(hc_gdr_gate_t *g, int timeout_ms);

/* Record that gstream is past everything enqueued so far: call after each
 * call's work, at call time (context current); close waits for the last
 * mark instead of recording behind whatever an application enqueued since. */
hcoll_status_t hc_gdr_gate_mark(hc_gdr_gate_t *g);
/* Issue the next ticket and make gstream wait for it (context current).
 * On failure the ticket is given back. */
hcoll_status_t hc_gdr_gate_wait(hc_gdr_gate_t *g, uint32_t *ticket_out);

/* Release every ticket up to t (the CPU's store; never fails). Releasing
 * an already released ticket does nothing. */
void hc_gdr_gate_release(hc_gdr_gate_t *g, uint32_t t);

/* Release every ticket issued so far. */
void hc_gdr_gate_release_all(hc_gdr_gate_t *g);

/* Signals: gstream writes the next value to done behind what is queued
 * (cuStreamWriteValue32, which fences first); *value_out is that value.
 * The CPU reads done (no driver call) to see how far gstream got. */
hcoll_status_t hc_gdr_gate_signal(hc_gdr_gate_t *g, uint32_t *value_out);
uint32_t hc_gdr_gate_done(const hc_gdr_gate_t *g);

/* A copy between device memory and pinned host memory on gstream. */
hcoll_status_t hc_gdr_gate_copy(hc_gdr_gate_t *g, void *host, void *dev, size_t bytes,
                                int to_host);

#endif
