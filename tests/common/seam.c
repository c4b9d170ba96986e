#include "common/seam.h"

#include "common/ranks.h"

int hct_wait_comps(const hc_transport_ops_t *ops, hc_transport_t *tr, int kind, int want,
                   uint32_t *imms, int timeout_ms, hcoll_status_t *st_out)
{
    int got = 0;
    double deadline = hct_now_ms() + timeout_ms;
    *st_out = HCOLL_SUCCESS;
    while (got < want && hct_now_ms() < deadline) {
        hc_comp_t c[16];
        int n;
        hcoll_status_t st = ops->poll(tr, c, 16, 20, &n);
        if (st != HCOLL_SUCCESS) {
            *st_out = st;
            return got;
        }
        for (int i = 0; i < n; i++)
            if (c[i].kind == kind) {
                if (imms)
                    imms[got] = c[i].imm;
                got++;
            }
    }
    return got;
}
