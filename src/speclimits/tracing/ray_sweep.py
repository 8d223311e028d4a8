"""Distributed K sweeps on Ray: ``speclimits trace ... --workers N`` (or ``--ray-address ADDR``).

The sweep's work is cut into **jobs**, ``(K, prompt shard)`` pairs (:func:`plan_jobs`; in a batch
sweep, ``--batch``, whole batches of one ``(b, K)``: a batch is never split between jobs). Each Ray
worker is an actor that owns one traced engine (:class:`~speclimits.tracing.sweep.EngineHolder`;
``num_gpus=1`` on a GPU cluster), keeps it across the shards of one K and rebuilds it only when
its next job has another K. The driver hands out jobs itself (:class:`JobQueue`): a worker gets
a job of its current K if one is left, else one of a K no other worker is on, else any; so
retried jobs never run out of order and each K is built about once per worker that needs it.

Crash safety and idempotence: a job writes its shard under a name derived from its
specification (:attr:`Job.name`, a hash of K, the prompts and the sweep settings) through
:class:`~speclimits.tracing.sweep.GenerationWriter` in shard mode: tokens part, then
``shards/<name>.json`` (its generations' log lines and vLLM's counter deltas, one atomic file),
then the rounds part, whose presence marks the job done. A retried or re-run job whose rounds
part exists is skipped; temporary files are dot-prefixed and never read. When a worker dies
(``RayActorError``), the driver starts a new one and gives its job back to the queue (at most
``max_attempts`` tries per job). The trace is then finalised exactly as a serial one
(:func:`~speclimits.tracing.sweep.finalize_meta`: every (K, prompt) once, counters checked
against vLLM's per part), and ``meta.json`` gains ``distributed`` (workers, where each shard
ran, attempts, engine builds, CPU seconds per worker).

The Oracle pass (``--oracle``) runs on Ray workers as well (:func:`trace_oracle_ray`): shards of
reference sequences, each worker with one Oracle engine, each sequence's ``oracle.parquet`` part
written once (``part-s{index}``, skipped when on disk, so a retried shard repeats nothing done);
the driver finishes exactly as the serial pass (:func:`~speclimits.tracing.oracle_mode.finish_oracle`).

Network: this module never chooses addresses, ports or listening interfaces. Locally it calls
``ray.init(num_cpus=..., include_dashboard=False)``, with ``--ray-address`` ``ray.init(address=...)``
and nothing else; usage statistics are turned off (``RAY_USAGE_STATS_ENABLED=0``) unless the
user set that variable. Tests and benchmarks run Ray only inside a loopback-only network
namespace that they create (see ``tests/test_ray_sweep.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import jsonable
from speclimits.trace.io import list_parts, read_meta, read_shard_logs, target_top_k, write_meta
from speclimits.tracing import engine as eng
from speclimits.tracing.oracle_mode import OraclePlan, finish_oracle, oracle_engine, plan_oracle, run_oracle_parts
from speclimits.tracing.prompts import Prompt
from speclimits.tracing.sweep import (
    Batch,
    EngineHolder,
    SweepConfig,
    SweepPlan,
    finalize_meta,
    initial_meta,
    plan_sweep,
    run_batches,
    sweep_config_dict,
)

RAY_HINT = "--workers / --ray-address need Ray: pip install -e '.[ray]' (ray==2.60.0)"


def require_ray() -> Any:
    """Import Ray or raise a one-line SpeclimitsError naming the install command."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before the import: Ray reads it early
    try:
        import ray  # Ray is an optional extra: imported only for a distributed sweep
    except ImportError:
        raise SpeclimitsError(RAY_HINT) from None
    return ray


# ---------------------------------------------------------------------------
# jobs and the queue (pure Python: no Ray needed)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One unit of distributed work: the generations of ``prompts`` (indices) at one K.

    ``gids`` are the generations' fixed ids (:meth:`~speclimits.tracing.sweep.SweepPlan.gid`);
    ``name`` is the shard's part name, ``part-k{K:03d}-g{first gid:06d}-{hash}``
    (``part-b{b:03d}-k{K:03d}-g…`` in a batch sweep), the hash covering K (and b), the generation
    ids, the prompt ids and the sweep settings, so the same job always writes the same files and
    a different one never does. In a batch sweep ``sizes`` holds the sizes of the job's batches
    (whole batches of batch size ``b``, in order); empty in a batch-1 sweep, whose generations
    run one at a time."""

    k_index: int
    K: int
    prompts: tuple[int, ...]
    gids: tuple[int, ...]
    name: str
    b: int = 1
    b_index: int = 0
    sizes: tuple[int, ...] = ()

    def batches(self) -> list[Batch]:
        """The job's batches (batches of one without ``sizes``)."""
        sizes = self.sizes or (1,) * len(self.prompts)
        out, start = [], 0
        for n in sizes:
            out.append(Batch(self.b_index, self.b, self.k_index, self.K, self.prompts[start: start + n],
                             self.gids[start: start + n]))
            start += n
        return out


def job_name(K: int, gids: tuple[int, ...], prompt_ids: list[str], settings: dict[str, Any],
             b: int | None = None) -> str:
    """A job's part name (see :class:`Job`); ``b`` None: a batch-1 sweep's job."""
    spec: dict[str, Any] = {"K": K, "gids": list(gids), "prompts": prompt_ids, "settings": settings}
    if b is not None:
        spec["b"] = b
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]
    prefix = "part-" if b is None else f"part-b{b:03d}-"
    return f"{prefix}k{K:03d}-g{gids[0]:06d}-{digest}"


def plan_jobs(plan: SweepPlan, shard_size: int) -> list[Job]:
    """The jobs of ``plan.todo``: per K, its prompts left in shards of ``shard_size``, in sweep order.

    In a batch sweep, per K and batch size b, its batches left in jobs of ``shard_size // b``
    whole batches (at least one), so that a batch runs in one engine, in one job."""
    if shard_size < 1:
        raise SpeclimitsError(f"--shard-size must be >= 1, got {shard_size}")
    jobs = []
    if plan.batch_sweep:
        batches = plan.batches()
        for ki, K in enumerate(plan.k_values):
            for bi, b in enumerate(plan.batch_sizes):
                mine = [bt for bt in batches if bt.k_index == ki and bt.b_index == bi]
                per_job = max(1, shard_size // b)
                for start in range(0, len(mine), per_job):
                    group = mine[start: start + per_job]
                    prompts = tuple(pi for bt in group for pi in bt.prompts)
                    gids = tuple(g for bt in group for g in bt.gids)
                    name = job_name(K, gids, [plan.prompts[pi].id for pi in prompts], plan.settings, b=b)
                    jobs.append(Job(ki, K, prompts, gids, name, b=b, b_index=bi,
                                    sizes=tuple(len(bt.gids) for bt in group)))
        return jobs
    for ki, K in enumerate(plan.k_values):
        mine = [t[2] for t in plan.todo if t[0] == ki]
        for start in range(0, len(mine), shard_size):
            prompts = tuple(mine[start: start + shard_size])
            gids = tuple(plan.gid(ki, pi) for pi in prompts)
            name = job_name(K, gids, [plan.prompts[pi].id for pi in prompts], plan.settings)
            jobs.append(Job(ki, K, prompts, gids, name))
    return jobs


def default_shard_size(n_prompts: int, workers: int) -> int:
    """Prompts per job when the user gives none: about four jobs per worker and K, at most 16
    prompts (a killed worker loses at most one job's generations)."""
    return max(1, min(16, -(-n_prompts // (4 * workers))))


class JobQueue:
    """The jobs not yet handed out, and the rule that picks a worker's next one.

    :meth:`next_for` prefers a job of the worker's current K (no engine rebuild), then a job of a
    K no other worker holds (that K's engine is built once), then any job (workers share a K
    at the end of the sweep). :meth:`give_back` returns a failed job to the front."""

    def __init__(self, jobs: list[Job]) -> None:
        self.pending = list(jobs)

    def __len__(self) -> int:
        return len(self.pending)

    def next_for(self, current_K: int | None, others: set[int]) -> Job | None:
        for rule in (lambda j: j.K == current_K, lambda j: j.K not in others, lambda j: True):
            for i, job in enumerate(self.pending):
                if rule(job):
                    return self.pending.pop(i)
        return None

    def give_back(self, job: Job) -> None:
        self.pending.insert(0, job)


# ---------------------------------------------------------------------------
# the worker (a Ray actor; plain Python here, made remote in run_sweep_ray)
# ---------------------------------------------------------------------------


class SweepWorker:
    """One engine, many jobs. Runs inside a Ray worker process.

    ``cfg`` is the sweep's :class:`SweepConfig` as a dict, ``prompts`` the prompt list (sent, so
    workers need not read the prompt file), ``settings`` the sweep settings."""

    def __init__(self, cfg: dict[str, Any], prompts: list[Prompt], k_values: list[int],
                 scratch: str | None = None) -> None:
        self.tmpdir, self._old_tmpdir = _enter_scratch(scratch)
        self.cfg = SweepConfig(**cfg)
        self.plan = SweepPlan(self.cfg, prompts, Path(self.cfg.out), {}, k_values, None, [],
                              sorted(set(int(b) for b in self.cfg.batch_sizes)))
        self.holder = EngineHolder(self.cfg, prompts, k_values)
        self.where = {"host": socket.gethostname(), "pid": os.getpid()}
        self.jobs_run = 0

    def start(self, K: int, warmup_prompt: int) -> dict[str, Any]:
        """Build (or keep) the engine for K; returns the model info meta.json needs and where this runs."""
        vllm = eng.require_vllm()
        self.where["node"] = require_ray().get_runtime_context().get_node_id()[:16]
        self.holder.ensure(K, warmup_prompt)
        return {"info": self.holder.info, "kwargs": self.holder.kwargs, "where": dict(self.where),
                "vllm_version": getattr(vllm, "__version__", "?")}

    def run_job(self, job: Job, top_k: int) -> dict[str, Any]:
        """Run one job unless its shard is on disk; returns what the driver records."""
        t0 = time.perf_counter()
        builds = self.holder.builds
        done = (self.plan.root / "rounds.parquet" / f"{job.name}.parquet").exists()
        if not done:
            llm = self.holder.ensure(job.K, job.prompts[0])
            run_batches(self.plan, self.holder, llm, job.K, job.batches(), top_k=top_k, shard=job.name,
                        worker=dict(self.where))
            self.jobs_run += 1
        return {"name": job.name, "skipped": done, "seconds": time.perf_counter() - t0,
                "engine_builds": self.holder.builds - builds, "where": dict(self.where)}

    def usage(self) -> dict[str, Any]:
        """CPU seconds of this worker process so far, engines built, jobs run."""
        return {"cpu_s": time.process_time(), "engine_builds": self.holder.builds, "jobs": self.jobs_run,
                **self.where}

    def close(self) -> None:
        self.holder.close()
        _leave_scratch(self.tmpdir, self._old_tmpdir)


def _enter_scratch(scratch: str | None) -> tuple[str, str | None]:
    """A worker's own TMPDIR (each engine leaves files there, vllm_dist_*), inside the driver's
    ``scratch`` folder when given (the driver removes it, also after a killed worker), and the CPU
    engine defaults. Returns (the folder, the TMPDIR it replaced)."""
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    tmpdir = tempfile.mkdtemp(prefix="speclimits-ray-worker-", dir=scratch)
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = None
    eng.apply_env_defaults()
    return tmpdir, old


def _leave_scratch(tmpdir: str, old: str | None) -> None:
    shutil.rmtree(tmpdir, ignore_errors=True)
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None


class OracleWorker:
    """One Oracle engine (K = k_max, :func:`~speclimits.tracing.oracle_mode.oracle_engine`), many
    shards of references. Runs inside a Ray worker process; writes each sequence's
    ``oracle.parquet`` part as the serial pass does (a part on disk is skipped, so a retried shard
    repeats nothing done)."""

    def __init__(self, cfg: dict[str, Any], plan: OraclePlan, scratch: str | None = None) -> None:
        self.tmpdir, self._old_tmpdir = _enter_scratch(scratch)
        self.cfg, self.plan = SweepConfig(**cfg), plan
        self.llm: Any = None
        self.info: dict[str, Any] = {}
        self.where = {"host": socket.gethostname(), "pid": os.getpid()}
        self.jobs_run = 0

    def run_job(self, items: list[tuple[int, Any]]) -> dict[str, Any]:
        t0 = time.perf_counter()
        if self.llm is None:  # long enough for every reference of the pass, so one engine serves all shards
            self.llm, self.info = oracle_engine(self.cfg, self.plan, self.plan.todo)
        got = run_oracle_parts(self.llm, self.info, self.plan, items, progress=False)
        self.jobs_run += 1
        return {"states": got["states"], "seconds": time.perf_counter() - t0, "where": dict(self.where)}

    def usage(self) -> dict[str, Any]:
        return {"cpu_s": time.process_time(), "jobs": self.jobs_run, **self.where}

    def close(self) -> None:
        if self.llm is not None:
            eng.close_llm(self.llm)
            self.llm = None
        _leave_scratch(self.tmpdir, self._old_tmpdir)


# ---------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------


@dataclass
class RaySettings:
    """How to run a distributed sweep.

    ``workers``: actors (one engine each). ``address``: an existing cluster (None: a local Ray
    instance with ``workers`` CPUs). ``gpus_per_worker``: None = 1 when the cluster has GPUs,
    else 0. ``runtime_env``: passed to ``ray.init`` (on a cluster: ``py_modules`` or
    ``working_dir`` so that workers import speclimits). ``on_event(kind, info)``: called by the
    driver on ``dispatch``, ``done`` and ``died`` (progress displays, tests)."""

    workers: int = 2
    address: str | None = None
    shard_size: int | None = None
    max_attempts: int = 3
    gpus_per_worker: float | None = None
    runtime_env: dict[str, Any] | None = None
    on_event: Callable[[str, dict[str, Any]], None] | None = None


@dataclass(eq=False)
class _Slot:
    """One worker as the driver sees it."""

    index: int
    actor: Any = None
    K: int | None = None
    where: dict[str, Any] = field(default_factory=dict)
    job: Job | None = None
    restarts: int = 0


def _local_runtime_env() -> dict[str, Any]:
    """Workers of a local instance import the same speclimits as the driver (its folder first on
    PYTHONPATH), also when the driver found it through ``sys.path`` rather than an install."""
    src = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def _init_ray(ray: Any, rs: RaySettings) -> bool:
    """Connect to Ray; returns True when this call started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    if rs.address:
        ray.init(address=rs.address, runtime_env=rs.runtime_env, log_to_driver=False)
    else:
        ray.init(num_cpus=rs.workers, include_dashboard=False, runtime_env=rs.runtime_env or _local_runtime_env(),
                 log_to_driver=False)
    return True


class _Driver:
    """Hands jobs to workers, replaces dead ones, writes meta.json; see the module docstring."""

    def __init__(self, ray: Any, plan: SweepPlan, jobs: list[Job], rs: RaySettings) -> None:
        self.ray, self.plan, self.rs = ray, plan, rs
        self.queue = JobQueue(jobs)
        self.attempts: dict[str, int] = {}
        self.record: dict[str, dict[str, Any]] = {}
        gpus = rs.gpus_per_worker
        if gpus is None:
            gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
        self.actor_cls = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(SweepWorker)
        self.slots = [_Slot(i) for i in range(rs.workers)]
        self.inflight: dict[Any, tuple[_Slot, str]] = {}
        self.top_k: int | None = None
        self.bar = tqdm(total=plan.n_total, initial=plan.n_total - len(plan.todo), desc="trace", unit="gen",
                        disable=not plan.cfg.progress)
        self.usage: list[dict[str, Any]] = []
        self.scratch = tempfile.mkdtemp(prefix="speclimits-ray-")

    def _event(self, kind: str, **info: Any) -> None:
        if self.rs.on_event is not None:
            self.rs.on_event(kind, info)

    def _spawn(self, slot: _Slot) -> None:
        slot.actor = self.actor_cls.remote(sweep_config_dict(self.plan.cfg), self.plan.prompts, self.plan.k_values,
                                           self.scratch)
        slot.K = None

    def _dispatch(self, slot: _Slot) -> None:
        """Give ``slot`` its next job: ``start`` first when its engine has another K (or none)."""
        others = {s.K for s in self.slots if s is not slot and s.K is not None}
        job = self.queue.next_for(slot.K, others)
        slot.job = job
        if job is None:
            return
        self.attempts[job.name] = self.attempts.get(job.name, 0) + 1
        if slot.K != job.K:
            ref = slot.actor.start.remote(job.K, job.prompts[0])
            self.inflight[ref] = (slot, "start")
            slot.K = job.K
        if self.top_k is not None:
            self._submit_job(slot)
        self._event("dispatch", worker=slot.index, job=job.name, K=job.K, attempt=self.attempts[job.name],
                    pid=slot.where.get("pid"))

    def _submit_job(self, slot: _Slot) -> None:
        ref = slot.actor.run_job.remote(slot.job, self.top_k)
        self.inflight[ref] = (slot, "job")

    def _on_start(self, slot: _Slot, result: dict[str, Any]) -> None:
        slot.where = result["where"]
        if self.top_k is None:  # first engine up: meta.json before any shard is written
            if self.plan.meta is None:
                self.plan.meta = initial_meta(self.plan.cfg, self.plan.settings, result["vllm_version"],
                                              result["info"], result["kwargs"])
                self.plan.root.mkdir(parents=True, exist_ok=True)
                write_meta(self.plan.root, self.plan.meta)
            self.top_k = int(target_top_k(self.plan.meta))
            for s in self.slots:  # jobs that waited for meta.json
                if s.job is not None and not any(vs is s and kind == "job" for vs, kind in self.inflight.values()):
                    self._submit_job(s)
        self._event("started", worker=slot.index, pid=slot.where.get("pid"), K=slot.K)

    def _on_job(self, slot: _Slot, result: dict[str, Any]) -> None:
        job = slot.job
        self.record[job.name] = {"K": job.K, "generation_ids": list(job.gids), "where": result["where"],
                                 "attempts": self.attempts[job.name], "seconds": round(result["seconds"], 3),
                                 "skipped": result["skipped"], "engine_builds": result["engine_builds"]}
        if self.plan.batch_sweep:
            self.bar.set_postfix_str(f"b={job.b} K={job.K} done: {job.name}")
        self.bar.update(len(job.gids))
        self._event("done", worker=slot.index, job=job.name, pid=result["where"].get("pid"))
        self._dispatch(slot)

    def _on_death(self, slot: _Slot, exc: Exception) -> None:
        job = slot.job
        self._event("died", worker=slot.index, job=None if job is None else job.name, pid=slot.where.get("pid"))
        # drop the dead actor's other calls (a start and its job are both lost)
        for ref in [r for r, (s, _) in self.inflight.items() if s is slot]:
            self.inflight.pop(ref)
        if job is not None:
            if self.attempts[job.name] >= self.rs.max_attempts:
                raise SpeclimitsError(f"distributed sweep: job {job.name} (K={job.K}, generations {list(job.gids)}) "
                                      f"failed {self.attempts[job.name]} times; last error: {exc}")
            self.queue.give_back(job)
        slot.restarts += 1
        slot.where = {}
        self._spawn(slot)
        self._dispatch(slot)

    def run(self) -> None:
        for slot in self.slots:
            self._spawn(slot)
        for slot in self.slots:
            self._dispatch(slot)
        ray = self.ray
        while self.inflight:
            ready, _ = ray.wait(list(self.inflight), num_returns=1)
            slot, kind = self.inflight.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:  # the worker process died: retry its job elsewhere
                self._on_death(slot, exc)
                continue
            except ray.exceptions.RayTaskError as exc:  # Python error inside the job: would repeat
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                raise SpeclimitsError(f"distributed sweep: worker {slot.index} failed: {cause}") from None
            if kind == "start":
                self._on_start(slot, result)
            else:
                self._on_job(slot, result)
        self.bar.close()

    def shutdown(self) -> None:
        """Collect each worker's usage, close its engine and end it (safe to call twice)."""
        ray = self.ray
        for slot in self.slots:
            if slot.actor is None:
                continue
            try:
                self.usage.append({"worker": slot.index, "restarts": slot.restarts,
                                   **ray.get(slot.actor.usage.remote(), timeout=30)})
                ray.get(slot.actor.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead or stuck worker: kill it below
                pass
            ray.kill(slot.actor)
            slot.actor = None
        shutil.rmtree(self.scratch, ignore_errors=True)  # on this machine; other nodes clean their own
        self.bar.close()


def run_sweep_ray(cfg: SweepConfig, rs: RaySettings) -> dict[str, Any]:
    """Run (or finish, with ``cfg.resume``) the sweep on Ray; returns the final meta dict.

    The trace equals the serial sweep's (:func:`~speclimits.tracing.sweep.run_sweep`) apart from
    timings, part names and the ids that name the workers; ``meta["distributed"]`` says how it ran."""
    if rs.workers < 1:
        raise SpeclimitsError(f"--workers must be >= 1, got {rs.workers}")
    ray = require_ray()
    plan = plan_sweep(cfg)
    jobs = plan_jobs(plan, rs.shard_size or default_shard_size(len(plan.prompts), rs.workers))
    owns = _init_ray(ray, rs) if jobs else False
    driver = _Driver(ray, plan, jobs, rs) if jobs else None
    version = getattr(ray, "__version__", "?")
    try:
        if driver is not None:
            driver.run()
    except BaseException as exc:  # record the failed run in meta.json (the trace stays a valid partial one)
        if driver is not None:
            driver.shutdown()
        if plan.meta is not None:
            meta = dict(plan.meta)
            meta["distributed"] = _distributed_meta(plan.root, meta.get("distributed"), driver, rs, version,
                                                    status=f"failed: {type(exc).__name__}: {str(exc)[:300]}")
            write_meta(plan.root, meta)
        raise
    finally:
        if driver is not None:
            driver.shutdown()
        if owns:
            ray.shutdown()
    meta = dict(plan.meta if plan.meta is not None else read_meta(plan.root))
    meta["distributed"] = _distributed_meta(plan.root, meta.get("distributed"), driver, rs, version)
    return finalize_meta(plan.root, meta)


def _distributed_meta(root: Path, old: dict[str, Any] | None, driver: _Driver | None, rs: RaySettings,
                      ray_version: str, status: str = "complete") -> dict[str, Any]:
    """``meta["distributed"]``: this run's settings and, for every shard on disk, where it ran
    (from its shard log, so shards of earlier runs keep theirs) and this run's attempts."""
    shards = {}
    on_disk = set(list_parts(root, "rounds"))
    for name, log in read_shard_logs(root).items():
        part = log["part"]
        shards[name] = {"K": part["K"], "generation_ids": part["generation_ids"], "where": part.get("worker")}
        if "b" in part:
            shards[name]["b"] = part["b"]
        if driver is not None and name in driver.record:
            shards[name].update({k: driver.record[name][k] for k in ("attempts", "seconds", "skipped")})
    runs = list((old or {}).get("runs", []))
    runs.append({"backend": "ray", "ray_version": ray_version, "workers": rs.workers, "status": status,
                 "address": rs.address or "local", "shard_size": rs.shard_size,
                 "jobs": 0 if driver is None else len(driver.record),
                 "retried_jobs": 0 if driver is None else sum(1 for r in driver.record.values() if r["attempts"] > 1),
                 "worker_restarts": 0 if driver is None else sum(s.restarts for s in driver.slots),
                 "usage": [] if driver is None else driver.usage})
    return jsonable({"backend": "ray", "workers": rs.workers, "runs": runs, "shards": shards,
                     "parts_not_sharded": sorted(on_disk - set(shards))})


# ---------------------------------------------------------------------------
# the Oracle pass on Ray
# ---------------------------------------------------------------------------


def trace_oracle_ray(cfg: SweepConfig, k_max: int, batch: int, rs: RaySettings) -> dict[str, Any]:
    """The Oracle pass of ``speclimits trace --oracle --workers N``: the serial pass's work
    (:func:`~speclimits.tracing.oracle_mode.trace_oracle`) cut into shards of references, run by
    Ray workers (one Oracle engine each), with the same files and the same result.

    A shard is idempotent (each sequence's part is written once, named by its index, and skipped
    when on disk); a worker that dies is replaced and its shard given back (``rs.max_attempts``
    tries). The driver then rewrites ``tokens.parquet`` and writes ``meta["oracle"]`` exactly as
    the serial pass (:func:`~speclimits.tracing.oracle_mode.finish_oracle`), plus
    ``meta["oracle"]["distributed"]``: where each shard ran (kept across runs) and, per run, its
    jobs, retried shards, worker restarts and CPU seconds per worker."""
    if rs.workers < 1:
        raise SpeclimitsError(f"--workers must be >= 1, got {rs.workers}")
    plan = plan_oracle(cfg, k_max, batch)
    size = rs.shard_size or default_shard_size(len(plan.todo), rs.workers)
    jobs = [plan.todo[i: i + size] for i in range(0, len(plan.todo), size)]
    old = (read_meta(plan.root).get("oracle") or {}).get("distributed") or {}
    run: dict[str, Any] = {"address": rs.address or "local", "workers": rs.workers, "shard_size": size,
                           "jobs": len(jobs), "retried_shards": 0, "worker_restarts": 0, "usage": []}
    shards: dict[str, Any] = dict(old.get("shards") or {})  # where earlier runs' shards ran stays recorded
    if jobs:
        ray = require_ray()
        owns = _init_ray(ray, rs)
        try:
            got = _run_oracle_jobs(ray, cfg, plan, jobs, rs)
        finally:
            if owns:
                ray.shutdown()
        shards.update(got.pop("shards"))
        run.update(got)
    record = {"backend": "ray", "workers": rs.workers, "shards": shards, "runs": [*old.get("runs", []), run]}
    return finish_oracle(cfg, plan, extra={"distributed": jsonable(record)})


def _run_oracle_jobs(ray: Any, cfg: SweepConfig, plan: OraclePlan, jobs: list[list[tuple[int, Any]]],
                     rs: RaySettings) -> dict[str, Any]:
    """Hand the shards to workers until all are done; returns where each ran and the retries."""
    gpus = rs.gpus_per_worker
    if gpus is None:
        gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
    actor_cls = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(OracleWorker)
    scratch = tempfile.mkdtemp(prefix="speclimits-ray-")
    settings = sweep_config_dict(cfg)
    actors = [actor_cls.remote(settings, plan, scratch) for _ in range(min(rs.workers, len(jobs)))]
    pending = list(enumerate(jobs))
    attempts: dict[int, int] = {}
    inflight: dict[Any, tuple[int, int]] = {}
    shards: dict[str, Any] = {}
    restarts = 0
    bar = tqdm(total=sum(len(r.output_ids) - 1 for _, r in plan.todo), desc="oracle", unit="state",
               disable=not cfg.progress)

    def submit(slot: int) -> None:
        if pending:
            j, items = pending.pop(0)
            attempts[j] = attempts.get(j, 0) + 1
            inflight[actors[slot].run_job.remote(items)] = (slot, j)
            if rs.on_event is not None:
                rs.on_event("oracle_dispatch", {"worker": slot, "shard": j, "attempt": attempts[j]})

    try:
        for slot in range(len(actors)):
            submit(slot)
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            slot, j = inflight.pop(ready[0])
            try:
                res = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:  # the worker died: a fresh one retries the shard
                if rs.on_event is not None:
                    rs.on_event("oracle_died", {"worker": slot, "shard": j})
                if attempts[j] >= rs.max_attempts:
                    raise SpeclimitsError(f"distributed Oracle pass: shard {j} (sequences "
                                          f"{[i for i, _ in jobs[j]]}) failed {attempts[j]} times; last error: "
                                          f"{exc}") from None
                pending.insert(0, (j, jobs[j]))
                actors[slot] = actor_cls.remote(settings, plan, scratch)
                restarts += 1
                submit(slot)
                continue
            except ray.exceptions.RayTaskError as exc:  # a Python error inside the shard: would repeat
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                raise SpeclimitsError(f"distributed Oracle pass: worker {slot} failed: {cause}") from None
            first = jobs[j][0][0]
            shards[f"{first:05d}"] = {"sequences": [i for i, _ in jobs[j]], "where": res["where"],
                                      "attempts": attempts[j], "seconds": round(res["seconds"], 3)}
            bar.update(sum(len(r.output_ids) - 1 for _, r in jobs[j]))
            if rs.on_event is not None:
                rs.on_event("oracle_done", {"worker": slot, "shard": j, "pid": res["where"]["pid"]})
            submit(slot)
    finally:
        bar.close()
        usage = []
        for slot, actor in enumerate(actors):
            try:
                usage.append({"worker": slot, **ray.get(actor.usage.remote(), timeout=30)})
                ray.get(actor.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead or stuck worker: kill it below
                pass
            ray.kill(actor)
        shutil.rmtree(scratch, ignore_errors=True)
    return {"shards": shards, "retried_shards": sum(1 for a in attempts.values() if a > 1),
            "worker_restarts": restarts, "usage": usage}


# ---------------------------------------------------------------------------
# a loopback-only network namespace for local Ray sessions (tests, CI, benchmarks)
# ---------------------------------------------------------------------------


def loopback_command(argv: list[str]) -> list[str]:
    """``argv`` wrapped to run in a new network namespace whose only interface is ``lo`` (up).

    Ray then sees 127.0.0.1 as the node address and nothing it starts can reach, or be reached
    from, another machine. Uses ``unshare -n`` as root, ``unshare -rn`` (a user namespace) otherwise."""
    flags = "-n" if os.geteuid() == 0 else "-rn"
    return ["unshare", flags, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def loopback_env(home: str | Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a Ray session in :func:`loopback_command`: usage statistics off, a scratch
    ``HOME`` (Ray 2.60 writes an auth token under ``~/.ray``), token auth off (nothing outside the
    namespace can connect), workers at normal priority, and the CPU engine defaults."""
    env = dict(os.environ if base is None else base)
    env.update({"HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                # Ray renices its workers to 15; here they are compared with a serial sweep at the
                # default priority on a shared machine, so they keep it
                "RAY_worker_niceness": "0"})
    for key, value in eng.CPU_ENV_DEFAULTS.items():
        env.setdefault(key, value)
    return env


def loopback_available() -> str | None:
    """None when :func:`loopback_command` works here, else why not (one line)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip (util-linux, iproute2) not found"
    probe = subprocess.run(loopback_command(["ip", "-o", "link", "show"]), capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()[:200]}"
    links = [line.split(":")[1].strip() for line in probe.stdout.splitlines() if ":" in line]
    if links != ["lo"]:
        return f"the namespace has other interfaces: {links}"
    return None
