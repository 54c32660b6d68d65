#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

struct tsr_threadpool {
  int n;
  pthread_t *threads;
  pthread_mutex_t lock;
  pthread_cond_t wake, finished;
  atomic_uint generation; /* bumped per run (and at the end); workers wait for a new one */
  atomic_uint running;    /* workers still inside the current run */
  bool stop;
  tsr_thread_fn fn;
  void *arg;
  /* sense-reversing barrier */
  atomic_int barrier_count;
  atomic_uint barrier_phase;
};

struct worker_arg {
  struct tsr_threadpool *pool;
  int ith;
};

/* How long a thread spins for the next run, or for the workers to finish one, before it
** sleeps: longer than a decode step spends between two runs, so no step waits for a sleeping
** thread to be woken (on a 2-core VM that wake-up cost the 21M model's decode 5-10%). */
#define SPIN_NS 200000

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Spins while (*v == x) == equal, for at most SPIN_NS */
static void spin_while(const atomic_uint *v, unsigned x, bool equal) {
  int64_t start = 0;
  for (unsigned i = 1; (atomic_load_explicit(v, memory_order_acquire) == x) == equal; i++) {
    cpu_relax();
    if (i % 256) continue;
    const int64_t t = now_ns();
    if (!start) start = t;
    else if (t - start > SPIN_NS) return;
  }
}

static void *worker_main(void *p) {
  struct worker_arg *wa = p;
  struct tsr_threadpool *pool = wa->pool;
  int ith = wa->ith;
  free(wa);
  unsigned seen = 0;
  for (;;) {
    spin_while(&pool->generation, seen, true);
    pthread_mutex_lock(&pool->lock);
    while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pool->wake, &pool->lock);
    if (pool->stop) {
      pthread_mutex_unlock(&pool->lock);
      return NULL;
    }
    seen = pool->generation;
    tsr_thread_fn fn = pool->fn;
    void *arg = pool->arg;
    pthread_mutex_unlock(&pool->lock);

    fn(arg, ith, pool->n);

    pthread_mutex_lock(&pool->lock);
    if (--pool->running == 0) pthread_cond_signal(&pool->finished);
    pthread_mutex_unlock(&pool->lock);
  }
}

struct tsr_threadpool *tsr_threadpool_new(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  struct tsr_threadpool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n_threads;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->finished, NULL);
  p->threads = calloc((size_t)n_threads, sizeof *p->threads);
  if (!p->threads) {
    free(p);
    return NULL;
  }
  for (int i = 1; i < n_threads; i++) {
    struct worker_arg *wa = malloc(sizeof *wa);
    if (!wa || (wa->pool = p, wa->ith = i, pthread_create(&p->threads[i], NULL, worker_main, wa))) {
      free(wa);
      p->n = i; /* run with the threads we have; join only those */
      break;
    }
  }
  return p;
}

void tsr_threadpool_free(struct tsr_threadpool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->stop = true;
  p->generation++; /* ends the workers' spin */
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);
  for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->finished);
  free(p->threads);
  free(p);
}

int tsr_threadpool_size(const struct tsr_threadpool *p) { return p->n; }

void tsr_threadpool_run(struct tsr_threadpool *p, tsr_thread_fn fn, void *arg) {
  atomic_store(&p->barrier_count, 0);
  pthread_mutex_lock(&p->lock);
  p->fn = fn;
  p->arg = arg;
  p->running = p->n - 1;
  p->generation++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);

  fn(arg, 0, p->n);

  spin_while(&p->running, 0, false);
  pthread_mutex_lock(&p->lock);
  while (p->running > 0) pthread_cond_wait(&p->finished, &p->lock);
  pthread_mutex_unlock(&p->lock);
}

void tsr_threadpool_barrier(struct tsr_threadpool *p) {
  if (p->n == 1) return;
  unsigned phase = atomic_load_explicit(&p->barrier_phase, memory_order_acquire);
  if (atomic_fetch_add_explicit(&p->barrier_count, 1, memory_order_acq_rel) == p->n - 1) {
    atomic_store_explicit(&p->barrier_count, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->barrier_phase, 1, memory_order_acq_rel);
    return;
  }
  /* spin briefly, then yield: the machine may have fewer free cores than threads */
  for (int spins = 0; atomic_load_explicit(&p->barrier_phase, memory_order_acquire) == phase;
       spins++) {
    cpu_relax();
    if (spins > 1000) sched_yield();
  }
}
