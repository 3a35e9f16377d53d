"""``leaseq demo --pipeline``: the OCR pipeline (leaseq.examples.ocr_pipeline) end to end,
with a worker SIGKILLed during the fan-in, and an account of every document.

Starts an embedded PostgreSQL unless a database URL is given, migrates, enqueues documents
(born-digital pages, so no model is needed and it takes seconds) and one document with a page
that is not an image, runs two ``leaseq worker`` processes, SIGKILLs one while it reads a page
of a document some of whose pages are done but whose merge still waits (and starts a
replacement), reaps expired leases itself (the operator's job in production), and checks:
every good document's merge ran exactly once with the document's text in page order, one
page job per page and one merge per document, the killed worker's page was reaped and read
again, the broken document's merge was cancelled by its dead page with the cause recorded,
and every pipeline's counters add up. Exit status 1 if one of these broke.
"""

from __future__ import annotations

import signal
import time

import leaseq
from leaseq.core.errors import ConfigError
from leaseq.core.models import FINISHED_STATUSES
from leaseq.demo.harness import Harness, with_server
from leaseq.examples.ocr_pipeline import DELAY_ENV, text_document

APP = "leaseq.examples.ocr_pipeline:registry"
LEASE_SECONDS = 3.0
#: Page n of a document waits n times this: its pages finish one after another, so there is
#: a moment when some are done and the merge still waits (when the demo kills a worker).
PAGE_DELAY = 0.4
TIME_LIMIT = 300.0


class PipelineDemo(Harness):
    def __init__(self, url: str, documents: int, pages_per_document: int) -> None:
        super().__init__(
            url, "pipeline-demo", APP,
            worker_args=["--concurrency", "2", "--lease-seconds", str(LEASE_SECONDS),
                         "--heartbeat-seconds", str(LEASE_SECONDS / 6)],
            worker_env={DELAY_ENV: str(PAGE_DELAY)},
        )  # fmt: skip
        self.documents = documents
        self.pages = pages_per_document

    def run(self) -> int:
        with leaseq.connect(self.url, action="demo") as conn:
            leaseq.migrate(conn)
            queue = leaseq.Queue(conn)
            texts: dict[int, list[str]] = {}
            for n in range(self.documents):
                lines = [f"document {n} page {p + 1}" for p in range(self.pages)]
                texts[queue.enqueue(self.queue_name, "ocr.split", text_document(lines)).job_id] = (
                    lines
                )
            bad = text_document(["fine page"])
            bad["pages"].append({"image": "bm90IGEgcG5n"})
            broken = queue.enqueue(self.queue_name, "ocr.split", bad).job_id
            self.say(
                f"enqueued {self.documents} documents of {self.pages} pages (one split job "
                f"each), and document {broken} whose page 2 is not an image"
            )
            finished = self.run_workers(
                ["w1", "w2"],
                lambda: self.watch(queue),
                retry=leaseq.RetryPolicy(base_seconds=0.2, cap_seconds=1),
                reap_every=0.3,
            )
            return self.summary(queue, texts, broken, finished)

    def watch(self, queue: leaseq.Queue) -> bool:
        while time.monotonic() - self.start < TIME_LIMIT:
            jobs = queue.jobs(queue=self.queue_name, limit=1000)
            if not self.killed:
                self.maybe_kill(queue, jobs)
            splits = [j for j in jobs if j.job_type == "ocr.split"]
            if splits and all(j.status in FINISHED_STATUSES for j in jobs):
                return True
            time.sleep(0.05)
        return False

    def maybe_kill(self, queue: leaseq.Queue, jobs: list[leaseq.JobRecord]) -> None:
        """SIGKILL w1 while it reads a page of a document whose merge still waits and some
        of whose pages are done: during the fan-in."""
        name = self.worker_name("w1")
        for j in jobs:
            if j.job_type != "ocr.page" or j.status != "running" or j.lease_owner != name:
                continue
            (merge,) = queue.links(j.id).children
            if merge.status == "waiting" and queue.links(merge.job_id).deps_left < self.pages:
                self.killed.append(j.id)
                self.procs["w1"].send_signal(signal.SIGKILL)
                self.say(
                    f"SIGKILL {name} while it reads page job {j.id}, during the fan-in of "
                    f"merge {merge.job_id}; the lease expires in {LEASE_SECONDS:.0f}s"
                )
                self.spawn("w3")
                return

    def summary(
        self, queue: leaseq.Queue, texts: dict[int, list[str]], broken: int, finished: bool
    ) -> int:
        elapsed = time.monotonic() - self.start
        check = self.check
        merges: dict[int, list[leaseq.LinkedJob]] = {}
        pages: dict[int, list[leaseq.LinkedJob]] = {}
        for split in [*texts, broken]:
            children = queue.links(split, limit=1000).children
            pages[split] = children
            merges[split] = [] if not children else queue.links(children[0].job_id).children
        print(f"\n== {len(texts)} documents of {self.pages} pages in {elapsed:.0f}s ==")
        check(finished, "every job reached a final state within the time limit")
        check(
            all(len(pages[s]) == self.pages and len(merges[s]) == 1 for s in texts),
            "one page job per page and one merge per document: the fan-out was not lost nor "
            "doubled",
        )
        done = {s: queue.get(merges[s][0].job_id) for s in texts if merges[s]}
        check(
            len(done) == len(texts)
            and all(
                r.status == "succeeded" and r.result["text"] == "\n\n".join(texts[s])
                for s, r in done.items()
            ),
            "every good document's merge succeeded with its pages' text in page order",
        )
        check(
            all([a.outcome for a in queue.attempts(r.id)] == ["succeeded"] for r in done.values()),
            "every merge ran exactly once",
        )
        outcomes = {j: [a.outcome for a in queue.attempts(j)] for j in self.killed}
        check(
            bool(self.killed)
            and all(
                queue.get(j).status == "succeeded"
                and o in (["lease_expired", "succeeded"], ["succeeded"])
                for j, o in outcomes.items()
            ),
            f"the killed worker's page {self.killed} succeeded once: reaped and read again, "
            f"unless its completion had committed before the kill (attempts: {outcomes})",
        )
        bad_merge = queue.get(merges[broken][0].job_id) if merges[broken] else None
        check(
            bad_merge is not None
            and bad_merge.status == "cancelled"
            and bad_merge.last_error_code == "PARENT_FAILED",
            f"the broken document's merge was cancelled by its dead page: "
            f"{bad_merge.last_error if bad_merge else None}",
        )
        pipelines = [queue.pipeline(p.id) for p in queue.pipelines(limit=len(texts) + 1)]
        check(
            all(p.finished and p.succeeded + p.dead + p.cancelled == p.total for p in pipelines),
            "every pipeline's counters add up (kept by the jobs' own transactions)",
        )
        return self.verdict()


def run(url: str | None, documents: int = 3, pages_per_document: int = 4) -> int:
    """Run the pipeline demo against ``url``, or an embedded PostgreSQL when it is None."""
    if documents < 1 or pages_per_document < 2:
        raise ConfigError("--documents must be at least 1 and --pages at least 2")
    return with_server(url, lambda u: PipelineDemo(u, documents, pages_per_document).run())
