/*
 * bigframes: main -> deep (10 levels, each with a 1,200-byte local buffer) -> leaf_work,
 * without frame pointers, so the unwinder reads each return address 1.2 KiB above the last
 * and the stack it walks spans several pages (the walker's window copies at most one page per
 * read: tests/tests/unwind.rs). Runs argv[1] seconds.
 *
 * Build: cc -O2 -g -fomit-frame-pointer -fno-inline -fno-optimize-sibling-calls
 */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define LEVELS 10
#define FRAME_BYTES 1200

static volatile uint64_t sink;

__attribute__((noinline)) void leaf_work(void) {
    uint64_t acc = sink;
    for (uint64_t i = 200000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

/* The buffer is written and read so the compiler keeps it in the frame. */
__attribute__((noinline)) void deep(int level) {
    volatile uint8_t buffer[FRAME_BYTES];
    buffer[0] = (uint8_t)level;
    buffer[FRAME_BYTES - 1] = (uint8_t)sink;
    if (level > 1)
        deep(level - 1);
    else
        leaf_work();
    sink += buffer[0] + buffer[FRAME_BYTES - 1];
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    time_t end = time(NULL) + (time_t)seconds;
    while (time(NULL) < end)
        deep(LEVELS);
    return 0;
}
