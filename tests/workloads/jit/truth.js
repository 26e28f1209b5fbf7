// truth.js: a JavaScript CPU burner with a known split, for checking JIT frames named from
// Node's perf map (`node --perf-basic-prof`) against the truth.
//
//     outerCaller -> hotAlpha   (about 30% of the cycle)
//                 -> hotBeta    (about 70%)
//
// Each cycle (about 1 ms) burns a chunk in hotAlpha, then one in hotBeta; chunk lengths are
// jittered (+-75%) so the cycle cannot alias with a sampling period. The truth is measured:
// each function adds the time of its own busy loop to its total. Run with `--no-turbo-inlining`
// so the optimizing compiler keeps each function's code its own (inlined, a function has no
// frame and no perf map line of its own: what any profiler then shows is its caller).
// Usage: node --perf-basic-prof --no-turbo-inlining truth.js SECONDS. Prints
// {"ready":true,"pid":N} at start and, at the end (or on SIGTERM), each function's share.
"use strict";

const totals = { alpha: 0, beta: 0 };
let stop = false;
process.on("SIGTERM", () => { stop = true; });

function hotAlpha(n) {
  const start = process.hrtime.bigint();
  let acc = 0;
  for (let i = 0; i < n; i++) acc = (acc * 31 + i) & 0xffff;
  totals.alpha += Number(process.hrtime.bigint() - start);
  return acc;
}

function hotBeta(n) {
  const start = process.hrtime.bigint();
  let acc = 0;
  for (let i = 0; i < n; i++) acc = (acc * 31 + i) & 0xffff;
  totals.beta += Number(process.hrtime.bigint() - start);
  return acc;
}

// A small deterministic generator, so that runs are alike.
let seed = 0x5eed;
function random() {
  seed = (seed * 1103515245 + 12345) & 0x7fffffff;
  return seed / 0x7fffffff;
}

function outerCaller(unit) {
  return hotAlpha(Math.floor(3 * unit * (0.25 + 1.5 * random()))) +
    hotBeta(Math.floor(7 * unit * (0.25 + 1.5 * random())));
}

function calibrate() {
  const n = 2000000;
  const start = process.hrtime.bigint();
  let acc = 0;
  for (let i = 0; i < n; i++) acc = (acc * 31 + i) & 0xffff;
  const spent = Math.max(Number(process.hrtime.bigint() - start), 1);
  return Math.max(1, Math.floor(n * 100000 / spent)); // iterations in about 100 us
}

const seconds = Number(process.argv[2] || 10);
console.log(JSON.stringify({ ready: true, pid: process.pid }));
const unit = calibrate();
const deadline = Date.now() + seconds * 1000;
let cycles = 0;
let sink = 0;
function chunk() {
  // Runs in slices so that SIGTERM's handler gets its turn.
  const sliceEnd = Date.now() + 200;
  while (Date.now() < sliceEnd) {
    sink += outerCaller(unit);
    cycles++;
  }
  if (!stop && Date.now() < deadline) {
    setImmediate(chunk);
    return;
  }
  const total = Math.max(totals.alpha + totals.beta, 1);
  console.log(JSON.stringify({
    alpha: Math.round(10000 * totals.alpha / total) / 10000,
    beta: Math.round(10000 * totals.beta / total) / 10000,
    cycles,
    sink: sink & 1,
  }));
}
chunk();
