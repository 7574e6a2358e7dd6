"""Settings of ``rolloutbus bench``, from ``ROLLOUTBUS_BENCH_*`` environment variables (its flags derive from them)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from foundation.config import PORT, CommonSettings
from rolloutbus.bench_cli import SPANS_PER_ROLLOUT


class BenchSettings(CommonSettings):
    """How big the benches run, where their table goes, and the port of the one broker they share."""

    bench_quick: bool = Field(default=False, description="Smaller sizes, a smoke run.")
    bench_spans: int | None = Field(
        default=None, ge=SPANS_PER_ROLLOUT,
        description="Workload size (spans, at least one rollout of 16) for the ingest, Agent Lightning, hot-path and "
                    "end-to-end benches; unset: their own (1,024 spans for the ingest comparison).")
    bench_out: Path | None = Field(default=None, description="Where the results file goes; unset: the checkout's bench/results.")
    bench_kafka_port: int = Field(default=29892, **PORT, description="Port of the local broker the benches share.")
    bench_al_port: int | None = Field(default=None, **PORT,
                                      description="Port of Agent Lightning's store in the drop-in comparison; unset: a free one.")
    bench_al03_python: Path | None = Field(
        default=None, description="Interpreter that makes Agent Lightning 0.3.0's venv (Python 3.11); unset: the bench's own.")
    bench_keep_logs: Path | None = Field(default=None, description="Where the streams bench copies its workers' logs; unset: not kept.")
    bench_trl_venv: Path | None = Field(
        default=None, description="Where the TRL comparison's venv goes; unset: ~/.cache/rolloutbus/bench-trl-<version>.")

    @field_validator("bench_out", "bench_al_port", "bench_al03_python", "bench_keep_logs", "bench_trl_venv", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """``VAR=`` means unset (as these variables were read before), not the current directory or port ''."""
        return None if isinstance(value, str) and not value.strip() else value


__all__ = ["BenchSettings"]
