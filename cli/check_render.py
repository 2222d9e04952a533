"""Output formats of `ranklens check`: text, JSON (documented schema), JUnit XML, GitHub
annotations (+ a Markdown summary for $GITHUB_STEP_SUMMARY). Presentation only."""

from __future__ import annotations

import json
from typing import Any
from xml.etree import ElementTree as ET

from ranklens.analysis.check import Verdict
from rich.console import Console

CHECK_FORMATS = ("text", "json", "junit", "github")
SCHEMA_VERSION = 1


def as_json(verdicts: list[Verdict], regressions: list[str]) -> str:
    """The JSON document described by docs/check-result.schema.json."""
    failed = any(v.status == "fail" for v in verdicts)
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "status": "fail" if failed else "pass",
        "checks": [v.as_dict() for v in verdicts],
        "regressions": regressions,
    }
    return json.dumps(doc, indent=2)


def as_junit(verdicts: list[Verdict]) -> str:
    """One <testcase> per check; failures carry the message, skipped checks are <skipped>."""
    suite = ET.Element(
        "testsuite",
        name="ranklens.check",
        tests=str(len(verdicts)),
        failures=str(sum(v.status == "fail" for v in verdicts)),
        skipped=str(sum(v.status == "skipped" for v in verdicts)),
        errors="0",
    )
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname="ranklens.check", name=v.name)
        if v.status == "fail":
            ET.SubElement(
                case, "failure", message=v.message, type="threshold"
            ).text = f"{v.message}\nthreshold {v.threshold} from {v.source}"
        elif v.status == "skipped":
            ET.SubElement(case, "skipped", message=v.message)
        ET.SubElement(case, "system-out").text = v.message
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _esc_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _esc_prop(s: str) -> str:
    return _esc_data(s).replace(":", "%3A").replace(",", "%2C")


def as_github(verdicts: list[Verdict]) -> str:
    """Workflow commands: ::error for failures, ::warning for skipped, ::notice for passes."""
    level = {"fail": "error", "skipped": "warning", "pass": "notice"}
    lines = [
        f"::{level[v.status]} title={_esc_prop('ranklens ' + v.name)}::{_esc_data(v.message)}"
        for v in verdicts
    ]
    return "\n".join(lines) + "\n"


def as_markdown(verdicts: list[Verdict], regressions: list[str]) -> str:
    """A summary table for $GITHUB_STEP_SUMMARY or a merge-request comment."""
    icon = {"pass": "✅", "fail": "❌", "skipped": "⚪"}
    failed = any(v.status == "fail" for v in verdicts)
    out = [
        f"## ranklens check: {'failed' if failed else 'passed'}",
        "",
        "| | check | worst | threshold | source |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        worst = "-" if v.worst_subject is None else f"{v.worst_subject}: {v.worst_value:.4g}"
        out.append(f"| {icon[v.status]} | {v.name} | {worst} | {v.threshold:g} | {v.source} |")
    if regressions:
        out += ["", "### Regressions vs baseline", ""] + [f"- {r}" for r in regressions]
    return "\n".join(out) + "\n"


def as_text(
    verdicts: list[Verdict], regressions: list[str], console: Console, verbose: bool
) -> None:
    """Rich text: one line per check, the worst offender named."""
    style = {"pass": "green", "fail": "bold red", "skipped": "yellow"}
    for v in verdicts:
        console.print(
            f"[{style[v.status]}]{v.status.upper():7}[/] {v.name}: {v.message}", highlight=False
        )
        if verbose:
            console.print(f"         threshold {v.threshold:g} from {v.source}", highlight=False)
    for r in regressions:
        console.print(f"[bold red]REGRESSION[/] {r}", highlight=False)
    if not verdicts and not regressions:
        console.print(
            "[yellow]no thresholds configured[/]: pass flags such as --max-bubble "
            "or add \\[tool.ranklens.check] to pyproject.toml"  # \[: not rich markup
        )
