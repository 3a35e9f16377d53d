"""An HTTP front for a queue (FastAPI): enqueue a job and wait for its result, or hand back
its id and let the client come back for it.

::

    pip install 'leaseq[service]'
    export LEASEQ_DATABASE_URL=postgresql://...
    leaseq worker --app leaseq.examples.service:registry --queue service   # runs the jobs
    uvicorn --factory leaseq.examples.service:create_app                   # serves HTTP

- ``POST /jobs`` with ``{"job_type": "echo", "payload": {...}, "wait_seconds": 5}`` enqueues
  on queue ``service``. With ``wait_seconds`` it waits that long for the result: 200 with the
  result, or 202 with the id (and a Location) if the job is still running, which keeps
  running. Without it, 202 at once. A job that went dead answers 502 with its last error,
  a cancelled one 409, a bad request (unknown field values) 422 naming the field.
- ``GET /jobs/{id}`` says where the job stands; ``?wait_seconds=N`` long-polls for the result.

Waiting costs no thread and no polling: :class:`leaseq.aio.AsyncQueue` waits on one shared
listening connection per process. Only the public ``leaseq`` API is used.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Response
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

import leaseq
from leaseq import JobContext, PermanentError, Registry
from leaseq.aio import AsyncQueue

QUEUE = "service"
URL_ENV = "LEASEQ_DATABASE_URL"

registry = Registry()


@registry.job("echo")
def echo(payload: Any, ctx: JobContext) -> Any:
    """Return the payload: a stand-in for the inference a real service would enqueue.
    ``{"fail": "why"}`` fails it for good (the job goes dead with that error)."""
    if isinstance(payload, dict) and payload.get("fail"):
        raise PermanentError(str(payload["fail"]))
    return {"echo": payload, "attempt": ctx.attempt}


class EnqueueRequest(BaseModel):
    job_type: str
    payload: Any = None
    priority: int = 100
    #: Wait this long for the result (seconds); absent: answer with the id at once.
    wait_seconds: float | None = Field(default=None, ge=0, le=300)


class JobView(BaseModel):
    id: int
    status: str
    result: Any = None
    last_error: str | None = None


def _answer(outcome: leaseq.JobOutcome, response: Response, *, waited: bool = True) -> JobView:
    """The view of a job that may have finished; sets the status code to match. A caller
    that did not wait is told 202 whatever the job has done since (it may already have
    run): the code answers the request, not the job's progress."""
    view = JobView(
        id=outcome.job_id,
        status=str(outcome.status),
        result=outcome.result,
        last_error=outcome.last_error,
    )
    if not waited:
        response.status_code = 202
        response.headers["Location"] = f"/jobs/{outcome.job_id}"
        return view
    if outcome.status == leaseq.JobStatus.DEAD:
        raise HTTPException(502, view.model_dump())
    if outcome.status == leaseq.JobStatus.CANCELLED:
        raise HTTPException(409, view.model_dump())
    if not outcome.finished:
        response.status_code = 202
        response.headers["Location"] = f"/jobs/{outcome.job_id}"
    return view


def create_app(database_url: str | None = None) -> FastAPI:
    """The service on ``database_url`` (default: $LEASEQ_DATABASE_URL). The pool opens and
    closes with the app."""
    url = database_url or os.environ.get(URL_ENV, "")
    if not url:
        raise leaseq.ConfigError(f"no database URL: pass one or set {URL_ENV}")
    state: dict[str, AsyncQueue] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncConnectionPool(url, kwargs={"autocommit": True}) as pool:
            state["queue"] = AsyncQueue(pool)
            yield

    app = FastAPI(title="leaseq example service", lifespan=lifespan)

    async def outcome(job_id: int, wait_seconds: float | None) -> leaseq.JobOutcome:
        queue = state["queue"]
        try:
            if wait_seconds:
                return await queue.wait_any([job_id], timeout=wait_seconds)
        except leaseq.ResultTimeout:
            pass
        except leaseq.JobNotFound:
            raise HTTPException(404, f"no job {job_id}") from None
        try:
            record = await queue.get(job_id)
        except leaseq.JobNotFound:
            raise HTTPException(404, f"no job {job_id}") from None
        return leaseq.JobOutcome(
            job_id=record.id,
            status=leaseq.JobStatus(record.status),
            result=record.result,
            last_error=record.last_error,
            last_error_code=record.last_error_code,
            attempts=record.attempt_count,
        )

    @app.post("/jobs", response_model=JobView)
    async def enqueue(request: EnqueueRequest, response: Response) -> JobView:
        try:
            job = await state["queue"].enqueue(
                QUEUE,
                request.job_type,
                request.payload,
                priority=request.priority,
                wait=request.wait_seconds is not None,
            )
        except leaseq.InvalidJob as exc:
            raise HTTPException(422, str(exc)) from None
        return _answer(
            await outcome(job.job_id, request.wait_seconds),
            response,
            waited=request.wait_seconds is not None,
        )

    @app.get("/jobs/{job_id}", response_model=JobView)
    async def show(job_id: int, response: Response, wait_seconds: float | None = None) -> JobView:
        if wait_seconds is not None and not 0 <= wait_seconds <= 300:
            raise HTTPException(422, "wait_seconds must be between 0 and 300")
        return _answer(await outcome(job_id, wait_seconds), response)

    return app
