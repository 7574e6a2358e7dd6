"""The demo's closing report: held-out results, the reward curve, and example SQL with its answers."""

from __future__ import annotations

from typing import Any

from rolloutbus.cli import format_table
from trainer.apo import paired_difference

EXAMPLE_QUERIES = [
    ("Reward and success rate by resource version (training rollouts)",
     "SELECT resource_version, rollouts, round(mean_reward, 3) AS mean_reward, round(success_rate, 3) AS success_rate "
     "FROM v_reward_by_version ORDER BY resource_version"),
    ("Held-out evaluation, as recorded (mode = 'test', task ids heldout-*)",
     "SELECT resource_version, count() AS rollouts, round(avg(final_reward), 3) AS success_rate "
     "FROM rollouts FINAL WHERE mode = 'test' AND startsWith(task_id, 'heldout-') GROUP BY resource_version ORDER BY resource_version"),
    ("Validation during training, by the version that answered (greedy, the runners)",
     "SELECT resource_version, count() AS answers, round(avg(final_reward), 3) AS success_rate "
     "FROM rollouts FINAL WHERE mode = 'test' AND metadata['validation.run'] != '' GROUP BY resource_version ORDER BY resource_version"),
    ("Tool calls and failures, by tool",
     "SELECT tool, calls, failures, round(error_rate, 3) AS error_rate FROM v_tool_errors"),
]


def report(settings: Any, cfg: Any, live: Any, first: int, final: int, first_scores: list[float],
           final_scores: list[float], say: Any, title: str = "calculator agent", first_label: str = "supervised warm-up only",
           subsets: dict[str, list[int]] | None = None, final_label: str = "after GRPO",
           evaluated: tuple[int, ...] | None = None) -> None:
    """``evaluated``: the versions this run evaluated (their recorded rollouts are checked); default both."""
    from foundation.clickhouse import connect

    n = len(first_scores)
    a, b = sum(first_scores) / n, sum(final_scores) / n
    client = connect(settings.dsn, database=settings.clickhouse_database, create_database=False)
    try:
        recorded = dict(client.query(
            "SELECT resource_version, avg(final_reward) FROM rollouts FINAL WHERE mode = 'test' AND startsWith(task_id, 'heldout-') "
            "GROUP BY resource_version"
        ).result_rows)
        per_version = client.query(
            "SELECT resource_version, count(), avg(final_reward) FROM rollouts FINAL WHERE mode = 'train' "
            "GROUP BY resource_version ORDER BY resource_version"
        ).result_rows
        steps = client.query("SELECT step, reward_mean, loss FROM v_train_steps ORDER BY step").result_rows
        say("")
        say(f"[bold]held-out success rate[/bold] on {n} problems the trainer never saw (greedy):")
        diff, se = paired_difference(first_scores, final_scores)
        width = max(len(first_label), len(final_label)) + 3
        say(f"  version {first:>3} {'(' + first_label + '):':<{width}} {a:6.1%}")
        say(f"  version {final:>3} {'(' + final_label + '):':<{width}} {b:6.1%}   ({diff * 100:+.1f} points, paired standard error "
            f"{se * 100:.1f})")
        for name, idx in (subsets or {}).items():
            if idx:
                fa, fb = (sum(s[i] for i in idx) / len(idx) for s in (first_scores, final_scores))
                say(f"    {name} ({len(idx)}): {fa:.1%} → {fb:.1%}")
        for v, expect in ((first, a), (final, b)):
            if evaluated is not None and v not in evaluated:
                continue
            got = recorded.get(v)
            if got is None or abs(got - expect) > 1e-9:
                say(f"  [yellow]note: ClickHouse holds {got} for version {v}'s held-out rollouts, the agent saw {expect:.3f}[/yellow]")
        png = cfg.out / "reward_curve.png"
        plot(per_version, steps, first, final, a, b, png, title)
        say(f"reward curve written to {png}")
        for title, sql in EXAMPLE_QUERIES:
            result = client.query(sql, settings={"readonly": 1})
            say("")
            say(f"[bold]{title}[/bold]")
            say(f"  rolloutbus query \"{sql}\"")
            say(format_table(list(result.column_names), [list(r) for r in result.result_rows]))
    finally:
        client.close()


def plot(per_version: list[tuple[Any, ...]], steps: list[tuple[Any, ...]], first: int, final: int,
         a: float, b: float, path: Any, title: str = "calculator agent") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    # A version whose training rollouts all ended without a reward (stopped at the end of the run) has none.
    rewarded = [(int(v), float(r)) for v, _, r in per_version if v is not None and r is not None]
    if rewarded:
        ax.plot([v for v, _ in rewarded], [r for _, r in rewarded], marker="o", label="training rollouts: mean reward per version")
    if steps:
        ax.plot([int(s) for s, _, _ in steps], [float(r or 0) for _, r, _ in steps], alpha=0.5,
                label="trainer: batch mean reward per step (version = step)")
    ax.scatter([first, final], [a, b], color="crimson", zorder=5, s=60, label="held-out success (greedy)")
    for x, y in ((first, a), (final, b)):
        ax.annotate(f"{y:.0%}", (x, y), textcoords="offset points", xytext=(6, 6), color="crimson")
    ax.set_xlabel("resource version")
    ax.set_ylabel("reward / success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(f"rolloutbus demo: {title} learning with GRPO")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
