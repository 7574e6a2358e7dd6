"""A default is written once, in the settings model: every flag of ``rolloutbus train``, ``process``, ``gateway``,
``proxy``, ``run-agent``, ``serve``, ``optimize-prompt``, ``store``, ``dashboard``, ``export``, ``bench``, ``tasks publish`` (and the demo's task
feeder flags) that
sets a field shows the model's default and variable in its help (derived by ``foundation.flags.describe_flags`` when the help is shown), and
no help states another default by hand."""

from __future__ import annotations

import argparse
import re

import pytest

from foundation.config import ENV_PREFIX, shown_default


def _parser(module: str) -> argparse.ArgumentParser:
    import importlib

    module, _, sub = module.partition(":")  # module:subcommand, for a command whose flags sit on a subparser
    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    if sub:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[sub]
    parser.format_help()  # the variables and defaults are added when the help is shown
    return parser


def _cases() -> list[tuple[str, str, str, type]]:
    from streams.cli import _FLAGS as STREAM_FLAGS
    from streams.settings import StreamSettings
    from trainer.cli import _FLAGS as TRAIN_FLAGS
    from trainer.settings import SFTSettings
    from trainer.sft_cli import SFT_FLAGS

    import importlib

    train = {**TRAIN_FLAGS, **SFT_FLAGS}
    cases = ([("trainer.cli", dest, field, SFTSettings) for dest, field in train.items()]
             + [("streams.cli", kw["dest"], kw["dest"], StreamSettings) for _, kw in STREAM_FLAGS])
    for module, settings in (("producers.ingest.gateway_cli", "producers.ingest.settings:GatewaySettings"),
                             ("producers.ingest.llm_proxy_cli", "producers.ingest.settings:ProxySettings"),
                             ("producers.runner_cli", "producers.settings:RunnerSettings"),
                             ("trainer.serve_cli", "trainer.settings:ServeSettings"),
                             ("trainer.apo_cli", "trainer.settings:ApoSettings"),
                             ("rolloutbus.store.cli", "rolloutbus.store.settings:StoreSettings"),
                             ("rolloutbus.dashboard.cli", "rolloutbus.dashboard.settings:DashboardSettings"),
                             ("rolloutbus.bench_cli", "rolloutbus.bench_settings:BenchSettings")):
        model = getattr(importlib.import_module(settings.split(":")[0]), settings.split(":")[1])
        cases += [(module, dest, field, model) for dest, field in importlib.import_module(module)._FLAGS.items()]
    from producers.settings import FeederSettings
    from producers.tasks_cli import _FLAGS as TASKS_FLAGS
    from rolloutbus.demo import FEEDER_FLAGS

    from rolloutbus.runs.export_cli import _FLAGS as EXPORT_FLAGS
    from trainer.settings import TrainerSettings as Trained

    cases += [("rolloutbus.runs.export_cli", dest, field, Trained) for dest, field in EXPORT_FLAGS.items()]
    cases += [("producers.tasks_cli:publish", dest, field, FeederSettings) for dest, field in TASKS_FLAGS.items()]
    from streams.settings import StreamSettings
    from trainer.settings import TrainerSettings

    cases += [("rolloutbus.demo", dest, dest, FeederSettings) for dest in FEEDER_FLAGS]
    cases += [("rolloutbus.demo", "gamma", "gamma", StreamSettings), ("rolloutbus.demo", "advantage_estimator", "advantage_estimator", StreamSettings),
              ("rolloutbus.demo", "policy_loss", "policy_loss", TrainerSettings),
              ("rolloutbus.demo", "backlog", "backlog", TrainerSettings)]
    return cases


@pytest.mark.parametrize(("module", "dest", "field", "model"), _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_flag_shows_the_models_default_and_no_other(module: str, dest: str, field: str, model: type) -> None:
    action = next((a for a in _parser(module)._actions if a.dest == dest), None)
    if action is None:  # a field set from another flag's value (serve's --no-follow sets serve_follow)
        return
    text = " ".join((action.help or "").split())
    assert f"env {ENV_PREFIX}{field.upper()}" in text, text
    stated = re.findall(r"default (\S+?)(?=\)|; |: | \(|$)", text)
    want = shown_default(model, field)
    if want is not None and action.nargs != 0:
        assert stated == [want], (dest, text)  # exactly one default, the model's
    else:
        assert all(model.model_fields[field].default is None or model.model_fields[field].default_factory for _ in stated), (dest, text)


def test_a_changed_default_shows_in_the_help() -> None:
    """The help follows the model: a subclass with another learning rate shows it."""
    from pydantic import Field

    from foundation.config import describe_now
    from trainer.settings import TrainerSettings

    class Other(TrainerSettings):
        lr: float = Field(default=3e-5, gt=0, description="")

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, help="AdamW learning rate")
    describe_now(parser, Other, {"lr": "lr"})
    assert parser._actions[-1].help == "AdamW learning rate (env ROLLOUTBUS_LR, default 3e-05)"
