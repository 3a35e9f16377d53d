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

import signal
import time

import leaseq
from leaseq.core.errors import ConfigError
from leaseq.demo.harness import Harness, with_server
from leaseq.examples import pages

APP = "leaseq.examples.ocr:registry"
LEASE_SECONDS = 5.0
TIME_LIMIT = 600.0


def squeeze(text: str) -> str:
    """The model drops spaces now and then: texts are compared without whitespace."""
    return "".join(text.split())


class OcrDemo(Harness):
    def __init__(self, url: str, documents: int, pages_per_document: int) -> None:
        super().__init__(
            url, "ocr-demo", APP,
            worker_args=["--lease-seconds", str(LEASE_SECONDS),
                         "--heartbeat-seconds", str(LEASE_SECONDS / 5)],
            spawn_note=" (loads the OCR model once, then claims)",
        )  # fmt: skip
        self.documents = documents
        self.pages = pages_per_document

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
            finished = self.run_workers(
                ["w1", "w2"],
                lambda: self.watch(queue, self.queue_name),
                retry=leaseq.RetryPolicy(base_seconds=0.5, cap_seconds=2),
                reap_every=0.5,
            )
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
        name = self.worker_name("w1")
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

    def summary(
        self, queue: leaseq.Queue, drawn: dict[int, list[list[str]]], broken: int, finished: bool
    ) -> int:
        elapsed = time.monotonic() - self.start
        check = self.check

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
        return self.verdict()


def run(url: str | None, documents: int = 4, pages_per_document: int = 4) -> int:
    """Run the OCR demo against ``url``, or an embedded PostgreSQL when it is None."""
    if documents < 1 or pages_per_document < 3:
        raise ConfigError("--documents must be at least 1 and --pages at least 3")
    return with_server(url, lambda u: OcrDemo(u, documents, pages_per_document).run())
