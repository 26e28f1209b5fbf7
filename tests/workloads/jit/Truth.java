// Truth.java: a Java CPU burner with a known split, for checking JIT frames named from the
// JVM's perf map (`jcmd PID Compiler.perfmap`, JDK 17 on) against the truth.
//
//     outerCaller -> hotAlpha   (about 30% of the cycle)
//                 -> hotBeta    (about 70%)
//
// Each cycle (about 1 ms) burns a chunk in hotAlpha, then one in hotBeta; chunk lengths are
// jittered (+-75%) so the cycle cannot alias with a sampling period. The truth is measured:
// each function adds the time of its own busy loop to its total. Run with
// `-XX:+PreserveFramePointer` (compiled code then keeps frame pointers, so stacks can be walked
// through it, as perf needs too) and `-XX:CompileCommand=dontinline,Truth::hot*` (an inlined
// function has no code of its own to be named). Usage: java Truth SECONDS. Prints
// {"ready":true,"pid":N} at start and, at the end (or on SIGTERM), each function's share.
public class Truth {
    static long alphaNanos;
    static long betaNanos;

    static int hotAlpha(int n) {
        long start = System.nanoTime();
        int acc = 0;
        for (int i = 0; i < n; i++) acc = (acc * 31 + i) & 0xffff;
        alphaNanos += System.nanoTime() - start;
        return acc;
    }

    static int hotBeta(int n) {
        long start = System.nanoTime();
        int acc = 0;
        for (int i = 0; i < n; i++) acc = (acc * 31 + i) & 0xffff;
        betaNanos += System.nanoTime() - start;
        return acc;
    }

    static int outerCaller(int unit, java.util.Random rng) {
        return hotAlpha((int) (3 * unit * (0.25 + 1.5 * rng.nextDouble())))
            + hotBeta((int) (7 * unit * (0.25 + 1.5 * rng.nextDouble())));
    }

    static int calibrate() {
        int n = 20_000_000;
        long start = System.nanoTime();
        int acc = 0;
        for (int i = 0; i < n; i++) acc = (acc * 31 + i) & 0xffff;
        long spent = Math.max(System.nanoTime() - start, 1) + (acc & 1);
        return (int) Math.max(1, n * 100_000L / spent); // iterations in about 100 us
    }

    public static void main(String[] args) {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 10;
        System.out.println("{\"ready\":true,\"pid\":" + ProcessHandle.current().pid() + "}");
        System.out.flush();
        int unit = calibrate();
        java.util.Random rng = new java.util.Random(0x5EED);
        long deadline = System.nanoTime() + (long) (seconds * 1e9);
        // On SIGTERM too: the split so far.
        Runtime.getRuntime().addShutdownHook(new Thread(Truth::report));
        int sink = 0;
        while (System.nanoTime() < deadline) {
            sink += outerCaller(unit, rng);
        }
        System.exit(sink & 0);
    }

    static void report() {
        double total = Math.max(alphaNanos + betaNanos, 1);
        System.out.println(String.format(java.util.Locale.ROOT,
            "{\"alpha\":%.4f,\"beta\":%.4f}", alphaNanos / total, betaNanos / total));
        System.out.flush();
    }
}
