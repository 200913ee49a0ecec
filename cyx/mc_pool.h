/* A small thread pool for the kernels, in place of an OpenMP parallel region.
 *
 * Why not `#pragma omp parallel for`: an OpenMP region ends in a barrier that
 * waits for every thread of the team, including one the OS has not scheduled
 * yet.  On a busy machine (more runnable threads than cores) that costs a
 * scheduler time slice per call: a 50 us GEMV measured 8-20 ms with 2 threads.
 *
 * Here the work is split into chunks that threads claim one at a time from an
 * atomic counter, and the caller returns as soon as every chunk is done: a
 * worker that wakes late finds nothing left and goes back to sleep, so a busy
 * machine degrades to single-threaded speed instead of stalling.
 *
 * Protocol: `state` packs (job generation << 32 | chunks left).  A thread owns
 * chunk `nchunks - left` of generation g only if its compare-and-swap from (g, left)
 * to (g, left - 1) succeeds; the job's fields stay valid until all its chunks
 * are done, which needs that thread's chunk.  `done` counts finished chunks.
 */
#ifndef MC_POOL_H
#define MC_POOL_H

#include "mc_common.h"

typedef void (*mc_chunk_fn)(void *ctx, int chunk);

#if defined(_WIN32)

static void mc_parallel(int nth, int nchunks, mc_chunk_fn fn, void *ctx) {
    (void)nth;
    for (int c = 0; c < nchunks; c++) fn(ctx, c);
}

#else

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define MC_POOL_MAX 256
#define MC_SPIN_ROUNDS 4000 /* polls of `state` before a worker sleeps */
#ifndef MC_STALL_S
#define MC_STALL_S 1e-4 /* a wait this long for a descheduled worker counts as a stall */
#endif

typedef struct {
    _Atomic uint64_t state; /* gen << 32 | chunks left */
    _Atomic int done;       /* chunks finished in the current job */
    _Atomic int sleepers;   /* workers blocked on `cv` */
    mc_chunk_fn fn;
    void *ctx;
    int nchunks; /* of the current job */
    int nworkers;
    pid_t pid;
    pthread_mutex_t job_mu; /* one job at a time */
    pthread_mutex_t mu;     /* guards sleeping on cv */
    pthread_cond_t cv;
    pthread_t threads[MC_POOL_MAX];
} mc_pool;

static mc_pool *mc_the_pool = NULL;

/* Stall back-off: a job whose caller waited > MC_STALL_S (0.1 ms), and over half the
 * time it worked, for a descheduled worker to finish its chunk (in a healthy run
 * that wait is one chunk, microseconds) is a stall; MC_STALLS_BACKOFF stalls among the
 * last MC_STALL_WINDOW jobs mark the machine oversubscribed, and the next `mc_solo_left`
 * jobs then run on the caller alone (64, doubling while stalls persist, up to 4096),
 * after which threads are tried again.  One stall alone is not enough: a server's own
 * event loop preempts a worker now and then (a burst of response writes, once a
 * step of ~100 jobs); backing off on each of those ran 18% of a served 8-stream
 * decode's jobs single-threaded (in-process: 3%).  So do
 * MC_LONELY_JOBS jobs in a row of 4+ chunks where the workers took under a quarter: on a
 * machine with more runnable threads than cores a spinning worker that is not
 * scheduled only takes CPU time from the caller (measured on 2 busy cores: decode
 * at batch 1 ran at ~80 tok/s with 2 threads, ~125 with 1). */
static _Atomic int mc_solo_left = 0;
static _Atomic int mc_backoff_on = 1; /* mc_pool_backoff(0) turns it off (benchmarks) */
static _Atomic int mc_backoff = 64;
static _Atomic int mc_lonely = 0; /* jobs in a row whose caller ran over 3/4 of the chunks */
#define MC_LONELY_JOBS 16
static _Atomic uint32_t mc_stall_hist = 0; /* bit i: the job i jobs ago stalled */
#define MC_STALL_WINDOW 16
#define MC_STALLS_BACKOFF 3
/* counters for mc_pool_stats: jobs offered to the pool, of them run on the caller alone
 * by the back-off, and back-offs started */
static _Atomic long long mc_stat_jobs = 0, mc_stat_solo = 0, mc_stat_stalls = 0;

static inline double mc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static pthread_mutex_t mc_pool_create_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void mc_cpu_relax(void) {
#if defined(MC_X86)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Claim and run chunks of the current job until none are left. */
static int mc_pool_work(mc_pool *p) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    int ran = 0;
    for (;;) {
        const uint32_t left = (uint32_t)s;
        if (left == 0) return ran;
        if (atomic_compare_exchange_weak_explicit(&p->state, &s, s - 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            p->fn(p->ctx, p->nchunks - (int)left); /* ascending: memory streams forward */
            ran++;
            atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
            s = atomic_load_explicit(&p->state, memory_order_acquire);
        }
    }
}

static void *mc_pool_main(void *arg) {
    mc_pool *p = (mc_pool *)arg;
    uint32_t seen = (uint32_t)(atomic_load(&p->state) >> 32);
    for (;;) {
        int spins = 0;
        uint64_t s;
        while ((uint32_t)((s = atomic_load_explicit(&p->state, memory_order_acquire)) >> 32) ==
               seen) {
            if (++spins < MC_SPIN_ROUNDS) {
                mc_cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((uint32_t)(atomic_load(&p->state) >> 32) == seen)
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        seen = (uint32_t)(s >> 32);
        mc_pool_work(p);
    }
    return NULL;
}

static void mc_pool_atfork_child(void);
static void mc_pool_register_atfork(void) { pthread_atfork(NULL, NULL, mc_pool_atfork_child); }

/* In a forked child the workers are gone and the locks may be held by threads
 * that no longer exist: start over (the parent's pool memory is left alone). */
static void mc_pool_atfork_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    mc_pool_create_mu = fresh;
    mc_the_pool = NULL;
}

/* The pool with at least `nworkers` workers (created, or grown, on demand). */
static mc_pool *mc_pool_get(int nworkers) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, mc_pool_register_atfork);
    if (nworkers > MC_POOL_MAX) nworkers = MC_POOL_MAX;
    mc_pool *p = mc_the_pool;
    if (p != NULL && p->pid == getpid() && p->nworkers >= nworkers) return p;
    pthread_mutex_lock(&mc_pool_create_mu);
    p = mc_the_pool;
    if (p == NULL || p->pid != getpid()) { /* first use, or a forked child: a fresh pool */
        p = (mc_pool *)calloc(1, sizeof(mc_pool));
        if (p == NULL) {
            pthread_mutex_unlock(&mc_pool_create_mu);
            return NULL;
        }
        atomic_init(&p->state, 0);
        atomic_init(&p->done, 0);
        atomic_init(&p->sleepers, 0);
        p->pid = getpid();
        pthread_mutex_init(&p->job_mu, NULL);
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv, NULL);
        mc_the_pool = p;
    }
    pthread_mutex_lock(&p->job_mu); /* no job runs while workers are added */
    while (p->nworkers < nworkers) {
        if (pthread_create(&p->threads[p->nworkers], NULL, mc_pool_main, p) != 0) break;
        pthread_detach(p->threads[p->nworkers]);
        p->nworkers++;
    }
    pthread_mutex_unlock(&p->job_mu);
    pthread_mutex_unlock(&mc_pool_create_mu);
    return p;
}

/* Run fn(ctx, c) for c in [0, nchunks) on up to nth threads (the caller included). */
static void mc_parallel(int nth, int nchunks, mc_chunk_fn fn, void *ctx) {
    mc_pool *p = NULL;
    if (nth > 1 && nchunks > 1) {
        atomic_fetch_add_explicit(&mc_stat_jobs, 1, memory_order_relaxed);
        if (atomic_load_explicit(&mc_solo_left, memory_order_relaxed) > 0) {
            atomic_fetch_sub_explicit(&mc_solo_left, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&mc_stat_solo, 1, memory_order_relaxed);
        } else
            p = mc_pool_get(nth - 1);
    }
    if (p == NULL || pthread_mutex_trylock(&p->job_mu) != 0) {
        /* single-threaded, or another thread's job holds the pool: run inline */
        for (int c = 0; c < nchunks; c++) fn(ctx, c);
        return;
    }
    const double t0 = mc_now();
    p->fn = fn;
    p->ctx = ctx;
    p->nchunks = nchunks;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint64_t gen = (atomic_load(&p->state) >> 32) + 1;
    atomic_store(&p->state, (gen << 32) | (uint32_t)nchunks); /* seq_cst: ordered before the sleepers load */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    const int mine = mc_pool_work(p);
    const double t1 = mc_now();
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < nchunks) {
        if (++spins < 1000)
            mc_cpu_relax();
        else
            sched_yield();
    }
    pthread_mutex_unlock(&p->job_mu);
    if (!atomic_load(&mc_backoff_on)) return;
    /* workers that took under a quarter of 4+ chunks, job after job, are not getting a core */
    const int alone = nchunks >= 4 && 4 * mine > 3 * nchunks;
    const int lonely = alone ? atomic_fetch_add(&mc_lonely, 1) + 1 : 0;
    if (!alone) atomic_store(&mc_lonely, 0);
    int stalled = 0;
    if (spins >= 1000) {
        const double waited = mc_now() - t1, worked = t1 - t0;
        stalled = waited > MC_STALL_S && waited > 0.5 * worked;
    }
    const uint32_t hist = ((atomic_load(&mc_stall_hist) << 1) | (uint32_t)stalled) &
                          ((1u << MC_STALL_WINDOW) - 1);
    atomic_store(&mc_stall_hist, hist);
    if (lonely >= MC_LONELY_JOBS || __builtin_popcount(hist) >= MC_STALLS_BACKOFF) {
        atomic_store(&mc_stall_hist, 0);
        atomic_fetch_add_explicit(&mc_stat_stalls, 1, memory_order_relaxed);
        const int b = atomic_load(&mc_backoff);
        atomic_store(&mc_solo_left, b);
        atomic_store(&mc_backoff, b < 4096 ? 2 * b : 4096);
        atomic_store(&mc_lonely, 0);
    } else if (!alone && spins < 1000) {
        atomic_store(&mc_backoff, 64);
    }
}

#endif /* _WIN32 */

/* out[0..2]: jobs offered to the pool, jobs the back-off ran on the caller alone, back-offs
 * started (since the process started) */
MC_API void mc_pool_stats(long long out[3]) {
#if !defined(_WIN32)
    out[0] = atomic_load(&mc_stat_jobs);
    out[1] = atomic_load(&mc_stat_solo);
    out[2] = atomic_load(&mc_stat_stalls);
#else
    out[0] = out[1] = out[2] = 0;
#endif
}

/* Enable (1) or disable (0) the stall back-off; clears any back-off in force. */
MC_API void mc_pool_backoff(int on) {
#if !defined(_WIN32)
    atomic_store(&mc_backoff_on, on);
    atomic_store(&mc_solo_left, 0);
    atomic_store(&mc_backoff, 64);
    atomic_store(&mc_lonely, 0);
    atomic_store(&mc_stall_hist, 0);
#else
    (void)on;
#endif
}

#endif /* MC_POOL_H */
