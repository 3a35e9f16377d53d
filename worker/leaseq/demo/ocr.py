"""``leaseq demo --ocr``: the OCR example (leaseq.examples.ocr) with a real model, a SIGKILL
and an account of every document.

Starts an embedded PostgreSQL unless a database URL is given, migrates, renders documents of
known text, enqueues them with one broken document, runs two ``leaseq worker`` processes
with the OCR app, SIGKILLs one once a document has checkpointed a page (and starts a
replacement, as a Deployment would), reaps expired leases itself (the operator's job in
production) and checks: every good document succeeded with the text that was drawn, the
killed one resumed from its last page, the broken one is dead with its reason, one effect
per document. Exit status 1 if one of these broke.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import leaseq
from leaseq.core.errors import ConfigError
from leaseq.demo.embedded import EmbeddedPostgres
from leaseq.demo.run import stop_processes
from leaseq.examples import pages

APP = "leaseq.examples.ocr:registry"
LEASE_SECONDS = 5.0
TIME_LIMIT = 600.0


def squeeze(text: str) -> str:
    """The model drops spaces now and then: texts are compared without whitespace."""
    return "".join(text.split())


class OcrDemo:
    def __init__(self, url: str, documents: int, pages_per_document: int) -> None:
        self.url = url
        self.queue_name = f"ocr-demo-{secrets.token_hex(3)}"
        self.workdir = Path(tempfile.mkdtemp(prefix="leaseq-ocr-demo-"))
        self.documents = documents
        self.pages = pages_per_document
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: list[int] = []
        self.start = time.monotonic()
        self._stop = threading.Event()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {text}", flush=True)

    def spawn(self, key: str) -> None:
        name = f"{self.queue_name}-{key}"
        cmd = [
            sys.executable, "-m", "leaseq.cli", "worker",
            "--app", APP,
            "--queue", self.queue_name,
            "--lease-seconds", str(LEASE_SECONDS),
            "--heartbeat-seconds", str(LEASE_SECONDS / 5),
            "--poll-seconds", "1",
            "--worker-id", name,
            "--metrics-port", "0",
            "--log-format", "json",
        ]  # fmt: skip
        env = {**os.environ, "LEASEQ_DATABASE_URL": self.url}
        with (self.workdir / f"{key}.log").open("wb") as out:
            self.procs[key] = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        self.say(f"started worker {name} (loads the OCR model once, then claims)")

    def reap_loop(self) -> None:
        with leaseq.connect(self.url, action="reap") as conn:
            queue = leaseq.Queue(conn, retry=leaseq.RetryPolicy(base_seconds=0.5, cap_seconds=2))
            while not self._stop.wait(0.5):
                for job in queue.reap():
                    self.say(f"reaper: job {job.job_id}'s lease expired -> {job.status}")

    def run(self) -> int:
        with leaseq.connect(self.url, action="demo") as conn:
            leaseq.migrate(conn)
            queue = leaseq.Queue(conn)
            drawn: dict[int, list[list[str]]] = {}
            for n in range(self.documents):
                payload, lines = pages.document(f"scan-{n}", self.pages)
                job = queue.enqueue(self.queue_name, "ocr", payload, idempotency_key=f"scan-{n}")
                drawn[job.job_id] = lines
            broken = queue.enqueue(
                self.queue_name, "ocr", {"pages": [{"image": "bm90IGEgcG5n"}]}
            ).job_id
            self.say(
                f"enqueued {self.documents} documents of {self.pages} rendered pages, and "
                f"document {broken} whose page is not an image"
            )
            reaper = threading.Thread(target=self.reap_loop, daemon=True)
            reaper.start()
            try:
                self.spawn("w1")
                self.spawn("w2")
                finished = self.watch(queue, self.queue_name)
            finally:
                self._stop.set()
                self.stop_all()
                reaper.join(timeout=5)
            return self.summary(queue, drawn, broken, finished)

    def watch(self, queue: leaseq.Queue, name: str) -> bool:
        last = 0.0
        while time.monotonic() - self.start < TIME_LIMIT:
            jobs = queue.jobs(queue=name, limit=1000)
            if not self.killed:
                self.maybe_kill(jobs)
            if all(j.status in ("succeeded", "dead") for j in jobs):
                return True
            if time.monotonic() - last >= 5:
                done = sum(j.status == "succeeded" for j in jobs)
                self.say(f"{done}/{len(jobs)} documents done")
                last = time.monotonic()
            time.sleep(0.25)
        self.say(f"gave up after {TIME_LIMIT:.0f}s")
        return False

    def maybe_kill(self, jobs: list[leaseq.JobRecord]) -> None:
        """SIGKILL w1 once a document it runs has a checkpoint and pages left to read."""
        name = f"{self.queue_name}-w1"
        for j in jobs:
            saved = len((j.checkpoint or {}).get("pages", []))
            if j.status == "running" and j.lease_owner == name and 0 < saved < self.pages - 1:
                self.killed.append(j.id)
                self.procs["w1"].send_signal(signal.SIGKILL)
                self.say(
                    f"SIGKILL {name} while document {j.id} has {saved} of {self.pages} pages "
                    f"checkpointed; its lease expires in {LEASE_SECONDS:.0f}s"
                )
                self.spawn("w3")
                return

    def stop_all(self) -> None:
        stop_processes(list(self.procs.values()), timeout=30)

    def summary(
        self, queue: leaseq.Queue, drawn: dict[int, list[list[str]]], broken: int, finished: bool
    ) -> int:
        elapsed = time.monotonic() - self.start
        failures: list[str] = []

        def check(ok: bool, claim: str) -> None:
            print(f"  {'ok  ' if ok else 'FAIL'} {claim}")
            if not ok:
                failures.append(claim)

        jobs = {job_id: queue.get(job_id) for job_id in [*drawn, broken]}
        read_pages = sum(self.pages for j in drawn if jobs[j].status == "succeeded")
        print(f"\n== {len(drawn)} documents, {read_pages} pages read in {elapsed:.0f}s ==")
        for job_id in drawn:
            job = jobs[job_id]
            result = job.result or {}
            print(
                f"  document {job_id}: {job.status}, attempt {job.attempt_count}, resumed from "
                f"page {result.get('resumed_from_page')}, on {result.get('device')}"
            )
        check(finished, "every document reached a final state within the time limit")
        check(
            all(
                jobs[j].status == "succeeded"
                and [squeeze(p["text"]) for p in jobs[j].result["pages"]]
                == [squeeze("".join(page)) for page in lines]
                for j, lines in drawn.items()
            ),
            "every good document succeeded with exactly the text drawn on its pages",
        )
        check(
            bool(self.killed)
            and all(
                (jobs[j].result or {}).get("resumed_from_page", 0) > 0
                and queue.attempts(j)[0].outcome == "lease_expired"
                for j in self.killed
            ),
            f"the killed worker's document {self.killed} was reaped and resumed from its "
            "last checkpointed page",
        )
        check(
            jobs[broken].status == "dead"
            and jobs[broken].attempt_count == 1
            and "page 1" in (jobs[broken].last_error or ""),
            f"the broken document {broken} is dead after one attempt: {jobs[broken].last_error}",
        )
        check(
            all(
                (e := queue.effect(f"scan-{n}")) is not None and e.job_id == job_id
                for n, job_id in enumerate(drawn)
            ),
            "one effect per document, under its own key",
        )
        logs = ", ".join(str(self.workdir / f"{key}.log") for key in self.procs)
        if failures:
            print(f"\n{len(failures)} check(s) FAILED. Worker logs: {logs}")
            return 1
        print(f"\nall checks hold. Worker logs (JSON lines): {logs}")
        return 0


def run(url: str | None, documents: int = 4, pages_per_document: int = 4) -> int:
    """Run the OCR demo against ``url``, or an embedded PostgreSQL when it is None."""
    if documents < 1 or pages_per_document < 3:
        raise ConfigError("--documents must be at least 1 and --pages at least 3")
    logging.basicConfig(level=logging.ERROR)
    server = None
    if url is None:
        print("starting an embedded PostgreSQL (pass --database-url to use your own) ...")
        server = EmbeddedPostgres()
        url = server.url
    try:
        return OcrDemo(url, documents, pages_per_document).run()
    finally:
        if server is not None:
            server.stop()
