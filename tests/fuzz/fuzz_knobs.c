/* Every HCOLL_* variable's parser (base/config.c): values another process
 * (a launcher, a job script) sets. The first input byte picks the knob. */
#include "fuzz.h"

#include "base/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t n;
    const hc_knob_t *k = hc_knobs(&n);
    k += data[0] % n;
    char *text = fuzz_str(data + 1, size - 1);
    hc_knob_value_t v;
    hc_params_t p;
    char err[256];
    memset(&p, 0, sizeof p);
    hcoll_status_t st = hc_knob_value(k, text, &v, err, sizeof err);
    if (st == HCOLL_SUCCESS) {
        if (k->kind == HC_KNOB_INT)
            FUZZ_CHECK(v.i >= k->min && v.i <= k->max);
        if (k->kind == HC_KNOB_SIZE)
            FUZZ_CHECK(v.size >= (uint64_t)k->min && v.size <= (uint64_t)k->max);
        if (k->kind == HC_KNOB_ENUM) {
            int c = 0;
            while (k->choices[c])
                c++;
            FUZZ_CHECK(v.choice >= 0 && v.choice < c);
        }
        FUZZ_CHECK(hc_knob_parse(k, text, &p, err, sizeof err) == HCOLL_SUCCESS);
    } else {
        fuzz_check_err(err, sizeof err);
        FUZZ_CHECK(hc_knob_parse(k, text, &p, err, sizeof err) != HCOLL_SUCCESS);
    }
    uint64_t sz;
    (void)hc_parse_size(text, &sz);
    free(text);
    return 0;
}
