"""The training loop: ``rb.batches`` → GRPO steps → checkpoints → versions on ``rb.resources``.

Order of one step, and why it survives ``kill -9`` anywhere:

1. accumulate ``groups_per_step`` groups (decoded, deduplicated by ``group_id``, staleness-checked);
2. optimiser step;
3. checkpoint ``step-N`` atomically — weights, optimizer, the *offsets consumed through this step*,
   the version it publishes as, the group ids seen;
4. publish ``ResourceVersion`` (``rb.resources``, key = resource name) and ``TrainStep`` (``rb.metrics``);
5. commit the offsets to the consumer group.

On start the trainer loads the newest checkpoint and seeks ``rb.batches`` to *its* offsets (never the
committed ones, which may lag it). A crash before (3) retrains the same groups (the step never
happened); a crash between (3) and (4) finds the checkpoint's version missing from ``rb.resources``
and publishes it (same version, no gap, no reuse); a crash after (4) resumes past the step. Version
numbers are the max of the manifest's and the topic's latest, plus one.

Set ``ROLLOUTBUS_TRAINER_CRASH_AT=<point>:<step>`` (points: ``before_step``, ``after_checkpoint``,
``after_publish``) to SIGKILL the process at that point of that step — used only by the crash tests.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from foundation.errors import ConfigError, DecodeError, KafkaUnavailable, ValidationError
from foundation.config import Topics
from foundation.kafka_admin import AUTHENTICATION_CODES, AUTHORIZATION_CODES, kafka_failure
from schemas.codec import encode
from schemas.models import DeadLetter, GroupBatch, ResourceVersion, TrainStep

log = logging.getLogger(__name__)
CRASH_ENV = "ROLLOUTBUS_TRAINER_CRASH_AT"
CRASH_POINTS = ("before_step", "after_checkpoint", "after_publish")
SEEN_LIMIT = 100_000


def staleness_weight(batch_version: int | None, current_version: int, max_staleness: int, stale_weight: float,
                     min_version: int = 0) -> float | None:
    """Loss weight for a batch sampled under ``batch_version``; None means drop it.

    Lag ``< max_staleness`` → 1; lag ``== max_staleness`` (> 0) → ``stale_weight``; beyond → drop. A version
    below ``min_version`` is dropped whatever its lag (the policy that served it was replaced: an SFT ran since).
    A batch without a version (sampled outside the loop) is trained on at full weight.
    """
    if batch_version is None:
        return 1.0
    if batch_version < min_version:
        return None
    lag = current_version - batch_version
    if lag > max_staleness:
        return None
    if lag == max_staleness and lag > 0:
        return stale_weight
    return 1.0


BACKLOG_POLICIES = ("oldest", "newest", "sample")


def select_backlog(pending: list[tuple[GroupBatch, float]], n: int, policy: str,
                   rng: random.Random) -> tuple[list[tuple[GroupBatch, float]], list[tuple[GroupBatch, float]]]:
    """The ``n`` groups a step trains on out of what waits (in the order they came), and the groups it skips.

    ``oldest``: the first ``n``, the rest wait for the next step (what the trainer did before there was a choice);
    ``newest``: the ``n`` sampled under the newest versions, the latest arrivals among equals, the rest skipped;
    ``sample``: ``n`` drawn uniformly, the rest skipped."""
    if policy not in BACKLOG_POLICIES:
        raise ValueError(f"backlog policy must be one of {BACKLOG_POLICIES}, got {policy!r}")
    if len(pending) <= n or policy == "oldest":
        return pending[:n], []
    if policy == "newest":
        versions = [behaviour_version(batch) for batch, _ in pending]
        ranked = sorted(range(len(pending)), key=lambda i: (-1 if versions[i] is None else versions[i], i))
        chosen = set(ranked[-n:])
    else:
        chosen = set(rng.sample(range(len(pending)), n))
    return ([p for i, p in enumerate(pending) if i in chosen], [p for i, p in enumerate(pending) if i not in chosen])


def behaviour_version(batch: GroupBatch) -> int | None:
    """The oldest policy version that generated the group's tokens: the versions its transitions were served by (the
    LLM proxy records each response's), else the one the runner saw when the rollout started (``resource_version``).
    A server that trails the newest version (a reload under way, ``serve --follow-lag``) makes them differ: staleness
    is the behaviour policy's. Pure."""
    served = [t.resource_version for t in batch.transitions if t.resource_version is not None]
    return min(served) if served else batch.resource_version


def crash_point(point: str, step: int) -> None:
    """Test hook: SIGKILL ourselves at ``point`` of ``step`` when the env var asks for it."""
    want = os.environ.get(CRASH_ENV)
    if want and want == f"{point}:{step}":
        log.warning("%s=%s: killing the trainer now", CRASH_ENV, want)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Counters:
    """Consumption outcomes since the last step (reported in its TrainStep metrics)."""

    received: int = 0
    duplicates: int = 0
    dropped_stale: int = 0
    downweighted_stale: int = 0
    unversioned: int = 0
    dropped_zero_variance: int = 0
    skipped_backlog: int = 0
    dead_lettered: int = 0
    decode_s: float = 0.0

    def as_metrics(self) -> dict[str, float]:
        return {
            "batches_received": float(self.received),
            "batches_duplicate": float(self.duplicates),
            "batches_dropped_stale": float(self.dropped_stale),
            "batches_downweighted_stale": float(self.downweighted_stale),
            "batches_unversioned": float(self.unversioned),
            "batches_dropped_zero_variance": float(self.dropped_zero_variance),
            "batches_skipped_backlog": float(self.skipped_backlog),
            "batches_dead_lettered": float(self.dead_lettered),
        }


@dataclass
class LoopState:
    step: int
    version: int  # the last version published (or to publish) by the newest checkpoint
    run_id: str
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    seen: "OrderedDict[str, None]" = field(default_factory=OrderedDict)


class Trainer:
    """Owns the model, the backend, the checkpoints and the Kafka clients of one training process."""

    def __init__(self, settings: Any, device: Any = None, health: Any = None) -> None:
        """``device``: a ``torch.device`` (default: ``settings.train_device`` resolved); ``health``: the
        :class:`~trainer.health.TrainerHealth` the probes read (default: one nobody serves)."""
        import torch

        from trainer.checkpoint import CheckpointStore
        from trainer.device import micro_batch_tokens, resolve_device, resolve_precision
        from trainer.grpo import GRPOConfig
        from trainer.health import TrainerHealth
        from trainer.model import base_model_name, build_tiny, load_policy
        from trainer.resources import read_latest
        from trainer.torch_backend import TorchGRPOBackend

        self.s = settings
        self.device = device if device is not None else resolve_device(settings.train_device)
        self.health = health if health is not None else TrainerHealth(settings.train_stall_s)
        self.topics = Topics(settings.topic_prefix)
        self.credit = ""  # the credit mode(s) of the last step's groups
        self.conf = settings.kafka_conf()
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        torch.manual_seed(settings.train_seed)
        self.store = CheckpointStore(settings.resolved_checkpoint_dir())
        # Rank 0 (or the only process) writes checkpoints, publishes and reports; torchrun sets RANK before anything here.
        self.main_rank = int(os.environ.get("RANK", "0")) == 0
        if self.main_rank:  # the one rank that writes checkpoints cleans them: no race
            for p in self.store.clean_partial():
                log.info("removed a partial checkpoint %s (crash mid-write)", p)
        published = read_latest(self.conf, self.topics.resources).get(settings.resource_name)
        self.published_version = published.version if published else None
        latest = self.store.latest()
        from trainer import distributed

        self.ranks = distributed.from_env(self.device)  # several ranks under torchrun: the model sharded (FSDP2)
        # Several ranks loading a model directory: rank 0 alone reads the weights, the others build its shape on the
        # meta device and get their shards from rank 0 (distributed.fill_from_rank0) once it is sharded.
        self._meta_init = self.ranks is not None and (latest is not None or settings.train_model != "tiny")
        where = "meta" if self._meta_init and self.ranks is not None and not self.ranks.main else "cpu"
        if latest is not None:
            path, manifest = latest
            self.model, self.tok = load_policy(path, device=where)
            self.base_model = manifest.base_model
            self.state = LoopState(manifest.step, manifest.version, manifest.run_id, manifest.offsets,
                                   OrderedDict((g, None) for g in manifest.seen_group_ids))
            self._latest_manifest = manifest
            log.info("resuming from %s (step %d, version %d)", path, manifest.step, manifest.version)
        else:
            if settings.train_model == "tiny":
                self.model, self.tok = build_tiny(seed=settings.train_seed)
            else:
                self.model, self.tok = load_policy(settings.train_model, device=where)
            self.base_model = base_model_name(self.model, settings.train_model)
            first = 0 if self.published_version is None else self.published_version + 1
            self.state = LoopState(0, first, uuid.uuid4().hex[:12])
            self._latest_manifest = None
        # Weights are read on the CPU, then moved: the backend builds each batch on the model's device.
        if where != "meta":
            self.model.to(self.device)
        log.info("training on %s", self.device)
        from trainer.model import train_top_layers

        if settings.activation_checkpointing:  # recompute each layer's activations in backward: memory for compute
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if settings.lora_rank:
            from trainer.lora import LoraSettings, apply_lora

            if settings.train_layers:
                raise ConfigError("--lora-rank trains adapters on every layer: leave --train-layers at 0")
            self.lora = LoraSettings(settings.lora_rank, settings.lora_alpha, tuple(settings.lora_targets.split(",")))
            self.model = apply_lora(self.model, self.lora)
            # the checkpoint whose weights the adapters start on: the one resumed from, else this run's step 0
            self.lora_base_step = latest[1].step if latest is not None else 0
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        else:
            self.lora = None
            trainable = train_top_layers(self.model, settings.train_layers)
        log.info("%d of %d parameters are trained", trainable, sum(p.numel() for p in self.model.parameters()))
        self.leader = distributed.Leader(self.ranks) if self.ranks is not None and self.ranks.main else None
        if self.ranks is not None:
            self._shard(self.model)
            log.info("rank %d of %d: the model sharded by FSDP2%s", self.ranks.rank, self.ranks.world,
                     ", its shard from rank 0's weights (built on the meta device)" if where == "meta" else "")
        ref = None
        if settings.kl_beta > 0:
            ref = self._load_reference(where)
            if self.ranks is not None:
                self._shard(ref)  # each rank holds its shard of the reference too, as of the policy
        try:
            grpo = GRPOConfig(settings.clip_eps, settings.clip_eps_high, settings.loss_agg, settings.kl_beta, settings.max_response_len,  # type: ignore[arg-type]
                              settings.policy_loss, settings.is_cap)
        except ValueError as exc:
            raise ConfigError(f"bad GRPO setting: {exc}") from exc
        self.backend = TorchGRPOBackend(
            self.model,
            grpo=grpo,
            lr=settings.lr, weight_decay=settings.weight_decay, max_grad_norm=settings.max_grad_norm,
            micro_batch_tokens=micro_batch_tokens(settings.micro_batch_tokens, self.device), ref_model=ref,
            temperature=settings.train_temperature, pad_id=self.tok.pad_id,
            autocast=resolve_precision(settings.train_precision, self.device), ranks=self.ranks,
            share_prefix=settings.share_prompts, updates_per_batch=settings.updates_per_batch,
            mini_batches=settings.mini_batches,
        )
        log.info("micro-batches of %d tokens, forward passes in %s", self.backend.micro_batch_tokens,
                 "float32" if self.backend.autocast is None else f"{self.backend.autocast} autocast")
        if latest is not None and self.lora is not None:
            log.info("LoRA: new adapters on %s's merged weights; the optimizer starts afresh", latest[0].name)
        elif latest is not None:
            sharded = self.store.sharded_optimizer(latest[0])
            opt = self.store.load_optimizer(latest[0]) if sharded is None else None
            trained = str(latest[1].config.get("train_layers", settings.train_layers))
            if (opt is not None or sharded is not None) and trained != str(settings.train_layers):
                # Another trainable set (an SFT over every layer, then GRPO over the top N): AdamW's moments are
                # per trained parameter, so they cannot carry over; the weights do.
                log.warning("checkpoint %s trained --train-layers %s, this run --train-layers %d: its optimizer state does "
                            "not carry over, the optimizer starts afresh on its weights", latest[0].name, trained,
                            settings.train_layers)
            elif sharded is not None:  # several ranks wrote it: resharded to this run's ranks (or one process)
                self.backend.load_sharded_optimizer_state(sharded)
                log.info("optimizer state: %d ranks' shards (%s), resharded to %d", len(list(sharded.glob("*.distcp"))),
                         sharded, self.ranks.world if self.ranks is not None else 1)
            elif opt is not None:
                self.backend.load_optimizer_state(opt)
        self.counters = Counters()
        self._backlog_rng = random.Random(settings.train_seed)
        self.pending: list[tuple[GroupBatch, float]] = []
        self._dead_letters: list[tuple[str, bytes]] = []  # (key, DeadLetter) waiting for the next checkpoint (_dead_letter)
        self._producer: Any = None
        self._consumer: Any = None
        self._delivery_errors: list[tuple[str, Any]] = []  # (action, KafkaError)
        self._last_data = time.monotonic()
        self._version_steps: dict[int, int] = {}  # version → checkpoint step, as published by this process
        self.validator = self._validator()
        from foundation.trackers import Trackers

        # The trackers (--report-to): the run's name is its resource and run id.
        self.trackers = Trackers.open(settings.report_to if self.main_rank else "",
                                      settings.resolved_tracker_dir(), f"{settings.resource_name}-{self.state.run_id}",
                                      self._config())
        self._tracked_scores: set[int] = set()  # versions whose validation score the trackers have

    # ------------------------------------------------------------------ setup

    def _validator(self) -> Any:
        """The validation of each version when a validation set is given (see :mod:`trainer.validation`)."""
        from trainer.validation import Validator, load_tasks

        if self.s.validation_tasks is None:
            return None
        inputs = load_tasks(self.s.validation_tasks)

        def client() -> Any:
            from foundation.clickhouse import connect

            return connect(self.s.dsn, database=self.s.clickhouse_database, create_database=False)

        log.info("validation: %d tasks for %s, early stop after %s", len(inputs),
                 "every version" if self.s.validate_every == 1 else f"every {self.s.validate_every}th version",
                 f"{self.s.early_stop_patience} versions without a better score" if self.s.early_stop_patience else "never")
        return Validator(inputs, self.state.run_id, self.topics.tasks, self._publish, client,
                         every=self.s.validate_every, patience=self.s.early_stop_patience)

    def _load_reference(self, where: str = "cpu") -> Any:
        """The frozen reference for KL: the base model (rebuilt from seed, or re-read from its path; on the meta
        device where this rank gets its shard from rank 0)."""
        from trainer.model import build_tiny, load_policy

        if self.s.train_model == "tiny":
            return build_tiny(seed=self.s.train_seed)[0].to(self.device)
        model = load_policy(self.s.train_model, device=where)[0]
        return model if where == "meta" else model.to(self.device)

    def _shard(self, model: Any) -> None:
        """``model`` sharded by FSDP2 on this rank; where the ranks build a model directory's on the meta device, each
        shard filled from rank 0's weights after (every rank calls this, in the same order)."""
        from trainer import distributed

        meta = self._meta_init and not (model is not self.model and self.s.train_model == "tiny")
        full = model.state_dict() if meta and self.ranks is not None and self.ranks.main else {}
        distributed.shard(model)
        if meta:
            distributed.fill_from_rank0(model, full, self.device)

    def _config(self) -> dict[str, str]:
        s = self.s
        return {"loss_agg": str(s.loss_agg), "policy_loss": str(s.policy_loss), "clip_eps": str(s.clip_eps), "kl_beta": str(s.kl_beta),
                "lr": str(s.lr), **({"credit": self.credit} if self.credit else {}),
                "groups_per_step": str(s.groups_per_step), "train_layers": str(s.train_layers),
                **({"lora_rank": str(s.lora_rank)} if s.lora_rank else {}),
                **({"updates_per_batch": str(s.updates_per_batch)} if s.updates_per_batch > 1 else {}),
                **({"mini_batches": str(s.mini_batches)} if s.mini_batches > 1 else {}),
                "skip_zero_variance": str(s.skip_zero_variance),
                "run_id": self.state.run_id, **({"endpoint": s.train_llm_endpoint} if s.train_llm_endpoint else {})}

    def _producer_client(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer({**self.conf, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                                       "message.max.bytes": 16777216, "log_level": 0, "error_cb": self._on_error})
        return self._producer

    def _on_error(self, err: Any) -> None:
        # A fatal producer error (an ACL refusal under idempotence) is reported here, not per message.
        if err.fatal() or err.code() in AUTHORIZATION_CODES | AUTHENTICATION_CODES:
            self._delivery_errors.append(("publish (idempotent producer)", err))

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._delivery_errors.append((f"write topic {msg.topic()}", err))

    def _publish(self, topic: str, key: str, value: bytes) -> None:
        from confluent_kafka import KafkaException

        try:
            self._producer_client().produce(topic, key=key.encode(), value=value, on_delivery=self._on_delivery)
        except KafkaException as exc:
            raise kafka_failure(self.conf, exc, f"write topic {topic}") from exc

    def _flush(self) -> None:
        from confluent_kafka import KafkaException

        try:
            left = self._producer_client().flush(30.0)
        except KafkaException as exc:
            raise kafka_failure(self.conf, exc, "publish") from exc
        if self._delivery_errors:
            (action, err), self._delivery_errors = self._delivery_errors[0], []
            raise kafka_failure(self.conf, err, action)
        if left:
            raise KafkaUnavailable(f"could not publish to Kafka ({left} undelivered within 30s)")

    def _version_record(self, manifest: Any, uri: str) -> ResourceVersion:
        metrics = {k: float(v) for k, v in manifest.metrics.items() if k in _VERSION_METRICS}
        return ResourceVersion(name=manifest.resource_name, version=manifest.version, kind="model", uri=uri,
                               base_model=manifest.base_model, step=manifest.step, created_ns=manifest.created_ns,
                               metrics=metrics, config=manifest.config)

    def _publish_checkpoint(self, path: Any, manifest: Any) -> None:
        self._publish(self.topics.resources, manifest.resource_name, encode(self._version_record(manifest, str(path.resolve()))))
        if manifest.step > 0:
            rec = TrainStep(run_id=manifest.run_id, step=manifest.step, time_ns=manifest.created_ns,
                            resource_version=manifest.version, group_ids=manifest.group_ids, metrics=manifest.metrics)
            self._publish(self.topics.metrics, manifest.run_id, encode(rec))
        self._version_steps[manifest.version] = manifest.step
        if self.validator is not None:
            self.validator.on_version(manifest.version)
        self._flush()
        self.published_version = manifest.version

    def reconcile(self) -> None:
        """Make ``rb.resources`` agree with the checkpoints before consuming anything."""
        from trainer.checkpoint import Manifest

        if self._latest_manifest is None:
            # Fresh start: the initial weights are version `first`, so servers and runners have one to use.
            manifest = Manifest(step=0, version=self.state.version, resource_name=self.s.resource_name,
                                base_model=self.base_model, run_id=self.state.run_id, config=self._config(),
                                created_ns=time.time_ns())
            path = self._save(manifest)
            self._latest_manifest = manifest
            self._publish_checkpoint(path, manifest)
            log.info("published the initial weights as %s version %d (%s)", manifest.resource_name, manifest.version, path)
            return
        m = self._latest_manifest
        if self.published_version is None or self.published_version < m.version:
            # Crash between checkpoint and publish: publish the version the checkpoint was saved as.
            log.info("checkpoint step %d was saved but version %d never published: publishing it now", m.step, m.version)
            self._publish_checkpoint(self.store.path(m.step), m)
        elif self.published_version > m.version:
            log.warning("rb.resources already has %s version %d, newer than checkpoint step %d (version %d): "
                        "new versions continue after %d", m.resource_name, self.published_version, m.step, m.version,
                        self.published_version)

    def _consumer_client(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer({
                **self.conf, "group.id": self.s.resolved_group(), "enable.auto.commit": False,
                # Static membership: a restarted trainer takes its old place at once instead of waiting a
                # session timeout for the killed member to expire (and a second trainer is fenced off).
                "group.instance.id": f"{self.s.resolved_group()}.0", "session.timeout.ms": 30000,
                "auto.offset.reset": "earliest", "max.poll.interval.ms": 900000,
                "fetch.message.max.bytes": 16777216, "log_level": 0,
            })
            self._consumer.subscribe([self.topics.batches], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_revoke)
        return self._consumer

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        # Seek to the checkpoint's offsets: they, not the committed ones, say what was trained on.
        stored = self.state.offsets.get(self.topics.batches, {})
        for tp in partitions:
            if str(tp.partition) in stored:
                tp.offset = stored[str(tp.partition)]
        consumer.assign(partitions)
        self._last_data = time.monotonic()  # idle time counts from having something to read
        self.health.assignment(len(partitions))
        log.info("assigned %s", ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in partitions))

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        # Revoked, or lost when the group session expired (the broker unreachable): not ready until reassigned.
        self.health.assignment(0)
        log.info("revoked %s", ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions))

    # ------------------------------------------------------------------ consuming

    def _dead_letter(self, msg: Any, reason: str, detail: str) -> None:
        rec = DeadLetter(source_topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), key=msg.key(),
                         value=msg.value(), reason=reason, detail=detail[:2000], stage="trainer", time_ns=time.time_ns())
        # sent, and flushed, with the next checkpoint (before it records an offset past the record) or at the end: a
        # crash before it loses the record with the offsets, which the resumed trainer reads again (one dead letter);
        # produced at once, a kill -9 between the checkpoint and the producer's flush lost it for good
        self._dead_letters.append((msg.topic(), encode(rec)))
        self.counters.dead_lettered += 1

    def _send_dead_letters(self) -> None:
        if self._dead_letters:
            for key, value in self._dead_letters:
                self._publish(self.topics.dlq, key, value)
            self._flush()
            self._dead_letters.clear()

    def handle(self, msg: Any) -> None:
        """One message of rb.batches: decode, dedupe, staleness; keeps the offset either way."""
        from schemas.codec import decode

        self.state.offsets.setdefault(msg.topic(), {})[str(msg.partition())] = msg.offset() + 1
        self.counters.received += 1
        t0 = time.perf_counter()
        try:
            batch = decode(msg.value(), expect="rolloutbus.GroupBatch")
        except (DecodeError, ValidationError) as exc:
            self._dead_letter(msg, type(exc).__name__, str(exc))
            return
        finally:
            self.counters.decode_s += time.perf_counter() - t0
        assert isinstance(batch, GroupBatch)
        if batch.group_id in self.state.seen or any(b.group_id == batch.group_id for b, _ in self.pending):
            self.counters.duplicates += 1
            return
        behaviour = behaviour_version(batch)
        w = staleness_weight(behaviour, self.current_version, self.s.max_staleness, self.s.stale_weight, self.s.min_version)
        if behaviour is None:
            self.counters.unversioned += 1
        self.state.seen[batch.group_id] = None
        while len(self.state.seen) > SEEN_LIMIT:
            self.state.seen.popitem(last=False)
        if w is None:
            self.counters.dropped_stale += 1
            return
        if batch.zero_variance and self.s.skip_zero_variance:
            self.counters.dropped_zero_variance += 1  # its offset and id are kept: consumed, never trained on
            return
        if w < 1.0:
            self.counters.downweighted_stale += 1
        self.pending.append((batch, w))

    @property
    def current_version(self) -> int:
        """The version the next batches should have been sampled under: the newest known."""
        return max(self.state.version, self.published_version or 0)

    # ------------------------------------------------------------------ one step

    def train_step(self) -> dict[str, float]:
        from trainer.checkpoint import Manifest

        step = self.state.step + 1
        crash_point("before_step", step)
        groups = [b for b, _ in self.pending]
        weights = [w for _, w in self.pending]
        self.credit = ",".join(sorted({g.credit for g in groups if g.credit}))  # recorded with the version it makes
        wall0 = time.perf_counter()
        if self.leader is not None:
            self.leader.step(groups, weights)  # the other ranks take their share of the same step
        metrics = self.backend.step(groups, weights)
        step_s = time.perf_counter() - wall0
        data_s = self.counters.decode_s + metrics.get("build_time_s", 0.0)
        metrics.update(self.counters.as_metrics())
        metrics["data_time_fraction"] = data_s / max(step_s + self.counters.decode_s, 1e-9)
        metrics["batch_staleness_mean"] = _mean([self.current_version - v for v in map(behaviour_version, groups) if v is not None])
        version = self.current_version + 1
        metrics["resource_version"] = float(version)
        manifest = Manifest(step=step, version=version, resource_name=self.s.resource_name, base_model=self.base_model,
                            run_id=self.state.run_id, offsets={t: dict(p) for t, p in self.state.offsets.items()},
                            seen_group_ids=list(self.state.seen), group_ids=[g.group_id for g in groups],
                            metrics=metrics, config=self._config(), created_ns=time.time_ns())
        self._send_dead_letters()  # before the checkpoint holds the offsets past them
        path = self._save(manifest)
        self.state.step, self.state.version = step, version
        crash_point("after_checkpoint", step)
        self._publish_checkpoint(path, manifest)
        crash_point("after_publish", step)
        self._commit()
        self.store.prune(self.s.keep_checkpoints, self._protected_steps())
        self.pending.clear()
        self.counters = Counters()
        self.trackers.log(step, metrics)
        log.info("step %d → version %d: loss %.4f kl %.4f clip %.3f reward %.3f, %d groups, %.0f tok/s",
                 step, version, metrics.get("loss", 0.0), metrics.get("kl", 0.0), metrics.get("clip_fraction", 0.0),
                 metrics.get("reward_mean", 0.0), len(groups), metrics.get("tokens_per_s", 0.0))
        return metrics

    def _protected_steps(self) -> frozenset[int]:
        """The checkpoint of the best validated version (and of every version not yet fully validated, which
        may still become the best), and with LoRA the one the adapters sit on (vLLM's server loads the adapters onto
        it): kept when older checkpoints are pruned."""
        base = frozenset({self.lora_base_step}) if self.lora is not None else frozenset()
        if self.validator is None:
            return base
        scores = self.validator.poll()
        self._track_scores(scores)
        b = self.validator.best
        keep = {b.version} if b is not None else set()
        keep |= {v for v in self.validator.published if v not in scores or scores[v].answered < len(self.validator.inputs)}
        return base | frozenset(self._version_steps[v] for v in keep if v in self._version_steps)

    def _commit(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        tps = [TopicPartition(t, int(p), o) for t, parts in self.state.offsets.items() for p, o in parts.items()]
        if not tps:
            return
        try:
            self._consumer_client().commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            # The checkpoint holds the offsets; a failed commit only delays what `rolloutbus status` shows.
            log.warning("offset commit failed (the checkpoint has them, resume is unaffected): %s", exc)

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        """Consume and train until max_steps, idle_exit_s, or SIGTERM/SIGINT. Returns steps done."""
        self.reconcile()
        self.health.published(self.published_version)
        consumer = self._consumer_client()
        self.health.start()
        stop = {"flag": False}

        def _graceful(signum: int, frame: Any) -> None:
            stop["flag"] = True

        old = signal.signal(signal.SIGTERM, _graceful)
        done = 0
        self._last_data = time.monotonic()
        try:
            while not stop["flag"]:
                if self.s.max_steps and self.state.step >= self.s.max_steps:
                    break
                if self.validator is not None and self.validator.should_stop():
                    log.info("early stop: %s", self.validator.summary())
                    break
                msg = consumer.poll(0.5)
                self.health.watch(consumer, self.topics.batches)
                if msg is None:
                    if self.s.idle_exit_s and time.monotonic() - self._last_data > self.s.idle_exit_s:
                        log.info("no new batches for %.0fs: exiting", self.s.idle_exit_s)
                        break
                    continue
                if msg.error():
                    if msg.error().fatal():
                        raise KafkaUnavailable(f"consumer failed: {msg.error()}")
                    continue
                self._last_data = time.monotonic()
                self.handle(msg)
                self.health.batch_read()
                if len(self.pending) >= self.s.groups_per_step:
                    self._choose(consumer)
                    self.train_step()
                    self.health.step_done(self.state.version)
                    done += 1
            self._send_dead_letters()
            if self.validator is not None:
                self._track_scores(self.validator.poll(force=True))
                log.info("%s", self.validator.summary())
        finally:
            signal.signal(signal.SIGTERM, old)
            self.close()
        return done

    def _choose(self, consumer: Any) -> None:
        """Keep in ``pending`` the groups this step trains on (``--backlog``). A policy other than ``oldest`` first reads
        what is already waiting on rb.batches (up to ``backlog_window`` groups, without waiting): a trainer that keeps
        up finds nothing more and trains on what came, one that is behind chooses among what waits."""
        if self.s.backlog != "oldest":
            while len(self.pending) < self.s.backlog_window:
                msg = consumer.poll(0)
                if msg is None:
                    break
                if msg.error():
                    if msg.error().fatal():
                        raise KafkaUnavailable(f"consumer failed: {msg.error()}")
                    continue
                self.handle(msg)
                self.health.batch_read()
        chosen, skipped = select_backlog(self.pending, self.s.groups_per_step, self.s.backlog, self._backlog_rng)
        self.counters.skipped_backlog += len(skipped)
        self.pending[:] = chosen

    def _save(self, manifest: Any) -> Any:
        """A checkpoint of the weights and the optimizer state. On several ranks (every rank takes part) the weights
        are gathered whole, so the policy servers read one HF directory, and each rank writes its optimizer shard
        (torch.distributed.checkpoint), which a run resumes from on any rank count."""
        full, optimizer_state = None, None
        tmp = self.store.prepare(manifest.step)
        if self.leader is not None:
            from trainer import distributed
            from trainer.checkpoint import SHARDED_OPTIMIZER

            self.leader.gather(tmp / SHARDED_OPTIMIZER)
            full = distributed.full_state_dict(self.model)
            distributed.save_sharded_optimizer(self.model, self.backend.optimizer, tmp / SHARDED_OPTIMIZER)
        else:
            optimizer_state = self.backend.optimizer_state()
        model = self.model
        if self.lora is not None:  # the adapters merged into full weights: every policy server loads them as they are;
            # the adapters alone beside them, on the checkpoint they started from (vLLM's server loads just those)
            from trainer.lora import base_of, merged_state_dict, write_adapter

            state = full if full is not None else self.model.state_dict()
            write_adapter(tmp, state, self.lora, str(self.store.path(self.lora_base_step).resolve()))
            full = merged_state_dict(state, self.lora.scaling)
            model = base_of(self.model)
        return self.store.save(model, self.tok, optimizer_state, manifest, state_dict=full, tmp=tmp)

    def stop_ranks(self) -> None:
        """Rank 0: the other ranks stop following (once, at the end of the run, whatever ended it)."""
        if self.leader is not None:
            self.leader.stop()
            self.leader = None

    def _track_scores(self, scores: dict[int, Any]) -> None:
        """Each fully validated version's score to the trackers, once, at the step that made the version."""
        for version, score in sorted(scores.items()):
            if version in self._tracked_scores or self.validator is None or score.answered < len(self.validator.inputs):
                continue
            self._tracked_scores.add(version)
            self.trackers.log(self._version_steps.get(version, 0), {"validation/mean_reward": score.mean,
                                                                    "validation/version": float(version)})

    def close(self) -> None:
        self.trackers.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._producer is not None:
            self._producer.flush(10.0)
            self._producer = None


_VERSION_METRICS = {"loss", "kl", "clip_fraction", "reward_mean", "advantage_mean", "advantage_std", "tokens_per_s", "grad_norm"}


def _mean(xs: list[int]) -> float:
    return float(sum(xs)) / len(xs) if xs else 0.0


__all__ = ["CRASH_ENV", "CRASH_POINTS", "Counters", "Trainer", "crash_point", "staleness_weight"]
