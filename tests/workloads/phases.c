/*
 * phases: dlopen()s the libraries named on the command line one after another and burns a
 * fixed number of rounds in each (`burn` of burnlib.c), then in the first one again:
 * main -> run_phase -> burn -> libN_outer -> libN_inner. Usage: phases ROUNDS LIB1 LIB2 ...
 * Every library is opened first, then the program waits for one line on stdin (the test sends
 * it once the profiler is attached), then burns. The libraries stay open, so phases run in
 * libraries whose unwind tables the sampler may have evicted meanwhile.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls -ldl
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*burn_fn)(uint64_t);

__attribute__((noinline)) static void run_phase(burn_fn burn, uint64_t rounds) {
    burn(rounds);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: phases ROUNDS LIB...\n");
        return 2;
    }
    uint64_t rounds = strtoull(argv[1], NULL, 10);
    int libs = argc - 2;
    burn_fn burns[16] = {0};
    for (int i = 0; i < libs && i < 16; i++) {
        void *handle = dlopen(argv[2 + i], RTLD_NOW);
        if (!handle) {
            fprintf(stderr, "dlopen %s: %s\n", argv[2 + i], dlerror());
            return 1;
        }
        burns[i] = (burn_fn)dlsym(handle, "burn");
        if (!burns[i]) {
            fprintf(stderr, "no burn in %s\n", argv[2 + i]);
            return 1;
        }
    }
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    for (int phase = 0; phase <= libs && phase < 16; phase++) {
        int i = phase % libs;
        run_phase(burns[i], rounds);
        fprintf(stderr, "phase %d (library %d) done\n", phase, i + 1);
    }
    printf("{\"phases\": %d}\n", libs + 1);
    return 0;
}
