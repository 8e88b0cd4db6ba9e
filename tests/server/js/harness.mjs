// Starts `sparrow serve` on 127.0.0.1 with a free port and waits for /health; stops it with
// SIGTERM and reports the exit status. Used by api_test.mjs and load_test.mjs.
import { spawn } from "node:child_process";
import net from "node:net";

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// args: { sparrow, model, tokenizer, extra: [] }
export async function startServer({ sparrow, model, tokenizer, extra = [] }) {
  const port = await freePort();
  const argv = ["serve", "--model", model, "--tokenizer", tokenizer, "--host", "127.0.0.1", "--port", String(port),
    "--served-model-name", "tiny", ...extra];
  const proc = spawn(sparrow, argv, { stdio: ["ignore", "inherit", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; process.stderr.write(d); });
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  const base = `http://127.0.0.1:${port}`;
  const t0 = Date.now();
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`sparrow serve exited early (${proc.exitCode}): ${stderr}`);
    try {
      const r = await fetch(`${base}/health`, { headers: { connection: "close" } });
      if (r.ok) break;
    } catch {}
    if (Date.now() - t0 > 60000) throw new Error("sparrow serve did not become healthy in 60 s");
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    base, port, proc,
    // SIGTERM, then the exit status (code 0 expected).
    async stop(timeoutMs = 30000) {
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
      const r = await exited;
      clearTimeout(t);
      return r;
    },
  };
}

// Probes close their connection: an idle keep-alive connection would hold one of the server's
// HTTP workers for its keep-alive timeout (tests with --http-threads 1 count them).
export async function metric(base, name) {
  const text = await (await fetch(`${base}/metrics`, { headers: { connection: "close" }, signal: AbortSignal.timeout(10000) })).text();
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return line === undefined ? undefined : Number(line.split(" ")[1]);
}

export function parseArgs(argv) {
  const [sparrow, model, tokenizer, ...rest] = argv;
  if (!sparrow || !model || !tokenizer) throw new Error("usage: SPARROW MODEL_DIR TOKENIZER [options]");
  return { sparrow, model, tokenizer, rest };
}
