/*
 * The ring thread (ringthr.h): a ring of HC_RINGTHR_JOBS job slots under
 * one lock; the thread takes them in order and drives each with the ring
 * driver.
 */
#include "core/ringthr.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "inter/ring.h"

typedef struct ring_job {
    hc_ringdrv_op_t op;
    atomic_size_t *landed; /* hc_ringthr_post_watched, else NULL */
    double busy_us; /* written by the ring thread */
    hcoll_status_t st; /* the job's own status, under lock */
    int voided; /* st is a void operation's (not sticky), under lock */
} ring_job_t;

struct hc_ringthr {
    struct hc_ring *ring;
    hc_ringdrv_env_t env;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    ring_job_t jobs[HC_RINGTHR_JOBS];
    uint64_t posted, done; /* under lock */
    hcoll_status_t status; /* under lock; sticky */
    int stop;
};

static void *ringthr_main(void *arg)
{
    hc_ringthr_t *t = arg;
    uint64_t next = 0;

    for (;;) {
        pthread_mutex_lock(&t->lock);
        while (!t->stop && t->posted == next)
            pthread_cond_wait(&t->cond, &t->lock);
        if (t->stop) {
            pthread_mutex_unlock(&t->lock);
            return NULL;
        }
        ring_job_t *job = &t->jobs[next % HC_RINGTHR_JOBS];
        hcoll_status_t st = t->status;
        pthread_mutex_unlock(&t->lock);

        double t0 = hc_now_us();
        const uint64_t voided = hc_ring_voided(t->ring);
        if (st == HCOLL_SUCCESS)
            st = hc_ringdrv_run_watched(t->ring, &job->op, &t->env, job->landed);
        job->busy_us = hc_now_us() - t0;

        pthread_mutex_lock(&t->lock);
        job->st = st;
        job->voided = st != HCOLL_SUCCESS && hc_ring_voided(t->ring) != voided;
        /* A void operation failed that job on every rank alike and left
         * the ring in step: not sticky. */
        if (st != HCOLL_SUCCESS && t->status == HCOLL_SUCCESS && !job->voided)
            t->status = st;
        t->done = ++next;
        pthread_cond_broadcast(&t->cond);
        pthread_mutex_unlock(&t->lock);
    }
}

hcoll_status_t hc_ringthr_start(struct hc_ring *ring, const hc_ringdrv_env_t *env,
                                hc_ringthr_t **out)
{
    hc_ringthr_t *t = calloc(1, sizeof *t);
    if (!t)
        return hc_err_set(env->err, HC_COLL, env->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the ring thread");
    t->ring = ring;
    t->env = *env;
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    int rc = pthread_create(&t->thread, NULL, ringthr_main, t);
    if (rc != 0) {
        pthread_mutex_destroy(&t->lock);
        pthread_cond_destroy(&t->cond);
        free(t);
        return hc_err_set(env->err, HC_COLL, env->rank, HCOLL_ERR_SYSTEM,
                          "cannot start the ring thread: %s", strerror(rc));
    }
    *out = t;
    return HCOLL_SUCCESS;
}

uint64_t hc_ringthr_post(hc_ringthr_t *t, const hc_ringdrv_op_t *job)
{
    return hc_ringthr_post_watched(t, job, NULL);
}

uint64_t hc_ringthr_post_watched(hc_ringthr_t *t, const hc_ringdrv_op_t *job,
                                 atomic_size_t *landed)
{
    pthread_mutex_lock(&t->lock);
    while (t->posted - t->done >= HC_RINGTHR_JOBS)
        pthread_cond_wait(&t->cond, &t->lock);
    uint64_t id = t->posted;
    t->jobs[id % HC_RINGTHR_JOBS].op = *job;
    t->jobs[id % HC_RINGTHR_JOBS].landed = landed;
    t->posted++;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
    return id;
}

hcoll_status_t hc_ringthr_wait(hc_ringthr_t *t, uint64_t id, double *inter_us)
{
    pthread_mutex_lock(&t->lock);
    while (t->done <= id)
        pthread_cond_wait(&t->cond, &t->lock);
    *inter_us += t->jobs[id % HC_RINGTHR_JOBS].busy_us;
    hcoll_status_t st = t->status != HCOLL_SUCCESS ? t->status : t->jobs[id % HC_RINGTHR_JOBS].st;
    pthread_mutex_unlock(&t->lock);
    return st;
}

int hc_ringthr_voided(hc_ringthr_t *t, uint64_t id)
{
    pthread_mutex_lock(&t->lock);
    int v = t->done > id && t->status == HCOLL_SUCCESS && t->jobs[id % HC_RINGTHR_JOBS].voided;
    pthread_mutex_unlock(&t->lock);
    return v;
}

int hc_ringthr_test(hc_ringthr_t *t, uint64_t id)
{
    pthread_mutex_lock(&t->lock);
    int done = t->done > id;
    pthread_mutex_unlock(&t->lock);
    return done;
}

void hc_ringthr_stop(hc_ringthr_t *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    free(t);
}
