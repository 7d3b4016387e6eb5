// Session start and memory of one onnxruntime process (bench/onnx_session.py runs 4 at once).
//   node ort_bench.js MODEL HOLD_MS  -> one JSON line: create_ms, run_ms, rss_kb, pss_kb
const fs = require('fs');
const path = require('path');
const ort = require(path.join(__dirname, 'node_modules', 'onnxruntime-node'));

function smaps() {
  const r = {};
  for (const line of fs.readFileSync('/proc/self/smaps_rollup', 'utf8').split('\n')) {
    const m = line.match(/^(Rss|Pss):\s+(\d+) kB/);
    if (m) r[m[1].toLowerCase() + '_kb'] = Number(m[2]);
  }
  return r;
}

async function main() {
  const [model, hold] = process.argv.slice(2);
  const t0 = process.hrtime.bigint();
  const s = await ort.InferenceSession.create(model, {executionProviders: ['cpu'],
                                                      intraOpNumThreads: 1});
  const t1 = process.hrtime.bigint();
  const name = s.inputNames[0];
  const n = Number(process.env.BENCH_N || 2816);
  await s.run({[name]: new ort.Tensor('float32', new Float32Array(n), [1, n])});
  const t2 = process.hrtime.bigint();
  await new Promise((r) => setTimeout(r, Number(hold || 0)));  // the others load meanwhile
  const mem = smaps();
  console.log(JSON.stringify({create_ms: Number(t1 - t0) / 1e6, run_ms: Number(t2 - t1) / 1e6, ...mem}));
}
main().catch((e) => { console.error(String(e && e.stack || e)); process.exit(1); });
