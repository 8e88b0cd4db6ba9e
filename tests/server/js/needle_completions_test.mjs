// The needle prompts through the server: `sparrow needle -v --dump-prompts` gives each prompt and
// the three greedy tokens Sparrow's own loop produced; POST /v1/completions with the prompt text
// (the byte tokenizer maps it back to the same ids, <bos> added by the tokenizer config) at
// temperature 0 and max_tokens 3 must return the same three characters.
// usage: node needle_completions_test.mjs SPARROW MODEL_DIR (a byte-vocabulary model with tokenizer)
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startServer } from "./harness.mjs";

const [sparrow, model] = process.argv.slice(2);
if (!sparrow || !model) throw new Error("usage: SPARROW MODEL_DIR");
const dump = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "needle-")), "prompts.jsonl");
// -v prints each trial's tokens on stderr: keep stderr, drop the table on stdout.
const verbose = execFileSync("sh", ["-c", '"$0" needle --model "$1" --lengths 256,1k --trials 3 -v --dump-prompts "$2" 2>&1 >/dev/null',
  sparrow, model, dump], { encoding: "utf8" });
const got = new Map();
for (const m of verbose.matchAll(/length (\d+) trial (\d+) key (\S) answer (\d{3}) got (.{3}) /g))
  got.set(`${m[1]}/${m[2]}`, m[5]);
const prompts = fs.readFileSync(dump, "utf8").trim().split("\n").map((l) => JSON.parse(l));
assert.equal(prompts.length, 6);
assert.equal(got.size, 6, `could not parse sparrow needle -v output:\n${verbose}`);

const srv = await startServer({ sparrow, model, tokenizer: model, extra: ["--max-context", "2048"] });
let failures = 0;
try {
  for (const p of prompts) {
    assert.equal(p.ids[0], 256, "prompts start with <bos>");
    const text = Buffer.from(p.ids.slice(1, p.prompt_len)).toString("latin1");
    const r = await fetch(`${srv.base}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", prompt: text, max_tokens: 3, temperature: 0 }),
    });
    const body = await r.json();
    const want = got.get(`${p.length}/${p.trial}`);
    const ok = r.status === 200 && body.choices?.[0]?.text === want && body.usage?.prompt_tokens === p.prompt_len;
    console.log(`${ok ? "ok  " : "FAIL"} length ${p.length} trial ${p.trial}: server "${body.choices?.[0]?.text}" ` +
      `sparrow needle "${want}" answer ${p.answer} prompt_tokens ${body.usage?.prompt_tokens}/${p.prompt_len}`);
    if (!ok) ++failures;
  }
} finally {
  const { code } = await srv.stop();
  assert.equal(code, 0, "server exit status");
}
if (failures) process.exit(1);
console.log("needle prompts through /v1/completions: all match");
