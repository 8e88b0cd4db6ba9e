// Bounded load: C concurrent streaming clients for D seconds against one server (openai client).
// Checks: no request lost or failed, every streamed text equals the one the same request gets
// alone (temperature 0), /health answers 200 throughout, and resident memory after the load
// returns near its value before (baseline taken after a warm-up). Prints the figures as JSON.
// usage: node load_test.mjs SPARROW MODEL_DIR TOKENIZER [--clients 64] [--seconds 20] [--rss-check 0]
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import OpenAI from "openai";
import { metric, parseArgs, startServer } from "./harness.mjs";

const args = parseArgs(process.argv.slice(2));
// --rss-check 0 leaves out the RSS bound (sanitizer builds: ASan's quarantine keeps freed blocks).
const opt = { clients: 64, seconds: 20, "rss-check": 1 };
for (let i = 0; i < args.rest.length; i += 2) opt[args.rest[i].replace(/^--/, "")] = Number(args.rest[i + 1]);

const srv = await startServer({ ...args, extra: ["--max-context", "512", "--max-batch", "64", "--max-queue", "1024"] });
const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "none", maxRetries: 0, timeout: 300000 });
const rss = () => {
  const m = fs.readFileSync(`/proc/${srv.proc.pid}/status`, "utf8").match(/VmRSS:\s+(\d+) kB/);
  return Number(m[1]) * 1024;
};
const prompts = ["The capital of France is", "The quick brown fox", "In the beginning there was", "a thing that the model",
  "jumps over the lazy dog.", "Paris", "encoded in bytes", "answers the user in the chat"];
const lengths = [8, 32, 64];
const jobs = prompts.flatMap((p) => lengths.map((n) => ({ messages: [{ role: "user", content: p }], max_tokens: n })));

// Reference texts, one request at a time (this is also the warm-up).
const want = [];
for (const j of jobs) want.push((await client.chat.completions.create({ model: "tiny", ...j, temperature: 0 })).choices[0].message.content);
await new Promise((r) => setTimeout(r, 500));
const rssBefore = rss();

let done = 0, errors = 0, corrupt = 0, started = 0, tokens = 0, healthBad = 0, healthChecks = 0;
const ttft = [];
const errorSamples = [];
const deadline = Date.now() + opt.seconds * 1000;
let peakRss = rssBefore;

async function worker(w) {
  let k = w;
  while (Date.now() < deadline) {
    const i = k++ % jobs.length;
    ++started;
    const t0 = performance.now();
    try {
      const stream = await client.chat.completions.create({ model: "tiny", ...jobs[i], temperature: 0, stream: true,
        stream_options: { include_usage: true } });
      let text = "", first = 0, usage = null, finish = null;
      for await (const c of stream) {
        if (c.usage) usage = c.usage;
        for (const ch of c.choices) {
          if (ch.delta?.content) {
            if (!first) first = performance.now();
            text += ch.delta.content;
          }
          if (ch.finish_reason) finish = ch.finish_reason;
        }
      }
      if (first) ttft.push((first - t0) / 1000);
      if (text !== want[i] || !usage || !finish) {
        ++corrupt;
        if (errorSamples.length < 5) errorSamples.push(`job ${i}: got ${JSON.stringify(text)} want ${JSON.stringify(want[i])}`);
      }
      tokens += usage?.completion_tokens ?? 0;
      ++done;
    } catch (e) {
      ++errors;
      if (errorSamples.length < 5) errorSamples.push(String(e));
    }
  }
}

const health = (async () => {
  while (Date.now() < deadline) {
    ++healthChecks;
    try {
      if ((await fetch(`${srv.base}/health`, { signal: AbortSignal.timeout(5000) })).status !== 200) ++healthBad;
    } catch { ++healthBad; }
    peakRss = Math.max(peakRss, rss());
    await new Promise((r) => setTimeout(r, 250));
  }
})();
const t0 = Date.now();
await Promise.all([...Array(opt.clients).keys()].map(worker).concat([health]));
const wall = (Date.now() - t0) / 1000;

// Idle again: nothing running, state freed; then memory.
for (let i = 0; i < 100 && ((await metric(srv.base, "sparrow_running_requests")) || (await metric(srv.base, "sparrow_queue_length"))); ++i)
  await new Promise((r) => setTimeout(r, 100));
await new Promise((r) => setTimeout(r, 1000));
const stateAfter = await metric(srv.base, "sparrow_decode_state_bytes");
const rssAfter = rss();
const finalHealth = (await fetch(`${srv.base}/health`)).status;
const exit = await srv.stop();

ttft.sort((a, b) => a - b);
const q = (p) => (ttft.length ? ttft[Math.min(ttft.length - 1, Math.floor(p * ttft.length))] : NaN);
const MiB = (b) => Math.round((b / 1048576) * 10) / 10;
const figures = {
  date: new Date().toISOString(), host: `${os.cpus().length} x ${os.cpus()[0]?.model ?? "?"}`, clients: opt.clients, seconds: opt.seconds,
  wall_s: wall, requests: started, completed: done, errors, corrupt, tokens_out: tokens, tokens_per_s: Math.round(tokens / wall),
  ttft_p50_s: q(0.5), ttft_p99_s: q(0.99), health_checks: healthChecks, health_failures: healthBad,
  rss_before_mib: MiB(rssBefore), rss_peak_mib: MiB(peakRss), rss_after_mib: MiB(rssAfter), decode_state_after: stateAfter,
  exit_code: exit.code,
};
console.log(JSON.stringify(figures, null, 1));
if (errorSamples.length) console.log("samples:\n" + errorSamples.join("\n"));
assert.equal(errors, 0, "requests failed");
assert.equal(corrupt, 0, "streams differ from the reference");
assert.equal(started, done, "requests lost");
assert.ok(done >= opt.clients, "fewer requests than clients completed");
assert.equal(healthBad, 0, "/health failed during the load");
assert.equal(finalHealth, 200);
assert.equal(stateAfter, 0, "decode state still reserved after the load");
// Near baseline: allocator caches may keep a little; 32 MiB or 25% over the baseline fails.
if (opt["rss-check"] !== 0)
  assert.ok(rssAfter <= Math.max(rssBefore * 1.25, rssBefore + 32 * 1048576), `RSS ${MiB(rssBefore)} MiB -> ${MiB(rssAfter)} MiB`);
else console.log("RSS bound not checked (--rss-check 0)");
assert.equal(exit.code, 0);
console.log("load test passed");
