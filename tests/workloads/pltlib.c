/*
 * pltlib: the callee of the PLT-stub test: a function so short that a good share of the
 * caller's time is spent in its PLT stub. Build: cc -O1 -g -shared -fPIC
 */
int plt_target(int x) { return x + 1; }
