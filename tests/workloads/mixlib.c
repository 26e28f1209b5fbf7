/*
 * mixlib: the frame-pointer half of the mixed-stack test: lib_entry -> lib_mid -> the caller's
 * callback. Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls
 * -shared -fPIC
 */
typedef void (*callback)(void);

static volatile int sink;

__attribute__((noinline)) void lib_mid(callback cb) {
    cb();
    sink++;
}

__attribute__((noinline)) void lib_entry(callback cb) {
    lib_mid(cb);
    sink++;
}
