"""Distributed K sweeps and Oracle passes on Ray: ``speclimits trace ... --workers N`` (or ``--ray-address``).

The work is cut into jobs (:class:`Job`): a sweep's ``(K, prompt shard)`` pairs (with ``--batch``, whole
batches of one ``(b, K)``) or shards of Oracle references. Each worker is an actor with one engine
(``num_gpus=1`` on a GPU cluster). One driver (:class:`_Driver`) hands out the jobs with one call in
flight per worker, because Ray's own retries (``max_restarts`` / ``max_task_retries``) run queued calls
out of order; :class:`JobQueue` keeps a worker on its K, so each K is built about once per worker. A dead
worker (``RayActorError``) is replaced and its job given back (``max_attempts`` tries). Jobs are
idempotent: a sweep job writes one shard named by a hash of its specification, rounds part last (a re-run
skips it); an Oracle job skips sequences whose part is on disk. meta.json records, under ``distributed``,
where each shard ran, the attempts and each worker's usage.

Network: this module never chooses addresses, ports or interfaces; usage statistics are off unless the user
set ``RAY_USAGE_STATS_ENABLED``. Tests and benchmarks run Ray only in a loopback-only network namespace
(:func:`loopback_command`).
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import jsonable
from speclimits.trace.io import list_parts, read_meta, read_shard_logs, target_top_k, write_meta
from speclimits.tracing import engine as eng
from speclimits.tracing.oracle_mode import OraclePlan, finish_oracle, oracle_engine, plan_oracle, run_oracle_parts
from speclimits.tracing.prompts import Prompt
from speclimits.tracing.sweep import (Batch, EngineHolder, SweepConfig, SweepPlan, ensure_meta, finalize_meta,
                                      plan_sweep, run_batches)

RAY_HINT = "--workers / --ray-address need Ray: pip install -e '.[ray]' (ray==2.60.0)"


def require_ray() -> Any:
    """Import Ray or raise a one-line SpeclimitsError naming the install command."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before the import: Ray reads it early
    try:
        import ray  # Ray is an optional extra: imported only for a distributed sweep
    except ImportError:
        raise SpeclimitsError(RAY_HINT) from None
    return ray


@dataclass(frozen=True)
class Job:
    """One unit of distributed work: the generations ``gids`` of ``prompts`` (indices) at one K, in batches
    of ``sizes`` (of batch size ``b``; empty in a batch-1 sweep: batches of one). ``name``: the shard's part name (:func:`job_name`). An Oracle job
    has its sequence indices as ``prompts`` and ``gids``, K = k_max, and is named ``{first index:05d}``."""

    k_index: int
    K: int
    prompts: tuple[int, ...]
    gids: tuple[int, ...]
    name: str
    b: int = 1
    b_index: int = 0
    sizes: tuple[int, ...] = ()

    def batches(self) -> list[Batch]:
        out, start = [], 0
        for n in self.sizes or (1,) * len(self.prompts):
            out.append(Batch(self.b_index, self.b, self.k_index, self.K, self.prompts[start: start + n],
                             self.gids[start: start + n]))
            start += n
        return out


def job_name(K: int, gids: tuple[int, ...], prompt_ids: list[str], settings: dict[str, Any],
             b: int | None = None) -> str:
    """``part-k{K:03d}-g{first gid:06d}-{hash}`` (``part-b{b:03d}-k…`` in a batch sweep; ``b`` None: a
    batch-1 sweep's job), the hash covering K (and b), the gids, the prompt ids and the sweep settings, so
    the same job always writes the same files and a different one never does."""
    spec: dict[str, Any] = {"K": K, "gids": list(gids), "prompts": prompt_ids, "settings": settings}
    if b is not None:
        spec["b"] = b
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]
    prefix = "part-" if b is None else f"part-b{b:03d}-"
    return f"{prefix}k{K:03d}-g{gids[0]:06d}-{digest}"


def plan_jobs(plan: SweepPlan, shard_size: int) -> list[Job]:
    """The jobs of ``plan.todo`` in sweep order: per K and batch size b, its batches left in jobs of
    ``shard_size // b`` whole batches (at least one), so that a batch runs in one engine, in one job."""
    if shard_size < 1:
        raise SpeclimitsError(f"--shard-size must be >= 1, got {shard_size}")
    jobs, batches = [], plan.batches()
    for ki, K in enumerate(plan.k_values):
        for bi, b in enumerate(plan.batch_sizes):
            mine = [bt for bt in batches if bt.k_index == ki and bt.b_index == bi]
            per_job = max(1, shard_size // b)
            for start in range(0, len(mine), per_job):
                group = mine[start: start + per_job]
                prompts = tuple(pi for bt in group for pi in bt.prompts)
                gids = tuple(g for bt in group for g in bt.gids)
                b_sweep = b if plan.batch_sweep else None
                name = job_name(K, gids, [plan.prompts[pi].id for pi in prompts], plan.settings, b=b_sweep)
                jobs.append(Job(ki, K, prompts, gids, name, b=b, b_index=bi,
                                sizes=tuple(len(bt.gids) for bt in group) if b_sweep else ()))
    return jobs


def default_shard_size(n_prompts: int, workers: int) -> int:
    """Prompts per job when the user gives none: about four jobs per worker and K, at most 16
    prompts (a killed worker loses at most one job's generations)."""
    return max(1, min(16, -(-n_prompts // (4 * workers))))


class JobQueue:
    """The jobs not yet handed out. :meth:`next_for` prefers a job of the worker's current K (no engine
    rebuild), then one of a K no other worker holds, then any; :meth:`give_back` returns a job to the front."""

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

class _Worker:
    """One engine, many jobs, in a Ray worker process: :meth:`start` builds the engine of a K, :meth:`run_job`
    runs one job. Its own TMPDIR (each engine leaves ``vllm_dist_*`` files there) lies in the driver's
    ``scratch`` folder, which the driver removes (also after a killed worker)."""

    builds = 0  # engines built

    def __init__(self, scratch: str | None) -> None:
        if scratch is not None:
            Path(scratch).mkdir(parents=True, exist_ok=True)
        self.tmpdir = tempfile.mkdtemp(prefix="speclimits-ray-worker-", dir=scratch)
        self._old_tmpdir = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = self.tmpdir
        tempfile.tempdir = None
        eng.apply_env_defaults()
        self.where = {"host": socket.gethostname(), "pid": os.getpid()}
        self.jobs_run = 0

    def start(self, K: int, warmup_prompt: int) -> dict[str, Any]:
        """Build (or keep) the engine for K; returns where this runs and the model info."""
        vllm = eng.require_vllm()
        self.where["node"] = require_ray().get_runtime_context().get_node_id()[:16]
        return {"where": dict(self.where), "vllm_version": getattr(vllm, "__version__", "?"),
                **self._build(K, warmup_prompt)}

    def run_job(self, job: Job, *args: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        got = self._run(job, *args)
        return {**got, "seconds": round(time.perf_counter() - t0, 3), "where": dict(self.where)}

    def usage(self) -> dict[str, Any]:
        return {"cpu_s": time.process_time(), "engine_builds": self.builds, "jobs": self.jobs_run, **self.where}

    def close(self) -> None:
        self._close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        if self._old_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self._old_tmpdir
        tempfile.tempdir = None


class SweepWorker(_Worker):
    """A sweep's worker (``cfg``: the :class:`SweepConfig` as a dict; the prompts are sent, so workers need
    not read the prompt file)."""

    def __init__(self, cfg: dict[str, Any], prompts: list[Prompt], k_values: list[int],
                 scratch: str | None = None) -> None:
        super().__init__(scratch)
        self.cfg = SweepConfig(**cfg)
        self.plan = SweepPlan(self.cfg, prompts, Path(self.cfg.out), {}, k_values, None, [], self.cfg.sizes)
        self.holder = EngineHolder(self.cfg, prompts, k_values)

    @property
    def builds(self) -> int:
        return self.holder.builds

    def _build(self, K: int, warmup_prompt: int) -> dict[str, Any]:
        self.holder.ensure(K, warmup_prompt)
        return {"info": self.holder.info, "kwargs": self.holder.kwargs}

    def _run(self, job: Job, top_k: int) -> dict[str, Any]:
        done = (self.plan.root / "rounds.parquet" / f"{job.name}.parquet").exists()
        if not done:
            llm = self.holder.ensure(job.K, job.prompts[0])
            run_batches(self.plan, self.holder, llm, job.K, job.batches(), top_k=top_k, shard=job.name,
                        worker=dict(self.where))
            self.jobs_run += 1
        return {"skipped": done}

    def _close(self) -> None:
        self.holder.close()


class OracleWorker(_Worker):
    """An Oracle pass's worker: one Oracle engine (:func:`~speclimits.tracing.oracle_mode.oracle_engine`) for
    every shard."""

    def __init__(self, cfg: dict[str, Any], plan: OraclePlan, scratch: str | None = None) -> None:
        super().__init__(scratch)
        self.cfg, self.plan, self.llm = SweepConfig(**cfg), plan, None

    def _build(self, K: int, warmup_prompt: int) -> dict[str, Any]:
        if self.llm is None:
            self.llm = oracle_engine(self.cfg, self.plan)
            self.builds += 1
        return {}

    def _run(self, job: Job) -> dict[str, Any]:
        run_oracle_parts(self.llm, self.plan, [(i, self.plan.refs[i]) for i in job.gids], progress=False)
        self.jobs_run += 1
        return {"sequences": list(job.gids)}

    def _close(self) -> None:
        if self.llm is not None:
            eng.close_llm(self.llm)
            self.llm = None


@dataclass
class RaySettings:
    """How to run a distributed sweep. ``address``: an existing cluster (None: a local Ray instance with
    ``workers`` CPUs); a worker takes one GPU when the cluster has GPUs. ``runtime_env``: passed to ``ray.init``. ``on_event(kind, info)``: called on ``dispatch``, ``started``, ``done``, ``died``."""

    workers: int = 2
    address: str | None = None
    shard_size: int | None = None
    max_attempts: int = 3
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


def _init_ray(ray: Any, rs: RaySettings) -> bool:
    """Connect to Ray; True when this call started it. Workers of a local instance import the driver's
    speclimits (its folder first on PYTHONPATH)."""
    if ray.is_initialized():
        return False
    if rs.address:
        ray.init(address=rs.address, runtime_env=rs.runtime_env, log_to_driver=False)
        return True
    path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=rs.workers, include_dashboard=False, log_to_driver=False,
             runtime_env=rs.runtime_env or {"env_vars": {"PYTHONPATH": path}})
    return True


class _Driver:
    """Runs ``jobs`` on up to ``rs.workers`` actors of ``worker_cls`` (built from ``args`` and a scratch
    folder), one call in flight per actor: a worker whose engine has another K (or none) gets ``start``
    first. ``on_start(result)`` returns the extra arguments of ``run_job``. ``what`` and ``label`` (formatted
    with the job and its ``ids``) name a failure. :meth:`close` (always call it) ends the workers and Ray."""

    def __init__(self, rs: RaySettings, worker_cls: type, args: tuple, jobs: list[Job], bar: Any, what: str,
                 label: str, on_start: Callable[[dict[str, Any]], tuple] | None = None) -> None:
        self.rs, self.worker_cls, self.args, self.bar = rs, worker_cls, args, bar
        self.what, self.label, self.on_start = what, label, on_start
        self.queue = JobQueue(jobs)
        self.slots = [_Slot(i) for i in range(min(rs.workers, len(jobs)))]
        self.attempts: dict[str, int] = {}
        self.record: dict[str, dict[str, Any]] = {}  # per job done: the worker's result and the attempts
        self.usage: list[dict[str, Any]] = []
        self.inflight: dict[Any, tuple[_Slot, str]] = {}
        self.job_args: tuple = ()
        self.ray: Any = None
        self.owns_ray, self.scratch = False, None

    def _event(self, kind: str, **info: Any) -> None:
        if self.rs.on_event is not None:
            self.rs.on_event(kind, info)

    def _spawn(self, slot: _Slot) -> None:
        slot.actor = self.actor_cls.remote(*self.args, self.scratch)
        slot.K = None

    def _dispatch(self, slot: _Slot) -> None:
        others = {s.K for s in self.slots if s is not slot and s.K is not None}
        slot.job = job = self.queue.next_for(slot.K, others)
        if job is None:
            return
        self.attempts[job.name] = self.attempts.get(job.name, 0) + 1
        if slot.K != job.K:
            slot.K = job.K
            self.inflight[slot.actor.start.remote(job.K, job.prompts[0])] = (slot, "start")
        else:
            self._submit(slot)
        self._event("dispatch", worker=slot.index, job=job.name, K=job.K, attempt=self.attempts[job.name],
                    pid=slot.where.get("pid"))

    def _submit(self, slot: _Slot) -> None:
        self.inflight[slot.actor.run_job.remote(slot.job, *self.job_args)] = (slot, "job")

    def _on_result(self, slot: _Slot, kind: str, result: dict[str, Any]) -> None:
        if kind == "start":
            slot.where = result["where"]
            if self.on_start is not None:
                self.job_args = self.on_start(result)
            self._submit(slot)
            self._event("started", worker=slot.index, pid=slot.where.get("pid"), K=slot.K)
            return
        job = slot.job
        self.record[job.name] = {**result, "attempts": self.attempts[job.name]}
        self.bar.set_postfix_str(f"done: {job.name}")
        self.bar.update(len(job.gids))
        self._event("done", worker=slot.index, job=job.name, pid=result["where"].get("pid"))
        self._dispatch(slot)

    def _on_death(self, slot: _Slot, exc: Exception) -> None:
        job = slot.job
        self._event("died", worker=slot.index, job=job.name, pid=slot.where.get("pid"))
        if self.attempts[job.name] >= self.rs.max_attempts:
            raise SpeclimitsError(f"{self.what}: {self.label.format(job=job, ids=list(job.gids))} failed "
                                  f"{self.attempts[job.name]} times; last error: {exc}")
        self.queue.give_back(job)
        slot.restarts += 1
        slot.where = {}
        self._spawn(slot)
        self._dispatch(slot)

    def run(self) -> None:
        if not self.slots:
            return
        self.ray = ray = require_ray()
        self.owns_ray = _init_ray(ray, self.rs)
        gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
        self.actor_cls = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(self.worker_cls)
        self.scratch = tempfile.mkdtemp(prefix="speclimits-ray-")
        for slot in self.slots:
            self._spawn(slot)
        for slot in self.slots:
            self._dispatch(slot)
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
                raise SpeclimitsError(f"{self.what}: worker {slot.index} failed: {cause}") from None
            self._on_result(slot, kind, result)

    def close(self) -> None:
        """Collect each worker's usage and end it (safe to call twice)."""
        for slot in self.slots:
            if slot.actor is None:
                continue
            try:
                self.usage.append({"worker": slot.index, "restarts": slot.restarts,
                                   **self.ray.get(slot.actor.usage.remote(), timeout=30)})
                self.ray.get(slot.actor.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead or stuck worker: kill it below
                pass
            self.ray.kill(slot.actor)
            slot.actor = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)  # on this machine; other nodes clean their own
        self.bar.close()
        if self.owns_ray:
            self.ray.shutdown()
            self.owns_ray = False

    def summary(self, shard_size: int | None) -> dict[str, Any]:
        return {"address": self.rs.address or "local", "workers": self.rs.workers, "shard_size": shard_size,
                "jobs": len(self.record), "retried_jobs": sum(r["attempts"] > 1 for r in self.record.values()),
                "worker_restarts": sum(s.restarts for s in self.slots), "usage": self.usage}


def run_sweep_ray(cfg: SweepConfig, rs: RaySettings) -> dict[str, Any]:
    """Run (or finish, with ``cfg.resume``) the sweep on Ray; returns the final meta dict. The trace equals
    the serial sweep's apart from timings, part names and ``meta["distributed"]``."""
    if rs.workers < 1:
        raise SpeclimitsError(f"--workers must be >= 1, got {rs.workers}")
    version = getattr(require_ray(), "__version__", "?")
    plan = plan_sweep(cfg)
    jobs = plan_jobs(plan, rs.shard_size or default_shard_size(len(plan.prompts), rs.workers))
    bar = tqdm(total=plan.n_total, initial=plan.n_total - len(plan.todo), desc="trace", unit="gen",
               disable=not cfg.progress)

    def on_start(r: dict[str, Any]) -> tuple[int]:  # the first engine up writes meta.json before any shard
        return (int(target_top_k(ensure_meta(plan, r["info"], r["kwargs"], r["vllm_version"]))),)

    driver = _Driver(rs, SweepWorker, (asdict(cfg), plan.prompts, plan.k_values), jobs, bar, "distributed sweep",
                     "job {job.name} (K={job.K}, generations {ids})", on_start)
    try:
        driver.run()
    except BaseException as exc:  # record the failed run in meta.json (the trace stays a valid partial one)
        driver.close()
        if plan.meta is not None:
            write_meta(plan.root, _with_distributed(plan.root, plan.meta, driver, rs, version,
                                                    f"failed: {type(exc).__name__}: {str(exc)[:300]}"))
        raise
    finally:
        driver.close()
    meta = _with_distributed(plan.root, plan.meta if plan.meta is not None else read_meta(plan.root), driver, rs,
                             version)
    return finalize_meta(plan.root, meta)


def _with_distributed(root: Path, meta: dict[str, Any], driver: _Driver, rs: RaySettings, ray_version: str,
                      status: str = "complete") -> dict[str, Any]:
    """``meta`` with ``distributed``: this run added to the earlier runs and, for every shard on disk, where
    it ran (from its shard log) and this run's attempts."""
    shards = {}
    for name, log in read_shard_logs(root).items():
        part = log["part"]
        shards[name] = {"K": part["K"], "generation_ids": part["generation_ids"], "where": part.get("worker")}
        if "b" in part:
            shards[name]["b"] = part["b"]
        if name in driver.record:
            shards[name].update({k: driver.record[name][k] for k in ("attempts", "seconds", "skipped")})
    run = {"backend": "ray", "ray_version": ray_version, "status": status, **driver.summary(rs.shard_size)}
    runs = [*(meta.get("distributed") or {}).get("runs", []), run]
    return {**meta, "distributed": jsonable({"backend": "ray", "workers": rs.workers, "runs": runs, "shards": shards,
                                             "parts_not_sharded": sorted(set(list_parts(root, "rounds")) - set(shards))})}


def trace_oracle_ray(cfg: SweepConfig, k_max: int, batch: int, rs: RaySettings) -> dict[str, Any]:
    """The Oracle pass of ``speclimits trace --oracle --workers N``: :func:`~speclimits.tracing.oracle_mode.trace_oracle`
    in shards of references on Ray workers, same files, plus ``meta["oracle"]["distributed"]``."""
    if rs.workers < 1:
        raise SpeclimitsError(f"--workers must be >= 1, got {rs.workers}")
    plan = plan_oracle(cfg, k_max, batch)
    size = rs.shard_size or default_shard_size(len(plan.todo), rs.workers)
    shards = [tuple(i for i, _ in plan.todo[s: s + size]) for s in range(0, len(plan.todo), size)]
    bar = tqdm(total=len(plan.todo), desc="oracle", unit="seq", disable=not cfg.progress)
    driver = _Driver(rs, OracleWorker, (asdict(cfg), plan), [Job(0, k_max, ids, ids, f"{ids[0]:05d}") for ids in shards],
                     bar, "distributed Oracle pass", "shard {job.name} (sequences {ids})")
    try:
        driver.run()
    finally:
        driver.close()
    old = (read_meta(plan.root).get("oracle") or {}).get("distributed") or {}
    record = {"backend": "ray", "workers": rs.workers, "shards": {**old.get("shards", {}), **driver.record},
              "runs": [*old.get("runs", []), driver.summary(size)]}
    return finish_oracle(cfg, plan, extra={"distributed": jsonable(record)})


def loopback_command(argv: list[str]) -> list[str]:
    """``argv`` wrapped to run in a new network namespace whose only interface is ``lo`` (up): Ray then uses
    127.0.0.1 and nothing it starts can reach another machine. ``unshare -n`` as root, else ``unshare -rn``."""
    flags = "-n" if os.geteuid() == 0 else "-rn"
    return ["unshare", flags, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def loopback_env(home: str | Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a Ray session in :func:`loopback_command`: usage statistics off, a scratch ``HOME``
    (Ray 2.60 writes an auth token under ``~/.ray``), token auth off (nothing outside the namespace can
    connect), workers at normal priority, and the CPU engine defaults."""
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
