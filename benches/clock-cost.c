/* What the metrics path's pieces cost on this machine, in a tight loop: a clock read
 * (what Instant::now() does), rdtsc, the coarse clock, a locked add (a relaxed
 * AtomicU64::fetch_add) and a single writer's load and store.
 * Usage: cc -O2 benches/clock-cost.c -o /tmp/clock-cost && /tmp/clock-cost */
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static double ns(struct timespec a, struct timespec b)
{
	return (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
}

static unsigned long long counters[8];

int main(void)
{
	struct timespec a, b, t;
	const int n = 2000000, m = 20000000;
	volatile unsigned long long sink = 0;
	unsigned aux;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < n; i++) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		sink += t.tv_nsec;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("clock_gettime(CLOCK_MONOTONIC)  %6.1f ns\n", ns(a, b) / n);

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < n; i++)
		sink += __rdtscp(&aux);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("rdtscp                          %6.1f ns\n", ns(a, b) / n);

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < n; i++) {
		clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
		sink += t.tv_nsec;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("clock_gettime(MONOTONIC_COARSE) %6.1f ns\n", ns(a, b) / n);

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < m; i++)
		__atomic_fetch_add(&counters[i & 7], 1, __ATOMIC_RELAXED);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("locked add                      %6.2f ns\n", ns(a, b) / m);

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < m; i++) {
		unsigned long long v = __atomic_load_n(&counters[i & 7], __ATOMIC_RELAXED);
		__atomic_store_n(&counters[i & 7], v + 1, __ATOMIC_RELAXED);
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("load + store                    %6.2f ns\n", ns(a, b) / m);
	return (int)(sink & 0);
}
