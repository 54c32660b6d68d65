/*
** A fixed pool of worker threads. tsr_threadpool_run calls fn on every
** thread (the caller is thread 0) and returns when all have finished;
** tsr_threadpool_barrier lets the threads of one run wait for each other.
*/
#ifndef TSR_THREADPOOL_H
#define TSR_THREADPOOL_H

struct tsr_threadpool;

typedef void (*tsr_thread_fn)(void *arg, int ith, int nth);

struct tsr_threadpool *tsr_threadpool_new(int n_threads);
void tsr_threadpool_free(struct tsr_threadpool *p);
int tsr_threadpool_size(const struct tsr_threadpool *p);
void tsr_threadpool_run(struct tsr_threadpool *p, tsr_thread_fn fn, void *arg);
/* Called by all nth threads of a run; returns once all have arrived. */
void tsr_threadpool_barrier(struct tsr_threadpool *p);

#endif
