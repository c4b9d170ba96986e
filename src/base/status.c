/* Status, version, dtype and op names: tables generated from hcoll.h. */
#include "hcoll.h"

#include <stddef.h>

#define NAME_(name, value, text) [value] = "HCOLL_" #name,
#define TEXT_(name, value, text) [value] = text,
static const char *const status_names[] = { HCOLL_STATUS_MAP(NAME_) };
static const char *const status_texts[] = { HCOLL_STATUS_MAP(TEXT_) };
#undef NAME_
#undef TEXT_

static int status_known(hcoll_status_t st)
{
    return (int)st >= 0 && (size_t)st < sizeof status_names / sizeof status_names[0] &&
           status_names[st] != NULL;
}

HCOLL_API const char *hcoll_strerror(hcoll_status_t status)
{
    return status_known(status) ? status_texts[status] : "unknown status";
}

HCOLL_API const char *hcoll_status_name(hcoll_status_t status)
{
    return status_known(status) ? status_names[status] : "unknown status";
}

HCOLL_API int hcoll_version(void)
{
    return HCOLL_VERSION_CODE;
}

static const struct {
    const char *name;
    size_t size;
} dtypes[HCOLL_DTYPE_COUNT_] = {
    [HCOLL_FLOAT32] = { "float32", 4 },  [HCOLL_FLOAT16] = { "float16", 2 },
    [HCOLL_BFLOAT16] = { "bfloat16", 2 }, [HCOLL_FLOAT64] = { "float64", 8 },
    [HCOLL_INT8] = { "int8", 1 },        [HCOLL_UINT8] = { "uint8", 1 },
    [HCOLL_INT32] = { "int32", 4 },      [HCOLL_INT64] = { "int64", 8 },
};

static const char *const op_names[HCOLL_OP_COUNT_] = {
    [HCOLL_SUM] = "sum", [HCOLL_PROD] = "prod", [HCOLL_MAX] = "max",
    [HCOLL_MIN] = "min", [HCOLL_AVG] = "avg",
};

HCOLL_API size_t hcoll_dtype_size(hcoll_dtype_t dtype)
{
    return (unsigned)dtype < HCOLL_DTYPE_COUNT_ ? dtypes[dtype].size : 0;
}

HCOLL_API const char *hcoll_dtype_name(hcoll_dtype_t dtype)
{
    return (unsigned)dtype < HCOLL_DTYPE_COUNT_ ? dtypes[dtype].name : "unknown";
}

HCOLL_API const char *hcoll_op_name(hcoll_op_t op)
{
    return (unsigned)op < HCOLL_OP_COUNT_ ? op_names[op] : "unknown";
}
