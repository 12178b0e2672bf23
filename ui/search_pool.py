"""The app's long searches (the planner's) in worker processes, a bounded pool of them. No Streamlit here.

Each search runs in a process of its own, a fresh interpreter (``python -m ui.search_pool``:
nothing of the server's state, no thread of it copied), so a search never holds the server's GIL,
and everything it allocated goes back to the operating system when the process exits after its
answer. The job goes to the worker as one JSON line on its stdin, which also carries a request to
stop; progress and the answer come back as JSON lines on its stdout. (Not `multiprocessing`: its
"spawn" runs the parent's `__main__` again in the child, and under Streamlit that is the app's
script.) At most `workers` searches
run at once (the app sets one per core at most); further requests wait in line, first come first
served, and each can say where it stands. Requests with the same key (the same configuration)
share one search.

A search belongs to its owners (a session on a page). It ends early when the last one leaves (the
session switched page, asked for another search on the same page, or stopped polling for
`idle_s` seconds: a closed tab), and stops when asked (`stop`), returning the best layouts found so
far. Answers are kept by key, the most recent `cache_entries` of them (plain data, small).

The searches themselves are plain calls into `estimator` (`JOBS`): a worker runs one with a
`Watch` whose reports go back over a pipe and whose stop request comes from it.
"""

from __future__ import annotations

import gc
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]  # the directory holding `estimator` and `ui`

QUEUED, RUNNING, DONE, FAILED, GONE = "queued", "running", "done", "failed", "gone"
USER_STOP = "a request to stop"  # estimator.watch.Watch.describe() of a stopped search


class Status(NamedTuple):
    """Where a search stands for the page that asked for it."""

    state: str  # QUEUED, RUNNING, DONE, FAILED, or GONE (not known: never asked, ended, or forgotten)
    position: int = 0  # QUEUED: 1 for the next to start
    running: int = 0  # searches running now, of `workers`
    workers: int = 0
    progress: dict | None = None  # RUNNING: estimator.watch.Progress.to_json()
    result: Any = None  # DONE: the job's answer (plain data)
    error: dict | None = None  # FAILED: {"field", "value", "allowed", "reason"} of a ConfigError, or {"internal": text}


@dataclass
class _Job:
    key: str
    kind: str
    args: dict
    owners: dict[str, tuple[str, float]] = field(default_factory=dict)  # owner -> (page, last seen)
    process: subprocess.Popen | None = None
    progress: dict | None = None
    stopping: bool = False
    pending: bytes = b""  # the worker's output not yet a whole line


class SearchPool:
    """A bounded pool of search processes (see the module's docstring). Thread-safe: every Streamlit
    session calls it from its own script thread; a monitor thread reads the workers' pipes."""

    def __init__(self, workers: int, budget_s: float | None = None, cache_entries: int = 32,
                 idle_s: float = 30.0, tick_s: float = 0.1):
        if workers < 1:
            raise ValueError(f"workers = {workers}: at least 1")
        self.workers = workers
        self.budget_s = budget_s
        self.idle_s = idle_s
        self.tick_s = tick_s
        self._lock = threading.RLock()
        self._queue: list[_Job] = []  # waiting, oldest first
        self._running: dict[str, _Job] = {}
        self._answers: OrderedDict[str, Status] = OrderedDict()  # DONE or FAILED, most recent last
        self._cache_entries = cache_entries
        self.peaks: list[int] = []  # each finished worker's peak resident bytes (VmHWM), for a report
        self._monitor: threading.Thread | None = None
        self._closed = False

    # --- what a page calls ----------------------------------------------------------------------

    def request(self, key: str, kind: str, args: dict, owner: str, page: str, again: bool = False) -> Status:
        """Ask for the search `key` (job `kind` with `args`) for `owner` on `page`: its answer if
        known (unless `again` and it was stopped by request or broke), else it joins or starts the search.
        The owner leaves its other searches on the same page."""
        with self._lock:
            self._leave(owner, lambda job_page, job_key: job_page == page and job_key != key)
            answer = self._answers.get(key)
            if answer is not None and again and (_stopped_by_request(answer.result) or _broke(answer)):
                del self._answers[key]
                answer = None
            if answer is not None:
                self._answers.move_to_end(key)
                return answer
            job = self._running.get(key) or next((j for j in self._queue if j.key == key), None)
            if job is None:
                job = _Job(key, kind, args)
                self._queue.append(job)
            job.owners[owner] = (page, time.monotonic())
            self._start_ready()
            self._ensure_monitor()
            return self._status(key)

    def status(self, key: str, owner: str | None = None) -> Status:
        """Where `key` stands; a poll by an owner counts as its sign of life."""
        with self._lock:
            job = self._running.get(key) or next((j for j in self._queue if j.key == key), None)
            if job is not None and owner in job.owners:
                job.owners[owner] = (job.owners[owner][0], time.monotonic())
            return self._status(key)

    def stop(self, key: str) -> None:
        """Ask the search to stop: a running one answers with the best layouts found so far; a
        waiting one is dropped."""
        with self._lock:
            if key in self._running:
                job = self._running[key]
                if not job.stopping:
                    job.stopping = True
                    try:
                        job.process.stdin.write(b"stop\n")
                        job.process.stdin.flush()
                    except OSError:
                        pass
            else:
                self._queue = [j for j in self._queue if j.key != key]

    def leave(self, owner: str, staying_on: str | None = None) -> None:
        """`owner` leaves every search it asked for on another page than `staying_on`; a search
        nobody owns any more ends."""
        with self._lock:
            self._leave(owner, lambda page, _key: page != staying_on)

    def snapshot(self) -> dict:
        """Counts for a status line or a test: running, waiting, answers kept, and the running workers' pids."""
        with self._lock:
            return {"running": len(self._running), "queued": len(self._queue), "answers": len(self._answers),
                    "pids": [j.process.pid for j in self._running.values()]}

    def close(self) -> None:
        """End every search and the monitor (the server's exit, a test's end)."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            for job in list(self._running.values()):
                self._end(job)
        if self._monitor is not None:
            self._monitor.join(timeout=5)

    # --- bookkeeping (under the lock) -------------------------------------------------------------

    def _status(self, key: str) -> Status:
        running = len(self._running)
        if key in self._answers:
            return self._answers[key]
        if key in self._running:
            return Status(RUNNING, 0, running, self.workers, self._running[key].progress)
        for i, job in enumerate(self._queue, 1):
            if job.key == key:
                return Status(QUEUED, i, running, self.workers)
        return Status(GONE, 0, running, self.workers)

    def _leave(self, owner: str, leaves) -> None:
        for job in list(self._running.values()) + list(self._queue):
            if owner in job.owners and leaves(job.owners[owner][0], job.key):
                del job.owners[owner]
                if not job.owners:
                    self._drop(job)

    def _drop(self, job: _Job) -> None:
        if job in self._queue:
            self._queue.remove(job)
        elif self._running.get(job.key) is job:
            self._end(job)
            del self._running[job.key]
        self._start_ready()

    def _end(self, job: _Job) -> None:
        """Terminate a worker (its memory goes back to the system with it)."""
        process = job.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=2)
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def _start_ready(self) -> None:
        while self._queue and len(self._running) < self.workers and not self._closed:
            job = self._queue.pop(0)
            job.process = subprocess.Popen([sys.executable, "-m", "ui.search_pool"], cwd=ROOT,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           env={**os.environ, "PYTHONPATH": str(ROOT)})
            os.set_blocking(job.process.stdout.fileno(), False)
            job.process.stdin.write(json.dumps({"kind": job.kind, "args": job.args, "budget_s": self.budget_s})
                                    .encode() + b"\n")
            job.process.stdin.flush()
            self._running[job.key] = job

    def _finish(self, job: _Job, answer: Status) -> None:
        del self._running[job.key]
        self._end(job)
        self._answers[job.key] = answer
        self._answers.move_to_end(job.key)
        while len(self._answers) > self._cache_entries:
            self._answers.popitem(last=False)
        self._start_ready()

    def _ensure_monitor(self) -> None:
        if self._monitor is None or not self._monitor.is_alive():
            self._monitor = threading.Thread(target=self._watch, name="search pool monitor", daemon=True)
            self._monitor.start()

    def _watch(self) -> None:
        """Read the workers' reports, reap them, and drop searches whose owners went quiet."""
        while True:
            with self._lock:
                if self._closed or not (self._running or self._queue):
                    self._monitor = None
                    return
                self._tick()
            time.sleep(self.tick_s)

    def _tick(self) -> None:
        now = time.monotonic()
        for job in list(self._running.values()) + list(self._queue):
            for owner, (_page, seen) in list(job.owners.items()):
                if now - seen > self.idle_s:
                    del job.owners[owner]
            if not job.owners:
                self._drop(job)
        for job in list(self._running.values()):
            self._read(job)

    def _read(self, job: _Job) -> None:
        ended = job.process.poll() is not None  # before reading: whatever it wrote is there to read
        try:
            while True:
                chunk = job.process.stdout.read(1 << 20)
                if not chunk:
                    break
                job.pending += chunk
        except (OSError, ValueError):
            pass
        *lines, job.pending = job.pending.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "progress" in message:
                job.progress = message["progress"]
            elif "done" in message:
                self.peaks.append(message.get("peak_rss", 0))
                return self._finish(job, Status(DONE, result=message["done"]))
            else:
                return self._finish(job, Status(FAILED, error=message["error"]))
        if ended:  # it ended without an answer (killed, out of memory)
            code = job.process.returncode
            self._finish(job, Status(FAILED, error={"internal": f"the search's process ended (exit code {code})"}))


def _stopped_by_request(result: Any) -> bool:
    return isinstance(result, dict) and result.get("stopped") == USER_STOP


def _broke(answer: Status) -> bool:
    """A search that failed for another reason than the configuration (a bug, a killed process)."""
    return answer.state == FAILED and "internal" in (answer.error or {})


# --- the worker ------------------------------------------------------------------------------------------

def work() -> None:
    """A worker process: read the job from stdin, run it, write {"progress": ...} lines and one
    {"done": answer} or {"error": ...} line to stdout, then leave at once (os._exit: the search's
    memos are not freed one by one; the operating system takes the whole process back)."""
    from estimator.spec.errors import ConfigError
    from estimator.search.watch import Watch

    out = sys.stdout.buffer

    def send(message: dict) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    def asked_to_stop() -> bool:
        ready, _, _ = select.select([sys.stdin], [], [], 0)
        return bool(ready) and sys.stdin.readline().strip() in ("stop", "")  # "": the server is gone

    try:
        os.nice(10)  # the server's reruns come first
    except OSError:
        pass
    # one job, then os._exit: as in the CLI (cli.run), the cyclic collector stays off, so re-enabling it after
    # the planner's search does not walk every memo record (about 1 s of DeepSeek-V3's plan) for nothing
    gc.disable()
    job = json.loads(sys.stdin.readline())
    watch = Watch(budget_s=job["budget_s"], stop=asked_to_stop, report=lambda p: send({"progress": p.to_json()}))
    try:
        answer = JOBS[job["kind"]](job["args"], watch)
        send({"done": answer, "peak_rss": _peak_rss()})
    except ConfigError as exc:
        send({"error": {"field": exc.field, "value": _plain(exc.value), "allowed": exc.allowed, "reason": exc.reason}})
    except Exception as exc:  # a bug is one line on the page, never a hung search
        send({"error": {"internal": f"{type(exc).__name__}: {exc}"[:500]}})
    finally:
        out.flush()
        os._exit(0)


def _peak_rss() -> int:
    """This process's peak resident bytes (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def plan_job(args: dict, watch) -> dict:
    """The Planner page's search: `Plan.to_json()` (layouts fastest first), the GPU it planned for,
    its capacity, the no-fit line and the wall seconds."""
    import json

    from estimator import load_config
    from estimator.search.planner import no_fit_text, plan

    cfg = load_config(json.loads(args["config_json"]))
    start = time.perf_counter()
    result = plan(cfg.architecture, cfg.training, cfg.hardware, args["gpus"], args["gpus_per_node"], args["margin"],
                  comm_overlap=cfg.parallel.comm_overlap, watch=watch)
    out = result.to_json()
    # Plan.seconds is the layout search alone; when nothing fits, finding the fewest GPUs that
    # would fit is a second search, often the longer one, and the page reports both
    out["wall_seconds"] = time.perf_counter() - start
    out["gpu"] = cfg.hardware.gpu
    out["capacity_bytes"] = cfg.hardware.device.capacity_bytes
    out["no_fit"] = "" if result.layouts else no_fit_text(result)
    return out


def nearest_job(args: dict, watch) -> dict:
    """The Memory page's "What to change" when single changes do not get the run to fit: the
    planner's nearest fitting layout (estimator.advice.nearest_fitting_layout), as the CLI gives it."""
    import json

    from estimator import load_config
    from estimator.search.advice import nearest_fitting_layout

    cfg = load_config(json.loads(args["config_json"]))
    found = nearest_fitting_layout(cfg, watch=watch)
    out = {"stopped": watch.describe() or None, "suggestion": None}
    if found is not None:
        out["suggestion"] = {"description": found.description, "config": found.config.to_dict(),
                             "device_total_bytes": found.device_total_bytes, "utilization": found.utilization,
                             "verdict": found.verdict, "gpus": found.gpus}
    return out


JOBS = {"plan": plan_job, "nearest": nearest_job}


if __name__ == "__main__":
    work()
