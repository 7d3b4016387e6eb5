// Runs an ONNX model in onnxruntime-node (tests/peers/node_modules) for the interop tests.
//   node ort_run.js MODEL INPUTS.json OUTPUTS.json [OPT_MODEL OPT_DATA]
// INPUTS.json: {"name": {"dims": [..], "data": [..]}} (float32). Writes the outputs the same way.
// With OPT_MODEL: the session saves its optimized model there, with its initializers (over 1 KiB)
// in OPT_DATA beside it and the pre-packed weights saved as external initializers
// (session.save_external_prepacked_constant_initializers), as gguf_onnx.md §6 describes.
const fs = require('fs');
const path = require('path');
const ort = require(path.join(__dirname, 'node_modules', 'onnxruntime-node'));

async function main() {
  const [model, inputsPath, outputsPath, optModel, optData] = process.argv.slice(2);
  const opts = {executionProviders: ['cpu'], intraOpNumThreads: 1, interOpNumThreads: 1};
  if (optModel) {
    opts.optimizedModelFilePath = optModel;
    opts.graphOptimizationLevel = 'all';
    opts.extra = {session: {
      save_external_prepacked_constant_initializers: '1',
      optimized_model_external_initializers_file_name: optData,
      optimized_model_external_initializers_min_size_in_bytes: '1024',
    }};
  }
  const session = await ort.InferenceSession.create(model, opts);
  const spec = JSON.parse(fs.readFileSync(inputsPath, 'utf8'));
  const feeds = {};
  for (const [name, v] of Object.entries(spec))
    feeds[name] = new ort.Tensor('float32', Float32Array.from(v.data), v.dims);
  const out = await session.run(feeds);
  const res = {};
  for (const [name, t] of Object.entries(out))
    res[name] = {dims: Array.from(t.dims), type: t.type, data: Array.from(t.data, Number)};
  fs.writeFileSync(outputsPath, JSON.stringify(res));
  if (session.release) await session.release();
}
main().catch((e) => { console.error(String(e && e.stack || e)); process.exit(1); });
