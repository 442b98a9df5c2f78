"""hark's bench workloads as a Python application drives them: the official grpcio client
(grpc.aio), with stubs generated from proto/ at start, over the public TaskService only.

`hark bench --client --python <python>` runs this once per workload and task kind, reads the
JSON lines it prints on stdout, and measures the hark processes' CPU and memory at the marks:

- W1: each round creates a task, watches it (WatchTask) until it waits on its question, thinks
  `--think-ms`, then times AnswerQuestion with `wait = NEXT_QUESTION_OR_END` until its reply,
  carrying the task's output, is in hand. Prints {"samples_ms": [...]}.
- W2: one WatchTasks stream of the owner's waiting tasks; N tasks created with at most
  `--in-flight` calls at a time, each seen waiting on the stream (mark "waiting"); after a line
  on stdin, all N answered the same way, each no sooner than `--think-ms` after it was seen
  (mark "resumed"). Prints {"suspend_s": ..., "resume_s": ...}.
- floor: against the bench's floor server, not hark: each round thinks `--think-ms`, then
  times one grpc.health.v1.Health/Check of `--service` ("commit": the server commits a row
  first). Prints {"samples_ms": [...]}.

Any failure (a task that ends otherwise, an output without its answer, a call that fails) ends
the run with a message on stderr and exit status 1.
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid

import grpc
from grpc_tools import protoc

WAIT_MS = 30_000


def load_stubs(proto_dir):
    """Generates the Python stubs of hark's protos into a temporary directory and imports them."""
    out = tempfile.mkdtemp(prefix="hark-bench-stubs-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    files = [
        os.path.join(proto_dir, "hark", "v1", name)
        for name in ("service.proto", "types.proto")
    ]
    status = protoc.main(
        ["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}",
         f"--grpc_python_out={out}", *files]
    )
    if status != 0:
        sys.exit(f"cannot generate the stubs of {proto_dir} (protoc exited {status})")
    sys.path.insert(0, out)
    from hark.v1 import service_pb2, service_pb2_grpc, types_pb2  # noqa: E402

    return service_pb2, service_pb2_grpc, types_pb2


def mark(name, **fields):
    print(json.dumps({"mark": name, **fields}), flush=True)


class Bench:
    def __init__(self, args, pb, grpc_pb, types):
        self.args = args
        self.pb = pb
        self.types = types
        self.channel = grpc.aio.insecure_channel(args.target)
        self.api = grpc_pb.TaskServiceStub(self.channel)
        token = os.environ.get("HARK_BENCH_TOKEN", "")
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.think = args.think_ms / 1000.0

    def task(self, owner, label):
        """A task of the chosen kind that asks one question, then ends with the answer."""
        if self.args.kind == "questionnaire":
            return self.pb.CreateTaskRequest(
                owner=owner,
                goal=label,
                questionnaire=[self.types.FormQuestion(key="go", text="Go on?")],
            )
        return self.pb.CreateTaskRequest(
            owner=owner, goal=f"[script:{self.args.script}] {label}"
        )

    async def create(self, request):
        reply = await self.api.CreateTask(request, metadata=self.metadata)
        return reply.task.id

    async def answer_until_end(self, task, answer):
        reply = await self.api.AnswerQuestion(
            self.pb.AnswerQuestionRequest(
                task_id=task,
                answer=answer,
                wait=self.pb.ANSWER_WAIT_NEXT_QUESTION_OR_END,
                wait_timeout_ms=WAIT_MS,
            ),
            metadata=self.metadata,
        )
        if not reply.HasField("event"):
            raise RuntimeError(f"task {task} did not end within {WAIT_MS} ms of its answer")
        event = reply.event
        if event.state != self.types.TASK_STATE_COMPLETED:
            raise RuntimeError(f"task {task} ended in state {event.state}: {event.error}")
        if answer not in event.result:
            raise RuntimeError(f"task {task}'s output {event.result!r} lacks its answer {answer!r}")

    async def w1(self):
        samples = []
        waiting = self.types.TASK_STATE_WAITING_INPUT
        for round_ in range(self.args.warmup + self.args.rounds):
            token = uuid.uuid4().hex[:12]
            task = await self.create(self.task(self.args.owner, f"w1 python round {round_}"))
            watch = self.api.WatchTask(
                self.pb.WatchTaskRequest(task_id=task), metadata=self.metadata
            )
            async for event in watch:
                if event.state == waiting:
                    break
            else:
                raise RuntimeError(f"the watch of task {task} ended before it waited")
            watch.cancel()
            await asyncio.sleep(self.think)
            answer = f"yes-{token}"
            t0 = time.perf_counter()
            await self.answer_until_end(task, answer)
            if round_ >= self.args.warmup:
                samples.append((time.perf_counter() - t0) * 1000.0)
        print(json.dumps({"samples_ms": samples}), flush=True)

    async def floor(self):
        # HealthCheckRequest { service } by hand: field 1, a string.
        name = self.args.service.encode()
        request = b"\n" + bytes([len(name)]) + name
        check = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        samples = []
        for round_ in range(self.args.warmup + self.args.rounds):
            await asyncio.sleep(self.think)
            t0 = time.perf_counter()
            await check(request)
            if round_ >= self.args.warmup:
                samples.append((time.perf_counter() - t0) * 1000.0)
        print(json.dumps({"samples_ms": samples}), flush=True)

    async def w2(self):
        n = self.args.tasks
        seen = {}
        all_seen = asyncio.Event()
        watch = self.api.WatchTasks(
            self.pb.WatchTasksRequest(
                owner=self.args.owner, states=[self.types.TASK_STATE_WAITING_INPUT]
            ),
            metadata=self.metadata,
        )
        # The stream is open once its headers came: every task created after is seen on it.
        await watch.initial_metadata()

        async def read():
            async for reply in watch:
                seen.setdefault(reply.event.task_id, time.perf_counter())
                if len(seen) >= n:
                    all_seen.set()
                    return

        reader = asyncio.create_task(read())
        slots = asyncio.Semaphore(self.args.in_flight)

        async def create(i):
            async with slots:
                return await self.create(self.task(self.args.owner, f"w2 python task {i}"))

        mark("suspending")
        t0 = time.perf_counter()
        ids = await asyncio.gather(*(create(i) for i in range(n)))
        try:
            await asyncio.wait_for(all_seen.wait(), timeout=120 + n / 100)
        except asyncio.TimeoutError:
            raise RuntimeError(f"{len(seen)} of {n} tasks were seen waiting") from None
        suspend_s = time.perf_counter() - t0
        watch.cancel()
        reader.cancel()
        mark("waiting")
        # The bench reads the processes' memory now, and says when to go on.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

        async def answer(i, task):
            async with slots:
                due = seen[task] + self.think - time.perf_counter()
                if due > 0:
                    await asyncio.sleep(due)
                await self.answer_until_end(task, f"w2-{i}")

        t1 = time.perf_counter()
        await asyncio.gather(*(answer(i, task) for i, task in enumerate(ids)))
        resume_s = time.perf_counter() - t1
        mark("resumed")
        print(json.dumps({"suspend_s": suspend_s, "resume_s": resume_s}), flush=True)


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="task-control's gRPC address, host:port")
    parser.add_argument("--proto", required=True, help="the proto/proto directory of hark")
    parser.add_argument("--workload", choices=["w1", "w2", "floor"], required=True)
    parser.add_argument("--kind", choices=["questionnaire", "agent"], default="questionnaire")
    parser.add_argument("--owner", default="bench:python")
    parser.add_argument("--service", choices=["commit", "nothing"], default="commit",
                        help="the floor's service to check")
    parser.add_argument("--script", default="w1", help="the scripted model's script of an agent task")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--think-ms", type=float, default=100.0)
    args = parser.parse_args()
    pb, grpc_pb, types = load_stubs(args.proto)
    bench = Bench(args, pb, grpc_pb, types)
    try:
        await {"w1": bench.w1, "w2": bench.w2, "floor": bench.floor}[args.workload]()
    finally:
        await bench.channel.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except (RuntimeError, grpc.RpcError) as e:
        sys.exit(f"hark bench (python): {e}")
