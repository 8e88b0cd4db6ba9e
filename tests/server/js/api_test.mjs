// The server end to end with the official openai client: plain, streamed (== plain at
// temperature 0), concurrent, cancelled mid-stream, stop strings, completions, models, health,
// metrics; every error case (fetch); queue full (a second server with --max-queue 0); SIGTERM
// during a stream (the stream ends cleanly, exit status 0); admission and disconnects on servers
// of their own: a plain request whose client leaves is cancelled at once, a request beyond the
// engine's queue gets 503, a connection beyond --http-threads gets 503 at once while /health answers.
// usage: node api_test.mjs SPARROW MODEL_DIR TOKENIZER
import assert from "node:assert/strict";
import http from "node:http";
import OpenAI from "openai";
import { metric, parseArgs, startServer } from "./harness.mjs";

const args = parseArgs(process.argv.slice(2));
const results = [];
async function test(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push([name, true]);
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    results.push([name, false]);
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

const srv = await startServer({ ...args, extra: ["--max-context", "2048", "--max-batch", "16"] });
const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "none", maxRetries: 0, timeout: 120000 });
const MSG = [{ role: "system", content: "Be brief." }, { role: "user", content: "The capital of France is" }];

async function streamText(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    ++chunks;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta?.content) text += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, finish, usage, chunks };
}

let plain;
await test("chat plain", async () => {
  plain = await client.chat.completions.create({ model: "tiny", messages: MSG, max_tokens: 40, temperature: 0 });
  assert.equal(plain.object, "chat.completion");
  assert.equal(plain.choices.length, 1);
  assert.equal(plain.choices[0].message.role, "assistant");
  assert.equal(typeof plain.choices[0].message.content, "string");
  assert.ok(["length", "stop"].includes(plain.choices[0].finish_reason));
  assert.ok(plain.usage.prompt_tokens > 0);
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
  if (plain.choices[0].finish_reason === "length") assert.equal(plain.usage.completion_tokens, 40);
});

await test("chat streamed equals plain at temperature 0", async () => {
  const s = await streamText({ model: "tiny", messages: MSG, max_tokens: 40, temperature: 0 });
  assert.equal(s.text, plain.choices[0].message.content);
  assert.equal(s.finish, plain.choices[0].finish_reason);
  assert.deepEqual(s.usage, plain.usage);
});

await test("max_completion_tokens and seeded sampling are reproducible", async () => {
  const p = { model: "tiny", messages: MSG, max_completion_tokens: 12, temperature: 1.0, top_p: 0.9, top_k: 20, seed: 7 };
  const a = await client.chat.completions.create(p);
  const b = await client.chat.completions.create(p);
  assert.equal(a.usage.completion_tokens <= 12, true);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

await test("concurrent requests get the same tokens as alone", async () => {
  const prompts = ["Paris", "The quick brown fox", "In the beginning", "a b c d e f g", "token token", "chat", "x", "The model thinks"];
  const alone = [];
  for (const p of prompts)
    alone.push((await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: p }], max_tokens: 24, temperature: 0 })).choices[0].message.content);
  const together = await Promise.all(prompts.flatMap((p, i) => [0, 1].map(async (k) => {
    const params = { model: "tiny", messages: [{ role: "user", content: p }], max_tokens: 24, temperature: 0 };
    const text = k ? (await streamText(params)).text : (await client.chat.completions.create(params)).choices[0].message.content;
    return [i, text];
  })));
  for (const [i, text] of together) assert.equal(text, alone[i], `prompt ${i}`);
});

await test("stop strings cut plain and streamed text at the same place", async () => {
  const full = plain.choices[0].message.content;
  assert.ok(full.length > 8, "need some text");
  const stop = full.slice(5, 8);
  const cut = full.slice(0, full.indexOf(stop));
  const p = { model: "tiny", messages: MSG, max_tokens: 40, temperature: 0, stop: [stop, "\u0000never"] };
  const a = await client.chat.completions.create(p);
  assert.equal(a.choices[0].message.content, cut);
  assert.equal(a.choices[0].finish_reason, "stop");
  const s = await streamText(p);
  assert.equal(s.text, cut);
  assert.equal(s.finish, "stop");
});

await test("cancelled mid-stream frees the request", async () => {
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    { model: "tiny", messages: MSG, max_tokens: 450, temperature: 0, stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of stream) {
      if (++n === 3) ac.abort();
    }
  } catch (e) {
    assert.ok(e.name === "AbortError" || /abort/i.test(String(e)), String(e));
  }
  const t0 = Date.now();
  while ((await metric(srv.base, "sparrow_running_requests")) !== 0 || (await metric(srv.base, "sparrow_queue_length")) !== 0) {
    assert.ok(Date.now() - t0 < 10000, "the cancelled request is still running after 10 s");
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok((await metric(srv.base, "sparrow_http_streams_aborted_total")) >= 1);
  assert.equal(await metric(srv.base, "sparrow_decode_state_bytes"), 0);
});

await test("thinking mode: reasoning_content, plain == streamed", async () => {
  const p = { model: "tiny", messages: MSG, max_tokens: 30, temperature: 0, thinking: true };
  const a = await client.chat.completions.create(p);
  const m = a.choices[0].message;
  assert.ok((m.reasoning_content ?? "").length + (m.content ?? "").length > 0);
  const stream = await client.chat.completions.create({ ...p, stream: true });
  let reasoning = "", content = "";
  for await (const c of stream) {
    reasoning += c.choices[0]?.delta?.reasoning_content ?? "";
    content += c.choices[0]?.delta?.content ?? "";
  }
  assert.equal(reasoning, m.reasoning_content ?? "");
  assert.equal(content, m.content ?? "");
});

await test("tools, tool calls and tool results in the input are rendered", async () => {
  const tools = [{ type: "function", function: { name: "get_weather", description: "Weather", parameters: { type: "object",
    properties: { city: { type: "string" } }, required: ["city"] } } }];
  const messages = [{ role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
    { role: "tool", tool_call_id: "call_1", content: "sunny" }];
  const a = await client.chat.completions.create({ model: "tiny", messages, tools, max_tokens: 8, temperature: 0 });
  assert.ok(a.usage.prompt_tokens > 20);
  assert.ok(["stop", "length", "tool_calls"].includes(a.choices[0].finish_reason));
});

await test("completions: text and token-id prompts, plain and streamed", async () => {
  const a = await client.completions.create({ model: "tiny", prompt: "The capital of France is", max_tokens: 16, temperature: 0 });
  assert.equal(a.object, "text_completion");
  const s = await client.completions.create({ model: "tiny", prompt: "The capital of France is", max_tokens: 16, temperature: 0, stream: true });
  let text = "";
  for await (const c of s) text += c.choices[0]?.text ?? "";
  assert.equal(text, a.choices[0].text);
  const ids = await client.completions.create({ model: "tiny", prompt: [0, 5, 9, 17], max_tokens: 8, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 4);
  assert.equal(ids.usage.completion_tokens <= 8, true);
});

await test("models, health, metrics", async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["tiny"]);
  assert.equal((await fetch(`${srv.base}/health`)).status, 200);
  const m = await (await fetch(`${srv.base}/metrics`)).text();
  for (const name of ["sparrow_queue_length", "sparrow_running_requests", "sparrow_prompt_tokens_total", "sparrow_generation_tokens_total",
    "sparrow_time_to_first_token_seconds_bucket", "sparrow_inter_token_latency_seconds_bucket", "sparrow_resident_memory_bytes"])
    assert.ok(m.includes(name), name);
  assert.ok((await metric(srv.base, "sparrow_time_to_first_token_seconds_count")) > 0);
});

// Error cases: [name, route, raw body, status, param]
const long = "The capital of France is Paris. ".repeat(400);
const user = [{ role: "user", content: "hi" }];
const J = (o) => JSON.stringify(o);
const errors = [
  ["malformed JSON", "chat/completions", '{"messages": [', 400, null],
  ["body not an object", "chat/completions", "[1,2]", 400, null],
  ["missing messages", "chat/completions", J({ model: "tiny" }), 400, "messages"],
  ["messages wrong type", "chat/completions", J({ messages: "hi" }), 400, "messages"],
  ["empty messages", "chat/completions", J({ messages: [] }), 400, "messages"],
  ["message without role", "chat/completions", J({ messages: [{ content: "hi" }] }), 400, "messages[0].role"],
  ["unknown role", "chat/completions", J({ messages: [{ role: "wizard", content: "hi" }] }), 400, "messages[0].role"],
  ["content wrong type", "chat/completions", J({ messages: [{ role: "user", content: 5 }] }), 400, "messages[0].content"],
  ["negative max_tokens", "chat/completions", J({ messages: user, max_tokens: -1 }), 400, "max_tokens"],
  ["zero max_tokens", "chat/completions", J({ messages: user, max_tokens: 0 }), 400, "max_tokens"],
  ["absurd max_tokens", "chat/completions", J({ messages: user, max_tokens: 1e12 }), 400, "max_tokens"],
  ["max_tokens wrong type", "chat/completions", J({ messages: user, max_tokens: "10" }), 400, "max_tokens"],
  ["max_completion_tokens absurd", "chat/completions", J({ messages: user, max_completion_tokens: 100000 }), 400, "max_completion_tokens"],
  ["temperature wrong type", "chat/completions", J({ messages: user, temperature: "hot" }), 400, "temperature"],
  ["temperature out of range", "chat/completions", J({ messages: user, temperature: -1 }), 400, "temperature"],
  ["top_p out of range", "chat/completions", J({ messages: user, top_p: 0 }), 400, "top_p"],
  ["top_k wrong type", "chat/completions", J({ messages: user, top_k: 1.5 }), 400, "top_k"],
  ["seed wrong type", "chat/completions", J({ messages: user, seed: "x" }), 400, "seed"],
  ["stream wrong type", "chat/completions", J({ messages: user, stream: "yes" }), 400, "stream"],
  ["stop wrong type", "chat/completions", J({ messages: user, stop: 5 }), 400, "stop"],
  ["n=2", "chat/completions", J({ messages: user, n: 2 }), 400, "n"],
  ["ignore_eos wrong type", "chat/completions", J({ messages: user, ignore_eos: 1 }), 400, "ignore_eos"],
  ["prompt longer than the context", "chat/completions", J({ messages: [{ role: "user", content: long }], max_tokens: 4 }), 400, "messages"],
  ["unknown model", "chat/completions", J({ model: "gpt-4", messages: user }), 404, "model"],
  ["invalid UTF-8", "chat/completions", Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"a'), Buffer.from([0xff, 0xc3]), Buffer.from('"}]}')]), 400, null],
  ["lone surrogate", "chat/completions", '{"messages":[{"role":"user","content":"a\\ud800b"}]}', 400, null],
  ["completions missing prompt", "completions", J({ max_tokens: 3 }), 400, "prompt"],
  ["completions prompt wrong type", "completions", J({ prompt: { a: 1 } }), 400, "prompt"],
  ["completions id outside the vocabulary", "completions", J({ prompt: [1, 100000] }), 400, "prompt"],
  ["completions prompt too long", "completions", J({ prompt: long, max_tokens: 2 }), 400, "prompt"],
  ["completions unknown model", "completions", J({ model: "nope", prompt: "hi" }), 404, "model"],
];
for (const [name, route, body, status, param] of errors) {
  await test(`error: ${name} -> ${status}`, async () => {
    const r = await fetch(`${srv.base}/v1/${route}`, { method: "POST", headers: { "content-type": "application/json" }, body });
    assert.equal(r.status, status);
    const j = await r.json();
    assert.equal(typeof j.error.message, "string");
    assert.equal(typeof j.error.type, "string");
    assert.ok("param" in j.error && "code" in j.error);
    assert.equal(j.error.param, param, j.error.message);
  });
}
await test("error: unknown route -> 404 in OpenAI shape", async () => {
  const r = await fetch(`${srv.base}/v1/nothing`);
  assert.equal(r.status, 404);
  assert.equal(typeof (await r.json()).error.message, "string");
});
await test("error: the openai client sees BadRequestError / NotFoundError", async () => {
  await assert.rejects(client.chat.completions.create({ model: "tiny", messages: user, max_tokens: -5 }), OpenAI.BadRequestError);
  await assert.rejects(client.chat.completions.create({ model: "other", messages: user }), OpenAI.NotFoundError);
});
await test("server healthy after the errors", async () => {
  const a = await client.chat.completions.create({ model: "tiny", messages: MSG, max_tokens: 40, temperature: 0 });
  assert.equal(a.choices[0].message.content, plain.choices[0].message.content);
});

await test("a plain request longer than a heartbeat is sent chunked, parses, equals the stream", async () => {
  // ignore_eos: the tiny model ends most replies within ~50 tokens; 1500 take ~1 s on 2 cores.
  const p = { model: "tiny", prompt: [0, 5, 9, 17], max_tokens: 1500, temperature: 0, ignore_eos: true };
  const raw = await fetch(`${srv.base}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: J(p) });
  assert.equal(raw.status, 200);
  assert.equal(raw.headers.get("transfer-encoding"), "chunked");
  const body = await raw.text();
  assert.ok(/^ +\{/.test(body), "heartbeat spaces before the JSON");
  const a = await client.completions.create(p);
  assert.equal(a.usage.completion_tokens, 1500);
  assert.equal(a.choices[0].finish_reason, "length");
  assert.equal(JSON.parse(body).choices[0].text, a.choices[0].text);
  const s = await client.completions.create({ ...p, stream: true });
  let text = "";
  for await (const c of s) text += c.choices[0]?.text ?? "";
  assert.equal(text, a.choices[0].text);
  const c = await client.chat.completions.create({ model: "tiny", messages: MSG, max_tokens: 1500, temperature: 0, ignore_eos: true });
  assert.equal(c.usage.completion_tokens, 1500);
  assert.equal(c.choices[0].message.role, "assistant");
});

await test("SIGTERM during a stream: the stream ends with [DONE], exit status 0", async () => {
  const r = await fetch(`${srv.base}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" },
    body: J({ model: "tiny", messages: MSG, max_tokens: 450, temperature: 0, stream: true }) });
  const reader = r.body.getReader();
  let text = "";
  text += new TextDecoder().decode((await reader.read()).value);
  const stopped = srv.stop();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += new TextDecoder().decode(value);
  }
  const { code, signal } = await stopped;
  assert.equal(signal, null);
  assert.equal(code, 0);
  assert.ok(text.includes("data: [DONE]"), "no [DONE]");
  assert.ok(/"finish_reason":"(abort|length)"/.test(text), "no finish_reason");
});

await test("queue full -> 503", async () => {
  const full = await startServer({ ...args, extra: ["--max-queue", "0"] });
  try {
    const r = await fetch(`${full.base}/v1/chat/completions`, { method: "POST", body: J({ messages: user, max_tokens: 2 }) });
    assert.equal(r.status, 503);
    assert.equal(typeof (await r.json()).error.message, "string");
  } finally {
    assert.equal((await full.stop()).code, 0);
  }
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Polls `cond` every 50 ms; fails naming `what` after `ms`.
async function waitFor(cond, ms, what) {
  const t0 = Date.now();
  while (!(await cond())) {
    assert.ok(Date.now() - t0 < ms, `${what} (after ${ms} ms)`);
    await sleep(50);
  }
  return Date.now() - t0;
}
const idle = async (base) => (await metric(base, "sparrow_running_requests")) === 0 && (await metric(base, "sparrow_queue_length")) === 0;
// A request that runs for tens of seconds unless cancelled (30000 tokens at ~2000 tokens/s or less).
const LONG = { model: "tiny", prompt: [0, 5, 9, 17], max_tokens: 30000, temperature: 0, ignore_eos: true };
const post = (base, route, body, init = {}) =>
  fetch(`${base}/v1/${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: J(body), ...init });

await test("a plain request whose client disconnects is cancelled and its state freed at once", async () => {
  const s = await startServer({ ...args, extra: ["--max-context", "32768"] });
  try {
    // Left during the first heartbeat interval (no byte sent yet), then after the headers arrived.
    for (const phase of ["before the headers", "after the headers"]) {
      const aborted = (await metric(s.base, "sparrow_http_plain_aborted_total")) ?? NaN;
      const req = http.request({ host: "127.0.0.1", port: s.port, method: "POST", path: "/v1/completions", agent: false,
        headers: { "content-type": "application/json" } });
      req.on("error", () => {});
      const headers = new Promise((resolve) => req.on("response", (res) => {
        res.on("data", () => {});
        res.on("error", () => {});
        resolve(res);
      }));
      req.end(J(LONG));
      if (phase === "after the headers") assert.equal((await headers).statusCode, 200);
      await waitFor(async () => (await metric(s.base, "sparrow_running_requests")) === 1, 5000, "the request did not start");
      req.destroy();
      const ms = await waitFor(() => idle(s.base), 3000, `${phase}: the request still runs after its client left`);
      assert.equal(await metric(s.base, "sparrow_decode_state_bytes"), 0);
      assert.equal(await metric(s.base, "sparrow_http_plain_aborted_total"), aborted + 1);
      console.log(`     ${phase}: cancelled ${ms} ms after the disconnect`);
    }
    const ok = await post(s.base, "completions", { ...LONG, max_tokens: 4 });
    assert.equal(ok.status, 200);
    assert.equal((await ok.json()).usage.completion_tokens, 4);
  } finally {
    const { code, signal } = await s.stop();
    assert.equal(signal, null);
    assert.equal(code, 0);
  }
});

await test("a request beyond the engine's queue gets 503 (default HTTP workers); the server stays healthy", async () => {
  const s = await startServer({ ...args, extra: ["--max-context", "32768", "--max-batch", "1", "--max-queue", "1"] });
  const streams = [new AbortController(), new AbortController()];
  try {
    for (const [i, ac] of streams.entries()) {
      const r = await post(s.base, "completions", { ...LONG, stream: true }, { signal: ac.signal });
      assert.equal(r.status, 200);
      r.body.getReader().read().catch(() => {});
      const want = i === 0 ? "sparrow_running_requests" : "sparrow_queue_length";
      await waitFor(async () => (await metric(s.base, want)) === 1, 5000, `stream ${i} not ${want}`);
    }
    const r = await post(s.base, "chat/completions", { model: "tiny", messages: user, max_tokens: 4 }, { signal: AbortSignal.timeout(5000) });
    assert.equal(r.status, 503);
    const j = await r.json();
    assert.equal(j.error.code, "unavailable");
    assert.match(j.error.message, /queue is full/);
    assert.equal((await fetch(`${s.base}/health`, { signal: AbortSignal.timeout(5000) })).status, 200);
    for (const ac of streams) ac.abort();
    await waitFor(() => idle(s.base), 3000, "the aborted streams still run");
    assert.equal(await metric(s.base, "sparrow_decode_state_bytes"), 0);
    const ok = await post(s.base, "chat/completions", { model: "tiny", messages: user, max_tokens: 4, temperature: 0 });
    assert.equal(ok.status, 200);
  } finally {
    for (const ac of streams) ac.abort();
    assert.equal((await s.stop()).code, 0);
  }
});

await test("a connection beyond --http-threads gets 503 at once; /health still answers", async () => {
  const s = await startServer({ ...args, extra: ["--max-context", "32768", "--http-threads", "1"] });
  const ac = new AbortController();
  try {
    // The worker counts as busy until it has closed the previous connection (startServer's probe),
    // a moment after that client has its answer: the first request may still be refused.
    let stream;
    await waitFor(async () => {
      stream = await post(s.base, "completions", { ...LONG, stream: true }, { signal: ac.signal });
      if (stream.status !== 200) await stream.text();
      return stream.status === 200;
    }, 3000, "the stream was refused");
    await stream.body.getReader().read();  // the stream now holds the only worker
    const refused = await metric(s.base, "sparrow_http_refused_total");
    const t0 = Date.now();
    const r = await post(s.base, "chat/completions", { model: "tiny", messages: user, max_tokens: 4 }, { signal: AbortSignal.timeout(5000) });
    assert.equal(r.status, 503);
    assert.ok(Date.now() - t0 < 2000, `503 after ${Date.now() - t0} ms`);
    assert.equal(r.headers.get("connection"), "close");
    const j = await r.json();
    assert.equal(j.error.code, "unavailable");
    assert.equal(typeof j.error.message, "string");
    assert.equal((await fetch(`${s.base}/health`, { signal: AbortSignal.timeout(5000) })).status, 200);
    assert.equal(await metric(s.base, "sparrow_http_refused_total"), refused + 1);
    assert.equal(await metric(s.base, "sparrow_running_requests"), 1, "the stream kept running");
    ac.abort();
    await waitFor(() => idle(s.base), 3000, "the aborted stream still runs");
    // The worker is free again once the stream's connection is closed.
    let status = 0;
    await waitFor(async () => {
      status = (await post(s.base, "chat/completions", { model: "tiny", messages: user, max_tokens: 4, temperature: 0 })).status;
      return status === 200;
    }, 3000, `requests still refused (${status}) after the stream ended`);
  } finally {
    ac.abort();
    assert.equal((await s.stop()).code, 0);
  }
});

const failed = results.filter(([, ok]) => !ok);
console.log(`\n${results.length - failed.length} passed, ${failed.length} failed`);
if (srv.proc.exitCode === null) await srv.stop();
process.exit(failed.length ? 1 : 0);
