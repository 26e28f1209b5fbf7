/*
 * sigprof: a SIGPROF handler that burns CPU. An interval timer (ITIMER_PROF, every 2 ms of CPU)
 * interrupts interrupted_loop; the handler calls handler_burn for a few ms (the timer fires
 * again meanwhile, so most CPU time goes to the handler). Stacks sampled in the handler run
 * handler_burn <- on_prof <- the kernel's signal trampoline (__restore_rt) <-
 * interrupted_loop <- main. Runs argv[1] seconds. Built without frame pointers, so only the
 * unwind tables (and their signal-frame rows) give the whole stack.
 *
 * Build: cc -O2 -g -fomit-frame-pointer -fno-inline
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static volatile uint64_t sink;

__attribute__((noinline)) void handler_burn(void) {
    uint64_t acc = sink;
    for (uint64_t i = 2000000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

__attribute__((noinline)) void on_prof(int sig) {
    (void)sig;
    handler_burn();
}

__attribute__((noinline)) void interrupted_loop(time_t end) {
    uint64_t acc = sink;
    while (time(NULL) < end) {
        for (int i = 0; i < 100000; i++)
            acc = acc * 6364136223846793005ull + 1442695040888963407ull;
        sink = acc;
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    struct sigaction sa = {0};
    sa.sa_handler = on_prof;
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval timer = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_PROF, &timer, NULL);
    interrupted_loop(time(NULL) + (time_t)seconds);
    return 0;
}
