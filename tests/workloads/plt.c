/*
 * plt: main -> plt_loop, which calls plt_target (pltlib.c) through the PLT in a tight loop, so
 * many samples land in the PLT stub (`jmp *GOT`) or in the tiny callee. Runs argv[1] seconds.
 * Built without frame pointers: the stub's and the callee's frames unwind by their CFI only.
 *
 * Build: cc -O2 -g -fomit-frame-pointer -fno-inline libplt.so
 */
#include <stdlib.h>
#include <time.h>

int plt_target(int x);
static volatile int sink;

__attribute__((noinline)) void plt_loop(time_t end) {
    int acc = 0;
    while (time(NULL) < end) {
        for (int i = 0; i < 1000000; i++)
            acc = plt_target(acc);
        sink = acc;
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    plt_loop(time(NULL) + (time_t)seconds);
    return 0;
}
