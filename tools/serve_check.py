#!/usr/bin/env python3
"""`sparrow serve` end to end on a byte-vocabulary needle model, with any backend (stdlib only).

1. `sparrow needle -v --dump-prompts` on the CPU backend gives each needle prompt and the three
   greedy tokens of Sparrow's own loop (the reference).
2. With `--backend B` other than cpu, `sparrow needle --backend B -v` must produce the same tokens.
3. `sparrow serve --backend B` on a free port: every prompt through POST /v1/completions at
   temperature 0 and max_tokens 3 must return the reference text, plain and streamed (SSE), and
   again with all prompts sent at once (continuous batching); usage.prompt_tokens must be the
   prompt's length. SIGTERM must end the server with exit status 0.

Runs in CI with the CPU backend (`serve_check_cpu`) and on the GPU machine from
scripts/gpu-check.sh with `--backend cuda`. Prints one line per check; exit status 0 when all
pass.

usage: serve_check.py SPARROW MODEL_DIR [--backend cpu|cuda] [--precision fp32|fast|...]
                      [--lengths 256,1k] [--trials 3]
"""
import argparse
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

LINE = re.compile(r"length (\d+) trial (\d+) key (\S) answer (\d{3}) got (.{3}) ")


def needle_tokens(sparrow, model, backend, lengths, trials, precision, dump=None):
    cmd = [sparrow, "needle", "--model", model, "--backend", backend, "--lengths", lengths,
           "--trials", str(trials), "--precision", precision, "-v"]
    if dump:
        cmd += ["--dump-prompts", dump]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    got = {(int(m[1]), int(m[2])): m[5] for m in LINE.finditer(r.stderr)}
    if not got:
        raise RuntimeError(f"no trial lines in sparrow needle -v output:\n{r.stderr[-2000:]}")
    return got


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base, body, timeout=300):
    req = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def complete_plain(base, text):
    status, raw = post(base, dict(model="needle", prompt=text, max_tokens=3, temperature=0))
    body = json.loads(raw)
    return status, body["choices"][0]["text"], body["usage"]["prompt_tokens"]


def complete_stream(base, text):
    status, raw = post(base, dict(model="needle", prompt=text, max_tokens=3, temperature=0, stream=True,
                                  stream_options=dict(include_usage=True)))
    out, usage, done = "", None, False
    for line in raw.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        for ch in chunk.get("choices", []):
            out += ch.get("text", "")
        if chunk.get("usage"):
            usage = chunk["usage"]["prompt_tokens"]
    return (status if done else -1), out, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sparrow")
    ap.add_argument("model")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--lengths", default="256,1k")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--precision", default="fp32", help="passed to sparrow needle and sparrow serve")
    a = ap.parse_args()

    failures = 0

    def check(name, ok, detail=""):
        nonlocal failures
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        failures += 0 if ok else 1

    tmp = tempfile.mkdtemp(prefix="serve-check-")
    dump = os.path.join(tmp, "prompts.jsonl")
    want = needle_tokens(a.sparrow, a.model, "cpu", a.lengths, a.trials, a.precision, dump)
    prompts = [json.loads(line) for line in open(dump)]
    check("reference prompts", len(prompts) == len(want) and len(prompts) > 0, f"{len(prompts)} prompts")
    if a.backend != "cpu":
        got = needle_tokens(a.sparrow, a.model, a.backend, a.lengths, a.trials, a.precision)
        diff = [k for k in want if got.get(k) != want[k]]
        check(f"sparrow needle --backend {a.backend} == cpu", not diff, f"{len(want) - len(diff)}/{len(want)} equal")

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(tmp, "serve.log"), "w")
    proc = subprocess.Popen([a.sparrow, "serve", "--model", a.model, "--backend", a.backend, "--host", "127.0.0.1",
                             "--port", str(port), "--served-model-name", "needle", "--max-context", "16384",
                             "--precision", a.precision],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.time()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sparrow serve exited early ({proc.returncode}): "
                                   f"{open(os.path.join(tmp, 'serve.log')).read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.time() - t0 > 120:
                raise RuntimeError("sparrow serve did not become healthy in 120 s")
            time.sleep(0.1)

        def text_of(p):
            assert p["ids"][0] == 256, "needle prompts start with <bos>"
            return bytes(p["ids"][1:p["prompt_len"]]).decode("latin-1")

        for p in prompts:
            key = (p["length"], p["trial"])
            status, text, used = complete_plain(base, text_of(p))
            check(f"plain L={key[0]} t={key[1]}", status == 200 and text == want[key] and used == p["prompt_len"],
                  f"server {text!r} reference {want[key]!r} prompt_tokens {used}/{p['prompt_len']}")
            status, text, used = complete_stream(base, text_of(p))
            check(f"stream L={key[0]} t={key[1]}", status == 200 and text == want[key] and used == p["prompt_len"],
                  f"server {text!r} reference {want[key]!r}")
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            results = list(ex.map(lambda p: complete_plain(base, text_of(p)), prompts))
        same = sum(1 for p, r in zip(prompts, results) if r[0] == 200 and r[1] == want[(p["length"], p["trial"])])
        check(f"{len(prompts)} concurrent requests", same == len(prompts), f"{same}/{len(prompts)} equal")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 60 s"
        check("SIGTERM exit status 0", rc == 0, f"exit {rc}")
    print(f"serve_check --backend {a.backend} --precision {a.precision}: {'all passed' if failures == 0 else f'{failures} failed'}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
