"""leaseq's one exception hierarchy, and the one place psycopg errors are translated.

Every error says what was wrong and what to do. Lost leases are *not* errors: worker-side
calls return :class:`leaseq.core.models.Fenced` instead, so callers never parse exceptions for them.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict

from leaseq.core.redact import malformed, redact, remember


class LeaseqError(Exception):
    """Base class of every error leaseq raises."""


class ConfigError(LeaseqError):
    """A setting, flag or environment variable has a value leaseq cannot use."""


class InvalidJob(LeaseqError, ValueError):
    """An argument describing a job is invalid; nothing was written.

    ``field`` names the offending argument.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid {field}: {problem}; nothing was written")
        self.field = field
        self.problem = problem


class InvalidGraph(InvalidJob):
    """A graph of jobs (or a job's ``after=``) is invalid: a cycle, an unknown node, a parent
    job that does not exist or can no longer be met. ``problem`` names it; nothing was written."""

    def __init__(self, problem: str) -> None:
        super().__init__("graph", problem)


class JobNotFound(LeaseqError, LookupError):
    """No job has the given id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} does not exist (it may have been pruned); check the id")
        self.job_id = job_id


class JobStateError(LeaseqError):
    """The job exists but is not in a state that allows the requested change."""


class JobDead(LeaseqError):
    """A waited-for job ended ``dead``: its attempts were used up, or it failed permanently.

    ``last_error`` and ``error_code`` are the last attempt's; ``attempts`` how many ran."""

    def __init__(
        self, job_id: int, last_error: str | None, error_code: str | None, attempts: int
    ) -> None:
        code = f" [{error_code}]" if error_code else ""
        super().__init__(
            f"job {job_id} is dead after {attempts} attempt(s){code}: {last_error or 'no error'}"
            f"; see `leaseq jobs show {job_id}` for its attempts, and `leaseq retry {job_id}` to "
            "run it again"
        )
        self.job_id = job_id
        self.last_error = last_error
        self.error_code = error_code
        self.attempts = attempts


class JobCancelled(LeaseqError):
    """A waited-for job was cancelled; it has no result. ``reason`` is the cancel's, if any."""

    def __init__(self, job_id: int, reason: str | None) -> None:
        why = f" ({reason})" if reason else ""
        super().__init__(f"job {job_id} was cancelled{why}; it has no result")
        self.job_id = job_id
        self.reason = reason


class ResultTimeout(LeaseqError, TimeoutError):
    """The job did not finish within the wait's timeout. The job keeps running (unless the
    caller asked to cancel it on timeout: then ``cancelled`` is True)."""

    def __init__(self, job_ids: list[int], timeout: float, cancelled: bool = False) -> None:
        which = ", ".join(map(str, job_ids[:10])) + (" ..." if len(job_ids) > 10 else "")
        after = "it was cancelled" if cancelled else "it keeps running; wait again or cancel it"
        super().__init__(f"job(s) {which} did not finish within {timeout}s; {after}")
        self.job_ids = job_ids
        self.timeout = timeout
        self.cancelled = cancelled


class PipelineTimeout(ResultTimeout):
    """The pipeline did not finish within the wait's timeout; its jobs keep running."""

    def __init__(self, pipeline_id: int, timeout: float) -> None:
        LeaseqError.__init__(
            self,
            f"pipeline {pipeline_id} did not finish within {timeout}s; its jobs keep running "
            f"(see `leaseq pipelines show {pipeline_id}`): wait again or cancel it",
        )
        self.job_ids: list[int] = []
        self.pipeline_id = pipeline_id
        self.timeout = timeout
        self.cancelled = False


class WaitTimedOut(LeaseqError, TimeoutError):
    """Raised in a handler by ``ctx.wait_for`` when its deadline passed and no signal of that
    name was sent. Unless the handler catches it, the job goes to ``dead`` at once (it is in
    the default permanent list: another attempt would find no signal either)."""

    def __init__(self, job_id: int, name: str, deadline: str) -> None:
        super().__init__(
            f"job {job_id} waited for signal {name!r} until {deadline} and none was sent;"
            f" catch leaseq.WaitTimedOut in the handler to go on without it"
        )
        self.job_id = job_id
        self.name = name
        self.deadline = deadline


class WaitInHandler(LeaseqError):
    """A handler asked to wait for another job's result. Refused: the waiting handler holds
    a lease, a worker slot and perhaps a GPU while the job it waits for may need exactly
    those, so a busy pool deadlocks."""

    def __init__(self) -> None:
        super().__init__(
            "result()/wait_any()/as_completed() refused inside a job handler: the handler holds "
            "a lease, a worker slot (and perhaps a GPU) while the job it waits for may need "
            "them, which deadlocks a busy pool. Enqueue the follow-up work as its own job "
            "instead (job dependencies, when available, express 'run after'); read the other "
            "job's result with Queue.get() if it has already finished"
        )


class NoHandler(LeaseqError):
    """A claimed attempt's job type has no handler where the attempt was to run: the claim
    filter keeps such jobs from a worker, so the process that runs handlers registered other
    types than the worker that claimed (a registration that depends on the process, under
    ``--isolation process``). The attempt fails as a retryable error (``NoHandler``)."""

    def __init__(self, job_type: str, worker: str) -> None:
        super().__init__(
            f"no handler is registered for job type {job_type!r} where worker {worker!r} runs "
            "its handlers (its claim said it serves that type): register the type "
            "unconditionally in the app, the same in every process; the job is retried after "
            "backoff"
        )
        self.job_type = job_type


class DuplicateJob(LeaseqError):
    """A uniqueness rule refused the change (for example, a dedup key already taken)."""


class DatabaseError(LeaseqError):
    """PostgreSQL refused a statement for a reason leaseq does not classify further."""


class TransactionConflict(DatabaseError):
    """PostgreSQL aborted the transaction to break a deadlock (or a serialization failure):
    nothing of it was applied, and it is safe to run again (pipeline completions that unblock
    the same children from different batches can deadlock on the children's rows)."""


class StatementTimeout(DatabaseError):
    """A statement ran past its statement_timeout or waited past its lock_timeout; nothing
    it would have done happened (the mover halves its batch on this)."""


class DatabaseUnavailable(DatabaseError):
    """PostgreSQL could not be reached, refused the login, or the connection was lost.

    The message names host and port, what was not done, and what to check; it never contains
    the URL's password. Subclasses say *why* when PostgreSQL said so.
    """

    problem = "is unreachable"
    advice = "Check the host and port in the database URL and that the server accepts connections."

    def __init__(self, host: str, port: str, detail: str, action: str) -> None:
        super().__init__(
            f"PostgreSQL at {host}:{port} {self.problem} ({detail}); {action}. {self.advice}"
        )
        self.host = host
        self.port = port


class AuthenticationFailed(DatabaseUnavailable):
    """PostgreSQL refused the user name or password (or has no pg_hba.conf entry for them)."""

    problem = "refused the login: authentication failed"
    advice = (
        "Check the user name and password in the database URL (or the Secret it comes from), "
        "and the server's pg_hba.conf."
    )


class DatabaseMissing(DatabaseUnavailable):
    """The server answered, but has no database of the URL's name."""

    problem = "has no database of that name"
    advice = (
        "Fix the database name in the URL, or create the database (`createdb NAME`) and run "
        "`leaseq migrate --database-url URL`."
    )


class PermissionDenied(DatabaseError):
    """The database role lacks a privilege the call needs (see docs/guides/security.md
    for what each component's role may do)."""


class SchemaNotReady(DatabaseError):
    """leaseq's tables are missing or older than this code."""


class WrongEncoding(DatabaseError):
    """The database is not UTF8: text (job types, payloads) would come back as bytes."""


class ServerTooOld(DatabaseError):
    """The PostgreSQL server is older than the oldest leaseq's schema runs on."""


class SchemaTooNew(DatabaseError):
    """The database was migrated by a newer leaseq than this one."""


# Which argument each CHECK constraint guards, so a refused row names the field.
_CONSTRAINT_FIELDS = {
    "jobs_queue_name": "queue",
    "jobs_job_type_name": "job_type",
    "jobs_attempts": "max_attempts",
    "jobs_timeout_positive": "timeout",
}

# What did not happen, by the action that failed, for DatabaseUnavailable messages.
_NOT_DONE = {
    "enqueue": "nothing was enqueued",
    "migrate": "no migration was applied",
}


def _parses(conninfo: str) -> bool:
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return False
    return True


def check_conninfo(conninfo: str, *, action: str) -> str:
    """``conninfo`` if libpq can parse it (its secrets now masked wherever they appear);
    otherwise a ConfigError saying what is wrong without quoting it."""
    remember(conninfo)
    if not _parses(conninfo):
        raise _unusable(conninfo, action)
    return conninfo


def _unusable(conninfo: str, action: str) -> ConfigError:
    not_done = f"; {_NOT_DONE[action]}" if action in _NOT_DONE else ""
    return ConfigError(f"the database URL cannot be used: {malformed(conninfo)}{not_done}")


def endpoint(conninfo: str) -> tuple[str, str]:
    """Host and port named by a connection string, with libpq's defaults filled in."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return ("?", "?")
    host = str(params.get("host") or "localhost")
    port = str(params.get("port") or "5432")
    return host, port


def translate(exc: psycopg.Error, *, action: str, conninfo: str = "") -> LeaseqError:
    """Map a psycopg error raised while doing ``action`` to leaseq's hierarchy.

    Callers raise the result ``from exc`` so the original stays attached.
    """
    diag = getattr(exc, "diag", None)
    message = redact((getattr(diag, "message_primary", None) or str(exc)).strip())
    if isinstance(exc, psycopg.ProgrammingError) and conninfo and not _parses(conninfo):
        # libpq's parse error quotes the string back; say what is wrong in our own words.
        return _unusable(conninfo, action)
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return PermissionDenied(
            f"{action} refused: the database role lacks a privilege ({message}); see the "
            "documentation's security guide (docs/guides/security.md) for what each role may do"
        )
    if isinstance(exc, pg_errors.UndefinedObject) and "role" in message:
        return ConfigError(f"{action} failed: {message}; create the role first")
    column = getattr(diag, "column_name", None)
    if isinstance(exc, pg_errors.InvalidParameterValue) and column:
        # leaseq.enqueue(...) names the bad argument (COLUMN) and the problem (DETAIL).
        return InvalidJob(column, getattr(diag, "message_detail", None) or message)
    if isinstance(exc, pg_errors.CheckViolation):
        field = _CONSTRAINT_FIELDS.get(getattr(diag, "constraint_name", "") or "", "job")
        return InvalidJob(field, message)
    if isinstance(exc, pg_errors.NoDataFound | pg_errors.ObjectNotInPrerequisiteState):
        # leaseq.signal: no such job for this role, or a finished one.
        return JobStateError(f"{action} refused: {message}")
    if isinstance(exc, pg_errors.UniqueViolation):
        return DuplicateJob(f"{action} refused: {message}")
    if isinstance(exc, pg_errors.NumericValueOutOfRange | pg_errors.InvalidTextRepresentation):
        return InvalidJob("job", message)
    if isinstance(
        exc,
        pg_errors.UndefinedTable
        | pg_errors.UndefinedFunction
        | pg_errors.InvalidSchemaName
        | pg_errors.UndefinedObject,
    ):
        return SchemaNotReady(
            f"{action} failed: leaseq's schema is missing or out of date ({message}); "
            "run `leaseq migrate --database-url URL` first"
        )
    if isinstance(exc, pg_errors.DeadlockDetected | pg_errors.SerializationFailure):
        return TransactionConflict(f"{action} was rolled back to break a conflict: {message}")
    if isinstance(exc, pg_errors.QueryCanceled | pg_errors.LockNotAvailable):
        return StatementTimeout(f"{action} timed out: {message}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        host, port = endpoint(conninfo)
        not_done = _NOT_DONE.get(action, f"{action} did not happen and nothing was changed")
        return refusal(exc)(host, port, _detail(message, conninfo), not_done)
    return DatabaseError(f"{action} failed: {_scrub(message, conninfo)}")


# How libpq and PgBouncer word a refused login or a missing database. A refused connection
# carries no SQLSTATE, so the server's FATAL message is all there is to go on.
_AUTHENTICATION = re.compile(
    r"authentication failed|no password supplied|pg_hba\.conf|role \"[^\"]*\" does not exist"
)
_MISSING = re.compile(r"database \"[^\"]*\" does not exist|no such database")
_NOISE = re.compile(
    r"^(connection failed: )?"
    r'(connection to server (at "[^"]*", port \d+|on socket "[^"]*") failed: )?'
)


def refusal(exc: psycopg.Error) -> type[DatabaseUnavailable]:
    """Which :class:`DatabaseUnavailable` a failed connection is: a refused login, a missing
    database, or (anything else) unreachable. The first two do not go away by waiting."""
    text = str(exc)
    if isinstance(exc, pg_errors.InvalidAuthorizationSpecification | pg_errors.InvalidPassword):
        return AuthenticationFailed
    if isinstance(exc, pg_errors.InvalidCatalogName):
        return DatabaseMissing
    if _AUTHENTICATION.search(text):
        return AuthenticationFailed
    if _MISSING.search(text):
        return DatabaseMissing
    return DatabaseUnavailable


def _detail(message: str, conninfo: str) -> str:
    """The first line of libpq's message without its repeated preamble, password removed."""
    first = message.splitlines()[0] if message else ""
    return _scrub(_NOISE.sub("", first).replace("FATAL:  ", ""), conninfo)


def _scrub(text: str, conninfo: str) -> str:
    """``text`` with the connection string's password, if any, replaced by ``***``."""
    try:
        password = conninfo_to_dict(conninfo).get("password")
    except psycopg.ProgrammingError:
        return text
    return text.replace(str(password), "***") if password else text
