"""Turn analysis results into text, JSON, CSV or Markdown. Presentation only: no numbers are
computed here beyond unit conversion (ns -> ms) and percentage formatting."""

from __future__ import annotations

import io
import json
from typing import Any

import polars as pl
from ranklens.analysis import savings
from ranklens.analysis._base import Finding
from ranklens.analysis.report import Report, focus_ranks
from ranklens.cli.tables import print_table
from rich.console import Console
from rich.markup import escape
from rich.table import Table

FORMATS = ("table", "json", "csv", "markdown")
MAX_FINDINGS = 10  # the text report lists the costliest; the other formats list all
MAX_RANK_ROWS = 32  # above this, per-rank tables show the ranks findings name and the extremes

# Which columns the human report shows per table, and how.
_RANK_VIEW: list[tuple[str, str, str]] = [
    ("rank", "rank", "int"),
    ("steps", "steps", "int"),
    ("window_ns", "ms/step", "ms_per_step"),
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


# Per pipeline stage: (column of the stages table, label, format).
_STAGE_VIEW: list[tuple[str, str, str]] = [
    ("pp_group", "PP group", "str"),
    ("stage", "stage", "int"),
    ("rank", "rank", "int"),
    ("bubble_ns", "bubble ms", "ms_per_step"),
    ("bubble_fraction", "bubble", "pct"),
    ("closed_form", "closed form", "pct"),
    ("warmup_bubble_ns", "warm-up ms", "ms_per_step"),
    ("steady_bubble_ns", "steady ms", "ms_per_step"),
    ("cooldown_bubble_ns", "cool-down ms", "ms_per_step"),
    ("pp_wait_ns", "in PP wait ms", "ms_per_step"),
]


def pipeline_lines(
    report: Report, focus: list[int] | None = None
) -> tuple[list[str], list[list[str]]]:
    """The pipeline section: schedule/convention lines (PP groups that agree share one) and
    one row per stage (only the `focus` ranks' stages when given)."""
    res = report.results.get("pipeline")
    if res is None or res.tables.get("stages") is None or res.tables["stages"].is_empty():
        return [], []
    sched = res.tables["schedule"]
    lines: dict[str, list[tuple[str, float | None]]] = {}
    for (group,), part in sched.group_by("pp_group", maintain_order=True):
        r = part.row(0, named=True)
        meas = part["bubble_fraction"].drop_nulls()
        what = (
            f"{r['schedule'] or '?'}, p={r['p']}, m={r['m'] or '?'}"
            + (f", v={r['v']}" if (r["v"] or 1) > 1 else "")
            + f" ({r['schedule_source'] or 'unknown'}); closed form "
            f"{_fmt(r['closed_form'], 'pct')} [{r['convention'] or '-'}]"
        )
        mean = None if meas.is_empty() else float(meas.mean())  # type: ignore[arg-type]
        lines.setdefault(what, []).append((str(group), mean))
    notes = []
    for what, groups in lines.items():
        vals = [v for _, v in groups if v is not None]
        if len(groups) == 1:
            shown = "-" if not vals else _fmt(vals[0], "pct")
            notes.append(f"PP group {groups[0][0]}: {what}; bubble {shown} of the pipeline time")
            continue
        rng = "-" if not vals else f"{_fmt(min(vals), 'pct')} to {_fmt(max(vals), 'pct')}"
        notes.append(f"{len(groups)} PP groups: {what}; bubble {rng} of the pipeline time")
    stages = res.tables["stages"]
    if focus is not None:
        stages = stages.filter(pl.col("rank").is_in(focus))
    rows = [
        [_fmt(row.get(c), how, int(row["steps"])) for c, _, how in _STAGE_VIEW]
        for row in stages.sort("pp_group", "stage").iter_rows(named=True)
    ]
    return notes, rows


def cross_rank_lines(facts: dict[str, Any], markup: bool = True) -> list[str]:
    """Alignment quality, matching rate and the straggler line (presentation of facts)."""
    y, b, e = ("[yellow]", "[bold]", "[/]") if markup else ("", "", "")
    out: list[str] = []
    al = facts.get("alignment")
    if al:
        res = al["max_residual_ns"]
        shown = "-" if res is None else f"{res / 1e3:.1f} µs"
        how = ", ".join(al["methods"])
        if al["poor"]:
            out.append(
                f"{y}clock alignment poor:{e} residual up to {shown} on ranks "
                f"{al['poor_ranks']} ({how}); cross-host skews and waits below that are not "
                "trustworthy"
            )
        elif res is None:  # no collective to measure it on (e.g. a single rank)
            out.append(f"clock alignment: {how}, no residual measured (no shared collective)")
        else:
            note = " (one host: end spread, not clock error)" if how == "single_host" else ""
            out.append(f"clock alignment: {how}, residual up to {shown}{note}")
    m = facts.get("matching")
    if m and m["comm_ops"]:
        share = m["matched_share"]
        pct = "-" if share is None else f"{100 * share:.1f}%"
        out.append(f"collectives: {m['matched']:,} of {m['comm_ops']:,} comm ops matched ({pct})")
        unknown = m.get("by_status", {}).get("peer_unknown", 0)
        if unknown:
            out.append(
                f"{y}send/recv without a peer:{e} {unknown:,} (the trace names none and none "
                "could be inferred): the pipeline reads no schedule from them and the "
                "critical path no dependency; stragglers count only when they ended"
            )
    st = facts.get("stragglers")
    if st:
        parts = [
            f"rank {s['rank']} by {s['held_back_per_step_ns'] / 1e6:.1f} ms/step "
            f"({100 * (s['share'] or 0):.0f}%)"
            for s in st[:5]
        ]
        more = f"; and {len(st) - 5} more" if len(st) > 5 else ""
        out.append(f"{b}stragglers:{e} holding the job back: " + "; ".join(parts) + more)
    elif st is not None:
        out.append("stragglers: none (no rank holds the others back beyond the threshold)")
    return out


def render_table(report: Report, console: Console) -> None:
    """The rich text report: findings first, then per-rank and per-parallelism tables."""
    f = report.facts
    console.print(
        f"[bold]ranklens report[/]  ranks: {len(f['ranks'])}"
        + (f" of {f['world_size']}" if f["world_size"] else "")
        + f"   steps: {steps_text(f['steps'])}"
        + f"   {devices_text(f)}"
    )
    if f["missing_ranks"]:
        console.print(f"[yellow]missing ranks:[/] {f['missing_ranks']} (no trace was given)")
    # a message names files: one line each, left to the terminal to wrap (a path folded at
    # the console's width no longer matches, nor pastes, as the file's name)
    for s in f["skipped"]:
        console.print(
            f"[yellow]skipped:[/] {escape(s['message'])}", highlight=False, soft_wrap=True
        )
    for w in f.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    if f["cpu_only"]:
        console.print(
            "[dim]CPU-only (gloo) run: host ops count as compute; treat durations as "
            "qualitative when many ranks share few cores.[/]"
        )
    for line in cross_rank_lines(f):
        console.print(line, highlight=False)
    console.print()
    console.print(findings_title(f), highlight=False)
    colors = {"critical": "red", "warning": "yellow", "info": "cyan"}
    for i, fd in enumerate(report.findings[:MAX_FINDINGS], start=1):
        c = colors[fd.severity.value]
        console.print(
            f" {i}. [{c}]{fd.severity.value}[/] [bold]{fd.code}[/]  {finding_gain(fd)}",
            highlight=False,
        )
        console.print(f"    {fd.message}", highlight=False)
        console.print(f"    [green]fix:[/] {fd.fix}", highlight=False)
    if not report.findings:
        console.print("    no findings")
    elif len(report.findings) > MAX_FINDINGS:
        rest = report.findings[MAX_FINDINGS:]
        codes = ", ".join(sorted({fd.code for fd in rest}))
        console.print(
            f"    ... {len(rest)} more finding(s) with less at stake ({codes}): "
            "`--format json` or `--format markdown` lists them all",
            highlight=False,
        )
    console.print()
    summary = rank_summary(report)
    focus = focus_ranks(report, MAX_RANK_ROWS)
    title = "Per rank (mean step; shares of all its steps)"
    if focus is not None:
        title += (
            f": {len(focus)} of {summary.height} ranks (those the findings name, then the most "
            "exposed and most idle; all in `--format json` or `ranklens sql`)"
        )
        summary = summary.filter(pl.col("rank").is_in(focus))
    rows = [
        [_fmt(row.get(c), how, int(row["steps"])) for c, _, how in _RANK_VIEW]
        for row in summary.iter_rows(named=True)
    ]
    print_table(console, title, [label for _, label, _ in _RANK_VIEW], rows)
    par = report.results["overlap"].tables["by_parallelism"]
    if not par.is_empty():
        if focus is not None:
            par = par.filter(pl.col("rank").is_in(focus))
        agg = (
            par.group_by("rank", "parallelism")
            .agg(pl.col("comm_ns", "hidden_ns", "exposed_ns").sum())
            .sort("rank", "parallelism")
        )
        rows = []
        for r in agg.iter_rows(named=True):
            ratio = r["hidden_ns"] / r["comm_ns"] if r["comm_ns"] else None
            ms = [_fmt(r[c], "ms") for c in ("comm_ns", "hidden_ns", "exposed_ns")]
            rows.append([str(r["rank"]), r["parallelism"], *ms, _fmt(ratio, "pct")])
        labels = ["rank", "parallelism", "comm", "hidden", "exposed", "overlap"]
        title = "Communication per parallelism (ms, summed over steps)"
        print_table(console, title, labels, rows, keys=2)
    notes, stage_rows = pipeline_lines(report, focus)
    if stage_rows:
        title = "Pipeline bubbles per stage (ms per step)"
        if focus is not None:
            title += ": the stages of the ranks shown above"
        print_table(console, title, [label for _, label, _ in _STAGE_VIEW], stage_rows, keys=3)
        for note in notes:
            console.print(f"  {note}", highlight=False, markup=False)


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
    lines.append(f"ranks: {len(f['ranks'])}, steps: {steps_text(f['steps'])}, {devices_text(f)}")
    lines += [f"- {line}" for line in cross_rank_lines(f, markup=False)]
    lines += [f"- skipped: {s['message']}" for s in f["skipped"]]
    lines += [f"- warning: {w}" for w in f.get("warnings", [])]
    lines += [
        "",
        "## Findings",
        "",
        "| code | severity | saves (replay) or at stake, ms/step | what | fix |",
        "|---|---|---|---|---|",
    ]
    for fd in report.findings:
        lines.append(
            f"| {fd.code} | {fd.severity.value} | {finding_gain(fd)} | {fd.message} | {fd.fix} |"
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
    notes, stage_rows = pipeline_lines(report)
    if stage_rows:
        lines += ["", "## Pipeline bubbles per stage (ms per step)", ""]
        lines += [f"- {n}" for n in notes] + [""]
        lines.append("| " + " | ".join(lbl for _, lbl, _ in _STAGE_VIEW) + " |")
        lines.append("|" + "---|" * len(_STAGE_VIEW))
        lines += ["| " + " | ".join(cells) + " |" for cells in stage_rows]
    return "\n".join(lines) + "\n"


def frame_out(df: pl.DataFrame, fmt: str, console: Console, title: str | None = None) -> None:
    """Print one DataFrame in the chosen format."""
    # csv and json go to the file as they are: rich would lay out (and colour) every
    # character, which takes minutes and gigabytes for a few MB of rows.
    if fmt == "json":
        text = json.dumps(df.to_dicts(), default=str, indent=2, ensure_ascii=False)
        console.file.write(text + "\n")
    elif fmt == "csv":
        buf = io.StringIO()
        # CSV has no nested values: lists/structs (e.g. process_groups.ranks) become JSON text.
        nested = [c for c, t in df.schema.items() if t.is_nested()]
        df.with_columns(
            pl.col(c).map_elements(
                lambda v: json.dumps(v.to_list() if hasattr(v, "to_list") else v, default=str),
                return_dtype=pl.Utf8,
            )
            for c in nested
        ).write_csv(buf)
        console.file.write(buf.getvalue())
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


def devices_text(f: dict[str, Any]) -> str:
    """The GPU models, else whether the run is CPU-only or its GPUs' model was not recorded
    (a Nsight export without TARGET_INFO_GPU is not a CPU run)."""
    if f["devices"]:
        return f"devices: {', '.join(f['devices'])}"
    return "CPU-only" if f["cpu_only"] else "GPU model not recorded"


def steps_text(steps: list[int]) -> str:
    """The steps a report covers; a run without ProfilerStep marks is one pseudo-step (-1),
    which reads as a bug when printed as a number."""
    if list(steps) == [-1]:
        return "none marked (the whole trace is one window)"
    return ", ".join(str(s) for s in steps)


def findings_title(facts: dict[str, Any]) -> str:
    """How the findings are ordered; says so when the replay would hold unmatched waits."""
    why = savings.not_replayed(facts)
    if why is None:
        return (
            "[bold]Findings[/] (most step time saved first: by a replay of the fix where one "
            "exists, else the time at stake)"
        )
    return f"[bold]Findings[/] (most time at stake first; {why})"


def finding_gain(fd: Finding) -> str:
    """'saves ~X ms/step (replay of SCENARIO)', 'no saving by ...' when the replay's step is no
    shorter (savings.not_shorter), else '~X ms/step at stake'."""
    stake = _fmt(fd.time_at_stake_ns, "ms")
    if (why := savings.not_shorter(fd)) is not None:
        return f"no saving by {fd.saving_method} ({why}; at stake ~{stake} ms)"
    if fd.saving_ns is not None:
        return (
            f"saves ~{_fmt(fd.saving_ns, 'ms')} ms/step ({fd.saving_method}; at stake ~{stake} ms)"
        )
    return f"~{stake} ms/step at stake" if fd.time_at_stake_ns else savings.NO_STAKE


def ingest_seconds(seconds: dict[str, float], last: str = "stored results") -> str:
    """Where an ingest's time went: "in 12.3 s (traces 9.1 s, stored results 3.0 s)"; `last`
    names its last step (the views only, with --results later)."""
    parts = [
        f"{label} {seconds[key]:.1f} s"
        for key, label in (("traces", "traces"), ("results", last))
        if key in seconds
    ]
    total = f"in {seconds.get('total', 0.0):.1f} s"
    return f"{total} ({', '.join(parts)})" if parts else total
