"""Turn analysis results into text, JSON, CSV or Markdown. Presentation only: no numbers are
computed here beyond unit conversion (ns -> ms) and percentage formatting."""

from __future__ import annotations

import io
import json
from typing import Any

import polars as pl
from ranklens.analysis.report import Report
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "json", "csv", "markdown")

# Which columns the human report shows per table, and how.
_RANK_VIEW: list[tuple[str, str, str]] = [
    ("rank", "rank", "int"),
    ("steps", "steps", "int"),
    ("window_ns", "step ms", "ms_per_step"),
    ("compute_share", "compute", "pct"),
    ("comm_share", "comm", "pct"),
    ("exposed_share", "exposed comm", "pct"),
    ("overlap_ratio", "overlap", "pct"),
    ("idle_share", "idle", "pct"),
]


def _fmt(value: Any, how: str, steps: int = 1) -> str:
    if value is None:
        return "-"
    if how == "pct":
        return f"{100 * float(value):.1f}%"
    if how == "ms":
        return f"{float(value) / 1e6:.3f}"
    if how == "ms_per_step":
        return f"{float(value) / 1e6 / max(steps, 1):.3f}"
    return str(value)


def rank_summary(report: Report) -> pl.DataFrame:
    """One row per rank joining breakdown and overlap totals (a presentation join)."""
    b = report.results["breakdown"].tables["by_rank"]
    o = report.results["overlap"].tables["by_rank"].select("rank", "exposed_share", "overlap_ratio")
    joined: pl.DataFrame = b.join(o, on="rank", how="left").sort("rank")
    return joined


def render_table(report: Report, console: Console) -> None:
    """The rich text report: findings first, then per-rank and per-parallelism tables."""
    f = report.facts
    console.print(
        f"[bold]ranklens report[/]  ranks: {len(f['ranks'])}"
        + (f" of {f['world_size']}" if f["world_size"] else "")
        + f"   steps: {', '.join(str(s) for s in f['steps'])}"
        + (f"   devices: {', '.join(f['devices'])}" if f["devices"] else "   CPU-only")
    )
    if f["missing_ranks"]:
        console.print(f"[yellow]missing ranks:[/] {f['missing_ranks']} (no trace was given)")
    for s in f["skipped"]:
        console.print(f"[yellow]skipped:[/] {s['path']}: {s['error']}")
    if f["cpu_only"]:
        console.print(
            "[dim]CPU-only (gloo) run: host ops count as compute; treat durations as "
            "qualitative when many ranks share few cores.[/]"
        )
    console.print()
    console.print("[bold]Findings[/] (most step time at stake first)")
    colors = {"critical": "red", "warning": "yellow", "info": "cyan"}
    for i, fd in enumerate(report.findings, start=1):
        c = colors[fd.severity.value]
        console.print(
            f" {i}. [{c}]{fd.severity.value}[/] [bold]{fd.code}[/]  "
            f"~{_fmt(fd.time_at_stake_ns, 'ms')} ms/step at stake",
            highlight=False,
        )
        console.print(f"    {fd.message}", highlight=False)
        console.print(f"    [green]fix:[/] {fd.fix}", highlight=False)
    if not report.findings:
        console.print("    no findings")
    console.print()
    summary = rank_summary(report)
    rt = Table(title="Per rank (totals over steps)", title_justify="left")
    for _, label, _ in _RANK_VIEW:
        rt.add_column(label, justify="right")
    for row in summary.iter_rows(named=True):
        rt.add_row(*[_fmt(row.get(c), how, int(row["steps"])) for c, _, how in _RANK_VIEW])
    console.print(rt)
    par = report.results["overlap"].tables["by_parallelism"]
    if not par.is_empty():
        pt = Table(
            title="Communication per parallelism (ms, summed over steps)", title_justify="left"
        )
        for col in ("rank", "parallelism", "comm", "hidden", "exposed", "overlap"):
            pt.add_column(col, justify="right")
        agg = (
            par.group_by("rank", "parallelism")
            .agg(pl.col("comm_ns", "hidden_ns", "exposed_ns").sum())
            .sort("rank", "parallelism")
        )
        for r in agg.iter_rows(named=True):
            ratio = r["hidden_ns"] / r["comm_ns"] if r["comm_ns"] else None
            pt.add_row(
                str(r["rank"]),
                r["parallelism"],
                _fmt(r["comm_ns"], "ms"),
                _fmt(r["hidden_ns"], "ms"),
                _fmt(r["exposed_ns"], "ms"),
                _fmt(ratio, "pct"),
            )
        console.print(pt)


def report_json(report: Report) -> str:
    """Everything: facts, findings, and every table of every analysis."""
    doc: dict[str, Any] = {
        "facts": report.facts,
        "findings": [f.as_dict() for f in report.findings],
        "analyses": {
            name: {
                "table": res.table.to_dicts(),
                **{k: v.to_dicts() for k, v in res.tables.items()},
            }
            for name, res in report.results.items()
        },
    }
    return json.dumps(doc, indent=2, default=str)


def report_csv(report: Report) -> str:
    """Per rank and step: breakdown and overlap side by side (one flat table)."""
    b = report.results["breakdown"].table
    o = report.results["overlap"].table.select(
        "rank", "step", "hidden_ns", "exposed_ns", "overlap_ratio", "exposed_share"
    )
    buf = io.StringIO()
    b.join(o, on=["rank", "step"], how="left").sort("rank", "step").write_csv(buf)
    return buf.getvalue()


def report_markdown(report: Report) -> str:
    """A Markdown summary (e.g. for a CI job summary or a PR comment)."""
    lines = ["# ranklens report", ""]
    f = report.facts
    lines.append(f"ranks: {len(f['ranks'])}, steps: {f['steps']}, devices: {f['devices'] or 'CPU'}")
    lines += [
        "",
        "## Findings",
        "",
        "| code | severity | at stake ms/step | what | fix |",
        "|---|---|---|---|---|",
    ]
    for fd in report.findings:
        lines.append(
            f"| {fd.code} | {fd.severity.value} | {_fmt(fd.time_at_stake_ns, 'ms')} | "
            f"{fd.message} | {fd.fix} |"
        )
    lines += [
        "",
        "## Per rank",
        "",
        "| " + " | ".join(lbl for _, lbl, _ in _RANK_VIEW) + " |",
        "|" + "---|" * len(_RANK_VIEW),
    ]
    for row in rank_summary(report).iter_rows(named=True):
        cells = [_fmt(row.get(c), how, int(row["steps"])) for c, _, how in _RANK_VIEW]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def frame_out(df: pl.DataFrame, fmt: str, console: Console, title: str | None = None) -> None:
    """Print one DataFrame in the chosen format."""
    if fmt == "json":
        console.print_json(json.dumps(df.to_dicts(), default=str))
    elif fmt == "csv":
        buf = io.StringIO()
        df.write_csv(buf)
        console.out(buf.getvalue(), end="")
    elif fmt == "markdown":
        console.out("| " + " | ".join(df.columns) + " |", highlight=False)
        console.out("|" + "---|" * len(df.columns), highlight=False)
        for row in df.iter_rows():
            console.out(
                "| " + " | ".join("" if v is None else str(v) for v in row) + " |", highlight=False
            )
    else:
        t = Table(title=title, title_justify="left")
        for c in df.columns:
            t.add_column(c, overflow="fold")
        for row in df.iter_rows():
            t.add_row(*["" if v is None else str(v) for v in row])
        console.print(t)
