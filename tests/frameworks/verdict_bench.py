"""What a framework's plugin sees of hark's verdict: POST /api/v1/messages?wait_ms=… from a
separate process, timed up to the answer that says whether hark took the message.

    python tests/frameworks/verdict_bench.py http://127.0.0.1:8080 <gateway.http.token> [N]

against `hark dev` (its adapter speaks for the platform `web`, bot `playground`). Prints p50, p90
and p99 of N messages that are not hark's (`left`) and of N `/task help` commands (`command`)."""

import statistics
import sys
import time
import uuid

import httpx

base, token = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
client = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30)


def post(user: str, text: str) -> tuple[float, dict]:
    body = {
        "platform": "web",
        "bot_id": "playground",
        "stream": f"private:{user}",
        "sender": {"user_id": user},
        "text": text,
        "message_id": uuid.uuid4().hex,
    }
    start = time.perf_counter()
    response = client.post(f"{base}/api/v1/messages", params={"wait_ms": 5000}, json=body)
    took = time.perf_counter() - start
    response.raise_for_status()
    return took, response.json()


def report(name: str, samples: list[float]) -> None:
    ms = sorted(s * 1000 for s in samples)
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]
    print(f"{name}: n={len(ms)} p50={pick(0.5):.2f} ms p90={pick(0.9):.2f} ms p99={pick(0.99):.2f} ms mean={statistics.mean(ms):.2f} ms")


for _ in range(20):  # warm up connections and caches
    post("warm", "hello")
for name, user, text, expected in [
    ("left (not hark's)", "bench-left", "just chatting", "left"),
    ("command (/task help)", "bench-cmd", "/task help", "command"),
]:
    samples = []
    for i in range(n):
        # Each command from a user of its own: the per-person command limit stays out of it.
        took, answer = post(f"{user}-{i}" if expected == "command" else user, text)
        assert answer.get("as") == expected, answer
        samples.append(took)
    report(name, samples)
