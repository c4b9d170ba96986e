/*
 * Driving a transport (src/inter/transport.h) directly in tests.
 */
#ifndef HCT_SEAM_H
#define HCT_SEAM_H

#include <stdint.h>

#include "inter/transport.h"

/* Poll tr until want completions of kind (enum hc_comp_kind) arrived or
 * timeout_ms passed; their immediates go to imms (may be NULL). Returns how
 * many arrived; *st_out is the poll error that stopped it, else success. */
int hct_wait_comps(const hc_transport_ops_t *ops, hc_transport_t *tr, int kind, int want,
                   uint32_t *imms, int timeout_ms, hcoll_status_t *st_out);

#endif
