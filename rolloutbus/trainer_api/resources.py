"""What a write-ups-style agent's ``rollout(task, resources, rollout)`` receives: the ``LLM`` resource, the
``PromptTemplate`` resource (what ``APO`` optimizes) and a view of the rollout with Agent Lightning's field names. Pure.

``LLM.get_base_url(rollout_id, attempt_id)`` is the OpenAI base URL an agent points its client at: under
``Trainer.fit`` the LLM proxy's per-attempt URL (every call recorded with its token ids), under
``Trainer.dev`` the endpoint itself (the calls are recorded by the tracer, text only). Asked for the proxy's URL, it
marks the attempt's FINISHED event as not knowing its span count (``rolloutbus.spans_unknown``): those calls carry no
sequence id of the agent's, and the stream worker waits its finish grace (``--finish-grace``) for the proxy's spans
rather than complete the attempt without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from producers.context import RolloutContext, current_rollout
from schemas.models import SPANS_UNKNOWN


@dataclass
class LLM:
    """An OpenAI-compatible endpoint and the model and sampling parameters to call it with."""

    endpoint: str = ""
    model: str = "policy"
    sampling_parameters: dict[str, Any] = field(default_factory=dict)
    proxied: bool = False  # the endpoint is ``rolloutbus proxy``: URLs are per rollout attempt

    def get_base_url(self, rollout_id: str | None = None, attempt_id: str | None = None) -> str:
        """The base URL (``.../v1``) for one attempt's calls."""
        base = self.endpoint.rstrip("/")
        if not self.proxied:
            return base
        if not rollout_id or not attempt_id:
            raise ValueError("the LLM proxy's URL names the rollout and the attempt: get_base_url(rollout.rollout_id, "
                             "rollout.attempt.attempt_id)")
        # The calls through this URL carry no sequence id of the agent's (no header): the proxy's spans are numbered by
        # the stream worker, and the attempt's FINISHED cannot count them. Said in its metadata, the worker waits its
        # finish grace for them instead of completing the attempt the moment FINISHED arrives — before the proxy's span,
        # sent by another process, has: the attempt would lose its LLM calls (no steps) and its group would split by
        # version (a rollout without steps has none).
        ctx = current_rollout()
        if ctx is not None and ctx.rollout_id == rollout_id and ctx.attempt_id == attempt_id:
            ctx.metadata[SPANS_UNKNOWN] = "1"
        return f"{base.removesuffix('/v1')}/rollout/{rollout_id}/attempt/{attempt_id}/v1"


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt template, as Agent Lightning's: ``template`` in the ``engine``'s syntax; ``format(**task)`` fills it
    (the ``f-string`` engine only, as Agent Lightning's ``format``). Under ``APO`` the agent gets the version the
    runners use (published on ``rb.resources``, or a candidate being scored)."""

    template: str
    engine: str = "f-string"
    # The rest of its version's config on rb.resources (e.g. the SQL demo's few-shot ``examples``), kept for the agent.
    extra: Mapping[str, str] = field(default_factory=dict, compare=False)

    def format(self, **kwargs: Any) -> str:
        if self.engine != "f-string":
            raise NotImplementedError(f"PromptTemplate.format fills f-string templates only, not {self.engine!r}: "
                                      "render .template yourself")
        return self.template.format(**kwargs)

    def config(self) -> dict[str, str]:
        """The resource version's config (``rb.resources``; what ``optimize-prompt`` rewrites: ``template``)."""
        return {**self.extra, "template": self.template, "engine": self.engine}

    @classmethod
    def from_config(cls, config: Mapping[str, str], engine: str = "f-string") -> PromptTemplate:
        """A version's config as the agent sees it; a config without an engine keeps ``engine``."""
        return cls(template=config.get("template", ""), engine=config.get("engine") or engine,
                   extra={k: v for k, v in config.items() if k not in ("template", "engine")})


NamedResources = Mapping[str, Any]


def from_version(rv: Any) -> LLM | PromptTemplate | None:
    """A version on ``rb.resources`` as an agent of this API sees it: what the gateway answers Agent Lightning's
    runners for it (:func:`producers.ingest.agl.v0_3_store.agl_resource`) as a :class:`PromptTemplate` or an
    :class:`LLM` (per attempt through the proxy, unless published as a plain ``llm``); a ``model`` without an endpoint
    in its config (a checkpoint only, no ``--llm-endpoint``) and anything else None (the record as it is)."""
    from producers.ingest.agl.v0_3_store import agl_resource

    if getattr(rv, "kind", None) == "model" and not (getattr(rv, "config", None) or {}).get("endpoint"):
        return None
    mapped = agl_resource(rv)
    if mapped is None:
        return None
    if mapped["resource_type"] == "prompt_template":
        extra = {k: v for k, v in (getattr(rv, "config", None) or {}).items() if k not in ("template", "engine")}
        return PromptTemplate(template=mapped["template"], engine=mapped["engine"], extra=extra)
    return LLM(endpoint=mapped["endpoint"], model=mapped["model"], sampling_parameters=mapped["sampling_parameters"],
               proxied=mapped["resource_type"] == "proxy_llm")


@dataclass(frozen=True)
class Attempt:
    attempt_id: str
    sequence_id: int  # the attempt's number, from 1


@dataclass(frozen=True)
class Rollout:
    """One attempt of one rollout, as Agent Lightning names its fields."""

    rollout_id: str
    attempt: Attempt
    mode: str
    task_id: str
    context: RolloutContext

    @classmethod
    def of(cls, ctx: RolloutContext) -> Rollout:
        return cls(ctx.rollout_id, Attempt(ctx.attempt_id, ctx.attempt), ctx.mode, ctx.task_id, ctx)


__all__ = ["LLM", "NamedResources", "PromptTemplate", "Rollout", "Attempt", "from_version"]
